"""The model's own tokenizer, applied exactly as the engine will see the prompt.

Chat models get their chat template (system + user, generation prompt appended); a
model without one gets the raw text. Either way the result is token ids, which the
engine receives as-is: counting and running use the same ids, and a template that
already writes BOS is never given a second one by the tokenizer.

Record text is encoded on its own, with special-token strings split into plain text:
a ticket that contains ``<|im_end|>`` must not close the chat turn. The template around
it (its frame) is rendered and encoded once per system text, which is also the cheap
part of measuring millions of prompts.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nightshift.engines.fastbpe import fast_encoder
from nightshift.engines.tokenizerid import TokenizerIdentity
from nightshift.errors import SpecError

_SLOT = "\u2063nightshift-record\u2063"  # stands in for the record while rendering the frame
# The backend's ``encode_special_tokens`` is one setting for every thread: held while set.
_SPECIALS_SPLIT = threading.Lock()
_CACHE_TEXTS = 50_000  # distinct shared segments (documents, few-shot blocks) kept encoded


class Messages(Protocol):
    """A rendered prompt as chat messages (``scheduling.prompts.Messages`` is one)."""

    system: str | None
    user: str


@dataclass(frozen=True)
class _Chat:
    system: str | None
    user: str


def model_source(name_or_path: str) -> str:
    """A local folder (``~`` expanded) if there is one by that name, else the hub id."""
    local = Path(name_or_path).expanduser()
    return str(local) if local.is_dir() else name_or_path


class PromptEncoder:
    """Encodes rendered prompts into token ids with the model's tokenizer."""

    def __init__(self, hf_tokenizer) -> None:
        self._tok = hf_tokenizer
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        self.bos_token_id = hf_tokenizer.bos_token_id
        self._frames: dict[str | None, tuple[str, str]] = {}
        self._frame_ids: dict[str, list[int]] = {}
        self._conversations: dict[tuple, list[str] | ValueError] = {}
        self._segments: dict[str, list[int]] = {}
        self._bos_ids: list[int] | None = None
        self._plain = None  # the backend for _hf_texts (_plain_backend)
        self._identity: TokenizerIdentity | None = None
        # record text through tiktoken where it is the same byte-level BPE (fastbpe)
        self._fast = fast_encoder(hf_tokenizer, self._hf_texts)
        self.composes = self._segments_compose()
        # set before any prompt is rendered: {"enable_thinking": False} for a reasoning
        # model whose budget is 0 (engines.reasoning.thinking_off)
        self.template_kwargs: dict[str, bool] = {}

    @classmethod
    def load(
        cls,
        name_or_path: str,
        trust_remote_code: bool = False,
        key: str = "model.path",
        like: TokenizerIdentity | None = None,
    ) -> PromptEncoder:
        """The tokenizer of a model folder or HF id; ``key`` is the spec key that named it.
        ``like``: the identity of this tokenizer as another process loaded it, whose
        class is then loaded directly (see ``TokenizerIdentity``)."""
        source = model_source(name_or_path)
        if like is not None:
            same = like.load(source)
            if same is not None:
                return cls(same)
        from transformers import AutoTokenizer

        if name_or_path.startswith((".", "/", "~")) and not Path(source).is_dir():
            raise SpecError(
                key,
                f"model folder {name_or_path} does not exist",
                "run `nightshift demo init` for the demo model, or give a model folder or HF id",
            )
        try:
            tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise SpecError(
                key,
                f"cannot load a tokenizer from {name_or_path!r}: {exc}",
                "give a local model folder or a model id this machine can reach",
            ) from None
        return cls(tok)

    def text(self, prompt: Messages) -> str:
        """The prompt as the model reads it, special tokens written out."""
        if not self.has_chat_template:
            return f"{prompt.system}\n\n{prompt.user}" if prompt.system else prompt.user
        messages = [{"role": "user", "content": prompt.user}]
        if prompt.system:
            messages.insert(0, {"role": "system", "content": prompt.system})
        return self._tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )

    def encode(self, prompts: Sequence[Messages]) -> list[list[int]]:
        """Whole prompts, each user text as one segment."""
        return [self.encode_records(p.system, "", [[p.user]])[0] for p in prompts]

    def encode_records(
        self, system: str | None, head: str, records: Sequence[Sequence[str]]
    ) -> list[list[int]]:
        """Token ids of prompts made of the static ``head`` and each record's segments
        (``encode_pieces`` with the template's layout)."""
        before, after = self.template_frame(system)
        rows = []
        for segments in records:
            row = [before, head]
            for segment in segments:
                row += ["", segment]
            rows.append([*row, after])
        return self.encode_pieces(rows)

    def encode_pieces(self, rows: Sequence[Sequence[str]]) -> list[list[int]]:
        """Token ids of prompts given as pieces ``[t0, x1, t1, ..., xn, tn]``: even places
        are template text (the chat frame: its special tokens are real), odd places record
        text (special-token strings split, never obeyed).

        Pieces are encoded one by one and joined, so prompts that share their first pieces
        share exactly those leading ids, which is what the prefix cache matches on; a
        piece that repeats (a document, a few-shot turn) is encoded once. The record's last
        text is encoded without remembering it: it is usually its own.
        """
        if not self.composes:  # this tokenizer changes text at a seam: join what it can
            rows = [_joined(row) for row in rows]
        leading = [t for row in rows for t in row[1:-2:2]]
        last = [row[-2] for row in rows if len(row) > 1]
        shared = iter(self.encode_shared(leading))
        own = iter(self.encode_texts(last))
        starts: dict[str, list[int]] = {}  # a batch's prompts mostly start alike
        trusted = self._trusted
        out = []
        for row in rows:
            start = starts.get(row[0])
            if start is None:
                start = starts[row[0]] = self._start(row[0])
            ids, end = start.copy(), len(row) - 2
            for k in range(1, end + 1, 2):
                ids += next(own) if k == end else next(shared)
                ids += trusted(row[k + 1])
            out.append(ids)
        return out

    def prompt_overhead(self, system: str | None, head: str) -> tuple[int, int]:
        """Tokens every prompt has before its first segment and after its last."""
        before, after = self.template_frame(system)
        return len(self._start(before)) + len(self.encode_shared([head])[0]), len(
            self._trusted(after)
        )

    def lead_ids(self) -> list[int]:
        """Ids every prompt starts with before its first piece: a raw prompt gets the
        tokenizer's BOS; a chat template writes its own, so none is added to it."""
        return [] if self.has_chat_template else self._bos()

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Record text as plain text: special-token strings in it are split, never obeyed."""
        if not texts:
            return []
        if self._fast is not None:
            return self._fast(list(texts))
        return self._hf_texts(list(texts))

    @property
    def fast(self) -> bool:
        """Whether record text goes through tiktoken (``engines.fastbpe``)."""
        return self._fast is not None

    def _hf_texts(self, texts: list[str]) -> list[list[int]]:
        """``encode_texts`` by the Hugging Face tokenizer itself."""
        backend = getattr(self._tok, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):  # a slow tokenizer
            batch = self._tok(list(texts), add_special_tokens=False, split_special_tokens=True)
            return batch["input_ids"]
        # The Rust tokenizer itself, as the call above reaches it (special-token strings
        # split), without its offsets and Python wrapping: the same ids, 1.3-1.8x faster
        # (the run path's largest cost per record; benchmarks/run_path.py). Its own copy:
        # padding or truncation set in tokenizer.json must never reach a prompt's ids.
        backend = self._plain_backend(backend)
        with _SPECIALS_SPLIT:
            was, backend.encode_special_tokens = backend.encode_special_tokens, True
            try:
                encodings = backend.encode_batch_fast(list(texts), add_special_tokens=False)
            finally:
                backend.encode_special_tokens = was
        return [e.ids for e in encodings]

    def _plain_backend(self, backend):
        """``backend`` without padding and truncation (a copy, made once, where it has
        either: the chat template and the rest keep the tokenizer as loaded)."""
        if self._plain is None:
            self._plain = backend
            if backend.padding is not None or backend.truncation is not None:
                from tokenizers import Tokenizer

                self._plain = Tokenizer.from_str(backend.to_str())
                self._plain.no_padding()
                self._plain.no_truncation()
        return self._plain

    def encode_shared(self, texts: Sequence[str]) -> list[list[int]]:
        """Like ``encode_texts``, remembering texts that repeat across records."""
        cache = self._segments
        missing = list(dict.fromkeys(t for t in texts if t not in cache))
        if len(cache) + len(missing) > _CACHE_TEXTS:
            cache.clear()  # bounded memory: unique texts would otherwise pile up
            missing = list(dict.fromkeys(texts))  # those it held too (a KeyError, once)
        cache.update(zip(missing, self.encode_texts(missing), strict=True))
        return [cache[t] for t in texts]

    def encode_trusted(self, text: str) -> list[int]:
        """Template text (a chat frame): its special tokens are real."""
        return list(self._trusted(text))

    def frame_length(self, text: str, first: bool = False) -> int:
        """Tokens of a frame piece; the ``first`` piece of a prompt with its lead ids."""
        return len(self._start(text) if first else self._trusted(text))

    def _trusted(self, text: str) -> list[int]:
        ids = self._frame_ids.get(text)
        if ids is None:
            ids = self._tok(text, add_special_tokens=False)["input_ids"] if text else []
            if len(self._frame_ids) > _CACHE_TEXTS:
                self._frame_ids.clear()
            self._frame_ids[text] = ids
        return ids

    def _start(self, text: str) -> list[int]:
        """The lead ids and the first frame piece, with one BOS at most."""
        return self._one_bos(self.lead_ids() + self._trusted(text))

    def _segments_compose(self) -> bool:
        """Whether encoding text in pieces gives back the same text (it does for byte-level
        BPE; SentencePiece's dummy prefix space would add a space at every seam)."""
        pieces = ["Subject: a\n\n", "first words", " and more"]
        ids = itertools.chain.from_iterable(self.encode_texts(pieces))
        return self._tok.decode(list(ids), skip_special_tokens=True) == "".join(pieces)

    def raw_frame(self) -> tuple[str, str]:
        """The frame of a raw text prompt (``prompt.chat_template: false``): nothing but
        the BOS the tokenizer adds to plain text, as a completions API would send it."""
        bos = self._bos()
        return (self._tok.bos_token if bos and self.has_chat_template else ""), ""

    def template_frame(self, system: str | None) -> tuple[str, str]:
        """The chat template's text before and after the user message, for ``system``."""
        if system not in self._frames:
            self._frames[system] = self._build_frame(system)
        return self._frames[system]

    def _build_frame(self, system: str | None) -> tuple[str, str]:
        from jinja2 import TemplateError

        try:
            text = self.text(_Chat(system, _SLOT))
        except TemplateError as exc:
            raise SpecError(
                "prompt.system" if system else "model.path",
                f"the model's chat template refused this prompt: {exc}",
                "remove prompt.system and put that text in prompt.template" if system else "",
            ) from None
        if text.count(_SLOT) != 1:
            raise SpecError(
                "model.path",
                "the chat template changes the user message's text",
                "nightshift needs the record inserted as-is; give a template that does",
            )
        before, after = text.split(_SLOT)
        return before, after

    def conversation_frame(self, system: str | None, roles: Sequence[str]) -> list[str]:
        """The chat template's text around each turn of a conversation with these roles
        (generation prompt appended): ``len(roles) + 1`` pieces. ``system``, when given,
        is a first system turn written into the frame, as ``prompt.system`` is for a
        template. Raises ``ValueError`` when the template refuses the conversation or
        changes a turn's text."""
        key = (system, *roles)
        frame = self._conversations.get(key)
        if frame is None:
            frame = self._conversations[key] = self._build_conversation(system, tuple(roles))
        if isinstance(frame, ValueError):
            raise frame
        return frame

    def _build_conversation(
        self, system: str | None, roles: tuple[str, ...]
    ) -> list[str] | ValueError:
        from jinja2 import TemplateError

        slots = [f"\u2063nightshift-turn-{k}\u2063" for k in range(len(roles))]
        turns = [{"role": r, "content": s} for r, s in zip(roles, slots, strict=True)]
        if system is not None:
            turns.insert(0, {"role": "system", "content": system})
        try:
            text = self._tok.apply_chat_template(
                turns, tokenize=False, add_generation_prompt=True, **self.template_kwargs
            )
        except TemplateError as exc:
            return ValueError(f"the model's chat template refused the conversation: {exc}")
        pieces = []
        for slot in slots:
            before, found, text = text.partition(slot)
            if not found or slot in text:
                return ValueError("the model's chat template changes a turn's text")
            pieces.append(before)
        return [*pieces, text]

    def _bos(self) -> list[int]:
        """The BOS the tokenizer adds to plain text, or nothing (asked once: it is called
        for every prompt without a chat template)."""
        if self._bos_ids is None:
            ids = self._tok("x", add_special_tokens=True)["input_ids"]
            self._bos_ids = [self.bos_token_id] if ids and ids[0] == self.bos_token_id else []
        return list(self._bos_ids)

    def _one_bos(self, ids: list[int]) -> list[int]:
        bos = self.bos_token_id
        while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def identity(self) -> TokenizerIdentity:
        """What another process needs to load this same tokenizer without AutoTokenizer."""
        if self._identity is None:  # tokenizes a few texts: once an encoder
            self._identity = TokenizerIdentity.of(self._tok)
        return self._identity

    @property
    def hf_tokenizer(self):
        """The Hugging Face tokenizer underneath (its vocabulary, its chat template)."""
        return self._tok

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


def _joined(row: Sequence[str]) -> list[str]:
    """``row`` with record texts that only an empty frame piece separates joined into one
    (for a tokenizer whose pieces do not compose)."""
    out = [row[0]]
    for k in range(1, len(row) - 1, 2):
        if len(out) > 1 and out[-1] == "":
            out[-2] += row[k]
            out[-1] = row[k + 1]
        else:
            out += [row[k], row[k + 1]]
    return out
