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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nightshift.errors import SpecError

_SLOT = "\u2063nightshift-record\u2063"  # stands in for the record while rendering the frame
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


@dataclass(frozen=True)
class Frame:
    """Token ids the template puts before and after the record's text."""

    before: list[int]
    after: list[int]


class PromptEncoder:
    """Encodes rendered prompts into token ids with the model's tokenizer."""

    def __init__(self, hf_tokenizer) -> None:
        self._tok = hf_tokenizer
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        self.bos_token_id = hf_tokenizer.bos_token_id
        self._frames: dict[str | None, Frame] = {}
        self._segments: dict[str, list[int]] = {}
        self.composes = self._segments_compose()

    @classmethod
    def load(
        cls, name_or_path: str, trust_remote_code: bool = False, key: str = "model.path"
    ) -> PromptEncoder:
        """The tokenizer of a model folder or HF id; ``key`` is the spec key that named it."""
        from transformers import AutoTokenizer

        source = model_source(name_or_path)
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
        return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, prompts: Sequence[Messages]) -> list[list[int]]:
        """Whole prompts, each user text as one segment."""
        return [self.encode_records(p.system, "", [[p.user]])[0] for p in prompts]

    def encode_records(
        self, system: str | None, head: str, records: Sequence[Sequence[str]]
    ) -> list[list[int]]:
        """Token ids of prompts made of the static ``head`` and each record's segments.

        Segments are encoded one by one and joined, so records that share their first
        segments share exactly those leading token ids, which is what the prefix cache
        matches on. Repeated segments (the same document, many questions) are encoded once.
        """
        frame = self._frame(system)
        if not records:
            return []
        if not self.composes:  # this tokenizer changes text at a seam: encode it whole
            users = self.encode_texts([head + "".join(segments) for segments in records])
            return [frame.before + user + frame.after for user in users]
        start = frame.before + self.encode_shared([head])[0]
        columns = list(zip(*records, strict=True))
        parts = [self.encode_shared(column) for column in columns[:-1]]
        parts.append(self.encode_texts(columns[-1]))
        return [list(itertools.chain(start, *row, frame.after)) for row in zip(*parts, strict=True)]

    def prompt_overhead(self, system: str | None, head: str) -> tuple[int, int]:
        """Tokens every prompt has before its first segment and after its last."""
        frame = self._frame(system)
        return len(frame.before) + len(self.encode_shared([head])[0]), len(frame.after)

    def encode_texts(self, texts: Sequence[str]) -> list[list[int]]:
        """Record text as plain text: special-token strings in it are split, never obeyed."""
        if not texts:
            return []
        batch = self._tok(list(texts), add_special_tokens=False, split_special_tokens=True)
        return batch["input_ids"]

    def encode_shared(self, texts: Sequence[str]) -> list[list[int]]:
        """Like ``encode_texts``, remembering texts that repeat across records."""
        cache = self._segments
        missing = list(dict.fromkeys(t for t in texts if t not in cache))
        if len(cache) + len(missing) > _CACHE_TEXTS:
            cache.clear()  # bounded memory: unique texts would otherwise pile up
        cache.update(zip(missing, self.encode_texts(missing), strict=True))
        return [cache[t] for t in texts]

    def _segments_compose(self) -> bool:
        """Whether encoding text in pieces gives back the same text (it does for byte-level
        BPE; SentencePiece's dummy prefix space would add a space at every seam)."""
        pieces = ["Subject: a\n\n", "first words", " and more"]
        ids = itertools.chain.from_iterable(self.encode_texts(pieces))
        return self._tok.decode(list(ids), skip_special_tokens=True) == "".join(pieces)

    def _frame(self, system: str | None) -> Frame:
        if system not in self._frames:
            self._frames[system] = self._build_frame(system)
        return self._frames[system]

    def _build_frame(self, system: str | None) -> Frame:
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
        # Template text is trusted: its special tokens are real. A raw prompt gets the
        # tokenizer's BOS; a chat template writes its own, so none is added to it.
        lead = [] if self.has_chat_template else self._bos()
        encode = self._tok
        before_ids = encode(before, add_special_tokens=False)["input_ids"] if before else []
        after_ids = encode(after, add_special_tokens=False)["input_ids"] if after else []
        return Frame(self._one_bos(lead + before_ids), after_ids)

    def _bos(self) -> list[int]:
        ids = self._tok("x", add_special_tokens=True)["input_ids"]
        return [self.bos_token_id] if ids and ids[0] == self.bos_token_id else []

    def _one_bos(self, ids: list[int]) -> list[int]:
        bos = self.bos_token_id
        while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)
