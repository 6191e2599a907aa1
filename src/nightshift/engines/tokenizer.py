"""The model's own tokenizer, applied exactly as the engine will see the prompt.

Chat models get their chat template (system + user, generation prompt appended); a
model without one gets the raw text. Either way the result is token ids, which the
engine receives as-is: counting and running use the same ids, and a template that
already writes BOS is never given a second one by the tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nightshift.errors import SpecError
from nightshift.scheduling.prompts import Messages


class PromptEncoder:
    """Encodes rendered prompts into token ids with the model's tokenizer."""

    def __init__(self, hf_tokenizer) -> None:
        self._tok = hf_tokenizer
        self.has_chat_template = bool(getattr(hf_tokenizer, "chat_template", None))
        self.bos_token_id = hf_tokenizer.bos_token_id

    @classmethod
    def load(cls, name_or_path: str, trust_remote_code: bool = False) -> PromptEncoder:
        from transformers import AutoTokenizer

        local = Path(name_or_path).expanduser()
        if name_or_path.startswith((".", "/", "~")) and not local.is_dir():
            raise SpecError(
                "model.path",
                f"model folder {name_or_path} does not exist",
                "run `nightshift demo init` for the demo model, or give a model folder or HF id",
            )
        try:
            tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise SpecError(
                "model.path",
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
        texts = [self.text(p) for p in prompts]
        # A chat template writes its own BOS; only raw prompts need the tokenizer's.
        add_special = not self.has_chat_template
        encoded = self._tok(texts, add_special_tokens=add_special)["input_ids"]
        return [self._one_bos(ids) for ids in encoded]

    def _one_bos(self, ids: list[int]) -> list[int]:
        bos = self.bos_token_id
        while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
            ids = ids[1:]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)
