"""The job spec: one YAML file, validated strictly, every field described.

The keys here are a contract with users and with later tooling: add fields freely,
but rename or remove them only with a migration note.
"""

from __future__ import annotations

import string
from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from nightshift.capacity.settings import CapacitySpec

# The detail column nightshift writes beside the input's (results and failed rows) is
# imported from here too.
from nightshift.jobs.columns import DETAIL_COLUMN as DETAIL_COLUMN
from nightshift.jobs.evalspec import EvalSpec, check_eval

# The input and model sections live in their own modules; they are imported from here too.
from nightshift.jobs.inputspec import InputSpec as InputSpec
from nightshift.jobs.modelspec import ModelSpec as ModelSpec

# The execution sections live in runspec; they are imported from here too.
from nightshift.jobs.runspec import CacheSpec, CostSpec, PlanSpec, RunSpec, ScheduleSpec
from nightshift.jobs.runspec import ProviderPrice as ProviderPrice
from nightshift.jobs.secrets import refuse_secrets
from nightshift.jobs.section import Section as _Section
from nightshift.jobs.section import without_defaults as _without_defaults

# The task section lives in taskspec; its kinds are imported from here too.
from nightshift.jobs.taskspec import ClassifyTask as ClassifyTask
from nightshift.jobs.taskspec import EmbedSpec, TaskSpec
from nightshift.jobs.taskspec import EmbedTask as EmbedTask
from nightshift.jobs.taskspec import ExtractTask as ExtractTask
from nightshift.jobs.taskspec import GenerateTask as GenerateTask


class PromptSpec(_Section):
    system: str | None = Field(
        default=None,
        description="Static system text. It comes first in every prompt, so it is the prefix "
        "every record shares and the prefix cache serves it once. With messages_column it is "
        "the first turn of each conversation that has no system turn of its own; a "
        "conversation's own system turn wins.",
    )
    template: str | None = Field(
        default=None,
        description="User message with {column} placeholders filled from each record. "
        "Record values are inserted literally: braces or Jinja inside data stay as they are. "
        "Write {{ or }} for a literal brace in the template itself. Pre-rendered prompts in "
        'one column: "{prompt}". Give this or messages_column, not both.',
    )
    messages_column: str | None = Field(
        default=None,
        description="Column holding each record's conversation: a list of {role, content} "
        "turns (roles system, user, assistant), rendered with the model's chat template and "
        "the generation prompt appended. Give this or template, not both.",
    )

    chat_template: bool = Field(
        default=True,
        description="false: prompt.template is sent as raw text with no chat frame (the "
        "tokenizer's BOS only), as an OpenAI /v1/completions prompt; for base models, or "
        "prompts already in the model's format. Not with prompt.system or messages_column.",
    )

    @field_validator("template")
    @classmethod
    def _template_parses(cls, template: str | None) -> str | None:
        if template is None:
            return template
        fields = template_fields(template)
        if not fields:
            raise ValueError("names no {column}: every record would get the same prompt")
        return template

    @field_validator("messages_column")
    @classmethod
    def _column_named(cls, column: str | None) -> str | None:
        if column is not None and not column.strip():
            raise ValueError("is empty; name the column holding the conversations")
        return column

    @model_validator(mode="after")
    def _one_prompt_source(self) -> PromptSpec:
        if self.template is not None and self.messages_column is not None:
            raise ValueError(
                "prompt.template and prompt.messages_column are both given; keep one: "
                "template fills a user message from columns, messages_column takes whole "
                "conversations from one column"
            )
        if self.template is None and self.messages_column is None:
            raise ValueError(
                "needs prompt.template (a user message with {column} placeholders) or "
                "prompt.messages_column (a column of {role, content} conversations)"
            )
        if not self.chat_template and (self.system is not None or self.messages_column):
            raise ValueError(
                "prompt.chat_template false sends prompt.template as raw text, with no chat "
                "frame for prompt.system or a conversation; put the system text into the "
                "template, or leave chat_template at true"
            )
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An unset source key is left out, so a template job's prompt (and so its
        # fingerprint) reads as it did before messages_column and chat_template existed.
        defaults = {"template": None, "messages_column": None, "chat_template": True}
        return _without_defaults(handler(self), defaults)

    def columns(self) -> list[str]:
        """The input columns the prompt is made from, in order of first use."""
        if self.messages_column is not None:
            return [self.messages_column]
        return template_fields(self.template or "")

    def source_key(self) -> str:
        """The spec key that names the prompt's input columns."""
        return "prompt.messages_column" if self.messages_column is not None else "prompt.template"


