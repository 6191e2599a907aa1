"""The job spec's ``model:`` section: which weights run, at what context length, and
the LoRA adapters a record may pick (``input.adapter_column``).

Every key but ``adapters`` is a vLLM engine argument (``SPEC_ENGINE_ARGS`` in
``jobs.spec`` names them); each adapter's ``adapter_config.json`` is read when the spec
loads, before any engine starts (``jobs.modelcheck``).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from nightshift.jobs.modelcheck import check_adapter
from nightshift.jobs.section import Section as _Section
from nightshift.jobs.section import without_defaults as _without_defaults


class ModelSpec(_Section):
    path: str = Field(description="Local model folder or Hugging Face model id.")
    tokenizer: str | None = Field(
        default=None, description="Tokenizer folder or id, when it differs from the model's."
    )
    max_model_len: int = Field(
        gt=0,
        description="Context length in tokens. A record whose prompt plus max_tokens exceeds "
        "it is rejected with its reason instead of failing the job.",
    )
    dtype: str = Field(default="auto", description="Weight dtype passed to vLLM (auto, bfloat16).")
    trust_remote_code: bool = Field(
        default=False, description="Allow model code shipped in the model folder to run."
    )
    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters by name: folders in the PEFT layout (adapter_config.json "
        "and adapter weights). input.adapter_column picks one per record; vLLM's "
        "max_loras and max_lora_rank are set from them (engine.extra overrides).",
    )
    reasoning: str | None = Field(
        default=None,
        description="The model's reasoning format: the name of the vLLM reasoning parser "
        "that reads its thinking (deepseek_r1 or qwen3 for <think> ... </think>). Each "
        "answer's reasoning then goes to the reasoning and reasoning_tokens columns, never "
        "the answer, and task labels or schema constrain only the answer after it. Checked "
        "against the model's tokenizer before planning.",
    )

    @field_validator("adapters")
    @classmethod
    def _adapters_are_folders(cls, adapters: dict[str, str]) -> dict[str, str]:
        for name, path in adapters.items():
            if not name.strip():
                raise ValueError("an adapter needs a name")
            check_adapter(name, path)  # its config as vLLM will read it (jobs.modelcheck)
        return adapters

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # none: the model section (and every fingerprint) reads as it did before adapters
        return _without_defaults(handler(self), {"adapters": {}, "reasoning": None})
