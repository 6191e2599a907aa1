"""A tokenizer loaded again, in another process, by the class the run's AutoTokenizer
picked (``TokenizerIdentity``); ``engines.tokenizer`` is the encoder around it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TokenizerIdentity:
    """A loaded tokenizer's class and what it makes of some hard texts.

    ``AutoTokenizer`` imports torch through transformers' model registry (2-3 s of CPU
    and 0.3 GB a process) only to pick the tokenizer's class, which a process that
    encodes prompts and nothing else (``running.encoding``) never needs: it loads the
    class the run's AutoTokenizer picked, from the same files, and keeps it only if it
    is the same tokenizer (the same ids for ``check_texts``, the same chat template
    and specials); otherwise it loads through AutoTokenizer as the run did. A class
    from the model's own code (trust_remote_code) has no importable name: no identity.
    """

    module: str
    name: str
    digest: str

    @classmethod
    def of(cls, hf_tokenizer) -> TokenizerIdentity:
        kind = type(hf_tokenizer)
        return cls(kind.__module__, kind.__qualname__, _digest(hf_tokenizer))

    def as_plan(self) -> dict[str, dict[str, str]]:
        """The plan.json entry a resume loads the same tokenizer by (``in_plan``)."""
        return {"tokenizer": asdict(self)}

    @classmethod
    def in_plan(cls, manifest: dict[str, Any] | None) -> TokenizerIdentity | None:
        """The identity an earlier run recorded in its plan.json; None for a plan from
        before it was recorded (or none): the resume loads through AutoTokenizer."""
        known = (manifest or {}).get("tokenizer")
        try:
            return cls(**known) if isinstance(known, dict) else None
        except TypeError:
            return None

    def load(self, source: str):
        """The tokenizer at ``source`` by this class, if it is the same; else None."""
        try:
            kind = self.tokenizer_class()
            tok = kind.from_pretrained(source) if kind is not None else None
            return tok if tok is not None and _digest(tok) == self.digest else None
        except Exception:  # noqa: BLE001 - AutoTokenizer loads it, or says what is wrong
            return None

    def tokenizer_class(self) -> type | None:
        """This identity's class, imported; None unless it is a transformers tokenizer
        (a plan.json edited by hand names nothing else that is imported or loaded)."""
        from importlib import import_module

        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        if not all(isinstance(v, str) for v in (self.module, self.name, self.digest)):
            return None
        package, _, module = self.module.rpartition(".")
        ours = package == "transformers" or package.startswith("transformers.")
        if not ours or not module.startswith("tokenization"):
            return None  # only a transformers tokenizer module is imported by its name
        kind = getattr(import_module(self.module), self.name, None)
        tokenizer = isinstance(kind, type) and issubclass(kind, PreTrainedTokenizerBase)
        return kind if tokenizer else None


def _digest(hf_tokenizer) -> str:
    """The ids of ``check_texts`` (special-token strings obeyed and split), the chat
    template and the special tokens, hashed."""
    import hashlib

    from nightshift.engines.fastbpe import check_texts

    texts = check_texts()
    seen = [
        hf_tokenizer(texts, add_special_tokens=False)["input_ids"],
        hf_tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"],
        getattr(hf_tokenizer, "chat_template", None),
        hf_tokenizer.bos_token_id,
        hf_tokenizer.eos_token_id,
        sorted(hf_tokenizer.get_added_vocab().items()),
    ]
    return hashlib.sha256(repr(seen).encode()).hexdigest()