def template_fields(template: str) -> list[str]:
    """Column names a template refers to, in order of first use."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        hint = "write {{ for a literal brace"
        raise ValueError(f"is not a valid template ({exc}); {hint}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        # The template is never passed to str.format, so any column name works as written,
        # dots and spaces included: {user.name} is the column "user.name".
        if not name.strip():
            raise ValueError("has an empty {} placeholder; name a column inside the braces")
        if spec or conversion:
            raise ValueError(f"placeholder {{{name}}} uses a format spec; use a plain {{column}}")
        if name not in names:
            names.append(name)
    return names


# vLLM arguments the spec sets under its own keys; engine.extra may not set them again,
# or the plan's limits and the engine's would differ.
SPEC_ENGINE_ARGS = {
    "model": "model.path",
    "tokenizer": "model.tokenizer",
    "max_model_len": "model.max_model_len",
    "dtype": "model.dtype",
    "trust_remote_code": "model.trust_remote_code",
    "reasoning_parser": "model.reasoning",
    "kv_cache_dtype": "engine.kv_cache_dtype",
    "enable_prefix_caching": "engine.enable_prefix_caching",
    "max_num_seqs": "engine.max_num_seqs",
    "max_num_batched_tokens": "engine.max_num_batched_tokens",
    "gpu_memory_utilization": "engine.gpu_memory_utilization",
    "block_size": "engine.block_size",
    "tensor_parallel_size": "engine.tensor_parallel_size",
    "seed": "sampling.seed",
}


class EngineSpec(_Section):
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="fp8",
        description="KV cache precision. fp8 halves the cache per token, so twice as many "
        "records fit in one batch; auto keeps the model's dtype.",
    )
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse the KV cache of prompt prefixes shared across records."
    )
    # Unset: the engine's own choice for the hardware (jobs.platform), which the report
    # states; vLLM picks 1024 and 16384 on an H100/H200, 256 and 4096 on a CPU.
    max_num_seqs: int | None = Field(
        default=None,
        gt=0,
        description="Most sequences in one engine pass. Unset: the engine's own default for "
        "the hardware (vLLM: 1024 on GPUs of 70 GiB or more, 256 on smaller ones and CPUs).",
    )
    max_num_batched_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Most tokens scheduled in one engine pass. Unset: the engine's own "
        "default for the hardware (vLLM: 16384 on GPUs of 70 GiB or more, 8192 on smaller "
        "ones, 4096 on CPUs).",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of accelerator memory vLLM may use (on the CPU build, of the KV "
        "cache space; see cpu_kv_cache_gib).",
    )
    cpu_kv_cache_gib: int = Field(
        default=2,
        gt=0,
        description="KV cache size in whole GiB on the CPU build of vLLM "
        "(VLLM_CPU_KVCACHE_SPACE); ignored on GPUs.",
    )
    block_size: int | None = Field(
        default=None,
        gt=0,
        description="KV cache block size in tokens; prefix-cache hits come in whole blocks, "
        "so the planner aligns prefix groups to it. Unset: the engine's default (128 on "
        "the CPU build, 16 on GPUs).",
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="GPUs one engine spreads the model over (tensor parallel), for a model "
        "too big for one GPU. Each worker holds this many GPUs; data parallel is more "
        "workers.",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vllm.LLM engine argument, passed through unchanged "
        "(for example enforce_eager, num_gpu_blocks_override). Unset enforce_eager: "
        "true on a CPU (compiling costs more start-up than it saves), the engine's "
        "default (CUDA graphs) on a GPU.",
    )

    @field_validator("extra")
    @classmethod
    def _extra_does_not_repeat_spec_keys(cls, extra: dict[str, Any]) -> dict[str, Any]:
        for name in extra:
            if name in SPEC_ENGINE_ARGS:
                raise ValueError(f"{name} has its own key: set {SPEC_ENGINE_ARGS[name]} instead")
        # The only free-form map of settings (task.schema's keys name answer fields).
        refuse_secrets(extra)
        return extra


class SamplingSpec(_Section):
    max_tokens: int = Field(gt=0, description="Most tokens generated per record.")
    temperature: float = Field(default=0.0, ge=0, description="0 picks the likeliest token.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    seed: int | None = Field(default=None, description="Sampling seed, for repeatable runs.")
    stop: list[str] = Field(default_factory=list, description="Strings that end a generation.")
    reasoning_budget: int | None = Field(
        default=None,
        ge=0,
        description="With model.reasoning: the most tokens each answer may spend reasoning; "
        "at the budget the engine closes the reasoning and the answer follows (max_tokens "
        "more). 0 turns thinking off (the chat template's enable_thinking: false where it "
        "has one). Unset: reasoning is bounded by max_tokens alone, and a record that "
        "spends them all before answering fails as reasoning_length.",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # unset: the sampling section (and every fingerprint) reads as before reasoning
        return _without_defaults(handler(self), {"reasoning_budget": None})


class OutputSpec(_Section):
    path: str = Field(description="Output directory for results, rejects and the report.")


class JobSpec(_Section):
    name: str = Field(
        min_length=1, description="Job name, used in reports and run names.", pattern=r"^\S+$"
    )
    input: InputSpec = Field(description="Where the records come from.")
    prompt: PromptSpec = Field(description="How each record becomes a prompt.")
    task: TaskSpec = Field(description="What to do with each record.")
    model: ModelSpec = Field(description="The model to run.")
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM engine settings.")
    sampling: SamplingSpec = Field(description="Generation settings (none for task.kind embed).")
    embed: EmbedSpec | None = Field(
        default=None, description="Embedding settings (task.kind embed)."
    )
    output: OutputSpec = Field(description="Where results go.")
    plan: PlanSpec = Field(default_factory=PlanSpec, description="How records become shards.")
    run: RunSpec = Field(default_factory=RunSpec, description="How the job is executed.")
    cost: CostSpec = Field(default_factory=CostSpec, description="Price used in the report.")
    cache: CacheSpec = Field(default_factory=CacheSpec, description="Response cache.")
    schedule: ScheduleSpec | None = Field(
        default=None, description="Run the job on a cron schedule (nightly), incrementally."
    )
    capacity: CapacitySpec = Field(default_factory=CapacitySpec, description="Capacity planner.")
    eval: EvalSpec | None = Field(
        default=None, description="Score the answers against true ones (the report's quality)."
    )

    @model_validator(mode="before")
    @classmethod
    def _embed_sections(cls, data: Any) -> Any:
        """An embed job generates nothing: no sampling section (one placeholder budget
        inside), its prompt raw text unless chat_template is set, an embed section."""
        if not isinstance(data, dict):
            return data
        embeds = isinstance(data.get("task"), dict) and data["task"].get("kind") == "embed"
        if not embeds:
            if data.get("embed") is not None:
                raise ValueError("embed: applies to task.kind embed only; remove it")
            return data
        if "sampling" in data:
            raise ValueError(
                "sampling: task.kind embed generates no tokens; remove the sampling section "
                "(embed.normalize and embed.dimensions shape the vectors)"
            )
        prompt = data.get("prompt")
        if isinstance(prompt, dict) and "chat_template" not in prompt:
            prompt = {**prompt, "chat_template": False}  # the text itself, not a chat turn
        return {
            **data,
            "prompt": prompt,
            "sampling": {"max_tokens": 1},
            "embed": data.get("embed") or {},
        }

    @model_validator(mode="after")
    def _adapters_named(self) -> JobSpec:
        if self.input.adapter_column is not None and not self.model.adapters:
            raise ValueError(
                "input.adapter_column: no adapters to pick from; name them under "
                "model.adapters ({name: folder})"
            )
        return self

    @model_validator(mode="after")
    def _budget_needs_reasoning(self) -> JobSpec:
        if self.model.reasoning and self.task.kind == "embed":
            raise ValueError(
                "model.reasoning: an embed job generates nothing to reason about; remove it"
            )
        if self.sampling.reasoning_budget is not None and not self.model.reasoning:
            raise ValueError(
                "sampling.reasoning_budget: the model is not set up to reason; name its "
                "reasoning parser under model.reasoning (deepseek_r1 for <think> tokens)"
            )
        return self

    @model_validator(mode="after")
    def _context_fits(self) -> JobSpec:
        if self.sampling.max_tokens >= self.model.max_model_len:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) leaves no room for a prompt "
                f"in model.max_model_len ({self.model.max_model_len})"
            )
        budget = self.sampling.reasoning_budget  # thinking and its closing marker come on top
        if budget is not None and self.sampling.max_tokens + budget + 1 >= self.model.max_model_len:
            raise ValueError(
                f"sampling.reasoning_budget ({budget}) and max_tokens leave no room for a "
                f"prompt in model.max_model_len ({self.model.max_model_len})"
            )
        return self

    @model_validator(mode="after")
    def _eval_fits_the_task(self) -> JobSpec:
        check_eval(self.eval, self.task.kind, self.prompt, self.input)  # names its key
        return self

    def template_columns(self) -> list[str]:
        """The input columns the prompt is made from (template fields or the messages
        column)."""
        return self.prompt.columns()
