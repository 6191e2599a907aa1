"""The spec's execution sections: how records become shards (``plan``), how the job
runs (``run``), when (``schedule``), where answers are cached (``cache``) and what it
costs (``cost``). None of them changes an answer, so none is in the fingerprint
(``jobs.fingerprint``)."""

from __future__ import annotations

from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator, model_validator

from nightshift.jobs.section import Section as _Section


class PlanSpec(_Section):
    shard_records: int = Field(
        default=25_000,
        gt=0,
        description="Most records in one shard. A shard is the unit that is committed, "
        "retried and spread over workers; records sharing a prefix stay together. Many "
        "shards a worker keep the last ones short, and a shard's commit runs beside the "
        "next one's records: only the last shard's is waited for.",
    )
    shard_tokens: int = Field(
        default=50_000_000,
        gt=0,
        description="Most prompt tokens in one shard, so shards of long prompts stay short.",
    )
    block_size: int | None = Field(
        default=None,
        gt=0,
        description="The KV block size the plan aligns prefix groups to and predicts reuse "
        "in, for a plan written on another machine than the one that runs it (a laptop "
        "or CPU box planning for GPUs: 16). Unlike engine.block_size it does not force "
        "the engine's. Unset: engine.block_size, else this machine's engine's (16 on a "
        "GPU, 128 on the CPU build).",
    )


class CanarySpec(_Section):
    """``run.canary``: a quality check on a sample before the full run relies on a
    setting that may change answers (``pipelines.canary``). ``run.canary: false`` turns
    it off, ``true`` turns it on for every job."""

    enabled: bool | None = Field(
        default=None,
        description="true: always run the canary; false: never; unset: when the job uses "
        "a setting that may change answers (an FP8 KV cache, speculative decoding).",
    )
    records: int = Field(
        default=64,
        gt=0,
        description="Records in the canary's sample, spread over the plan (at most a "
        "tenth of the job). They run under the job's settings and under the reference "
        "(KV cache in the model's dtype, no speculation); the job keeps the former answers.",
    )
    max_records: int | None = Field(
        default=None,
        gt=0,
        description="Where the agreement's 95% interval straddles min_agreement, the "
        "canary doubles its sample (only the new records run) up to this many records "
        "(unset: 4x records, at most a quarter of the job), then decides by the figure itself.",
    )
    min_agreement: float = Field(
        default=0.95,
        ge=0,
        le=1,
        description="The job stops before its full run (exit 2) when the 95% interval of the "
        "share of the sample's answers equal to the reference's lies below this, and goes on "
        "when it lies at or above it; in between the sample grows (max_records).",
    )
    accept: bool = Field(
        default=False,
        description="Run the job even below min_agreement (the figure is still reported), "
        "e.g. `--set run.canary.accept=true` after reading a canary's stop.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_bool(cls, value: object) -> object:
        return {"enabled": value} if isinstance(value, bool) else value


class RunSpec(_Section):
    chunk_records: int = Field(
        default=4096,
        gt=0,
        description="A shard checkpoints its answers every this many records, so a crash "
        "loses at most one chunk. The engine is fed continuously either way.",
    )
    encode_processes: int | None = Field(
        default=None,
        ge=0,
        description="Processes that render and tokenize prompts beside the run, so the "
        "thread feeding the engine never waits on them. Default: none for a job under "
        "20,000 records, else one per two spare cores (at most 4); 0 keeps it in a thread.",
    )
    chunk_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A shard also checkpoints when this long has passed since its last "
        "checkpoint, so a slow job loses at most this much work.",
    )
    shard_attempts: int = Field(
        default=3,
        gt=0,
        description="Attempts per shard when the engine dies under it (each on a fresh "
        "engine, continuing from its checkpoints) before the shard is reported failed.",
    )
    engine: Literal["vllm", "fake"] = Field(
        default="vllm",
        description="vllm runs the model; fake is a fast deterministic stand-in for tests.",
    )
    incremental: bool = Field(
        default=True,
        description="A rerun into the same output also plans the input's records whose id "
        "no earlier run planned, so a nightly job generates only new records. false: a "
        "rerun only resumes. To regenerate everything, run with --overwrite or --new-run.",
    )
    lease_s: float = Field(
        default=120.0,
        gt=0,
        description="With several workers, a worker's claim on a shard lasts this long "
        "unless renewed (every quarter of it); a worker that dies gives its shard up to "
        "the others after at most this long. Keep it well above the workers' clock skew.",
    )
    retry_delay_s: list[Annotated[float, Field(ge=0)]] = Field(
        default=[10.0, 60.0],
        min_length=1,
        description="Seconds Prefect waits before retrying a failed shard task, one per "
        "retry (the last repeats); retries = run.shard_attempts - 1.",
    )
    stall_s: float = Field(
        default=300.0,
        gt=0,
        description="The engine is hung when, with requests in flight, it generates no "
        "token and finishes no request for this long: it is killed with its processes and "
        "its shards continue on a fresh engine (an attempt). A healthy engine generates "
        "tokens every step (well under a second); keep it far above your slowest step.",
    )
    startup_timeout_s: float = Field(
        default=1800.0,
        gt=0,
        description="The longest an engine may take to start (weights, memory profiling, "
        "compilation, CUDA-graph capture: minutes for a large model or a first start on a "
        "fresh machine) before the run fails with an error saying so. Sets vLLM's "
        "VLLM_ENGINE_READY_TIMEOUT_S (its own default: 600 s).",
    )
    overlap_startup: bool = Field(
        default=True,
        description="Start the engine while the plan is built, so its start-up hides the "
        "plan time. false starts it only once the plan is written: for a machine that "
        "cannot hold both at once, or to measure what the overlap saves.",
    )
    stop_s: float = Field(
        default=60.0,
        gt=0,
        description="After SIGTERM, Ctrl-C or a Prefect cancellation the run stops "
        "gracefully (checkpoints what it holds, writes the report, exits with code 3); "
        "past this many seconds it exits at once. Keep it under your platform's notice.",
    )
    canary: CanarySpec = Field(
        default_factory=CanarySpec,
        description="A quality check before the full run: the job's settings against the "
        "reference on a sample (see the canary keys); `false` turns it off.",
    )


class ScheduleSpec(_Section):
    cron: str = Field(
        description="When the job runs, as a five-field cron expression, e.g. '0 2 * * *' "
        "for 02:00 every night. Served by `nightshift schedule serve` or `deploy`."
    )
    timezone: str = Field(
        default="UTC", description="IANA time zone the cron is read in, e.g. Europe/Berlin."
    )

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError(
                f"{value!r} is not a five-field cron expression (minute hour day month "
                "weekday), e.g. '0 2 * * *'"
            )
        return value

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {value!r}; use an IANA name such as Europe/Berlin or UTC"
            ) from None
        return value


class ProviderPrice(_Section):
    """One row of ``cost.compare``: a provider's batch price, USD per million tokens."""

    provider: str = Field(min_length=1, description="Who sells it, e.g. openai.")
    model: str = Field(min_length=1, description="The model the price is for.")
    input: float = Field(ge=0, description="USD per million input tokens, batch tier.")
    cached_input: float | None = Field(
        default=None, ge=0, description="USD per million cached input tokens; unset: as input."
    )
    output: float = Field(ge=0, description="USD per million output tokens, batch tier.")
    source: str = Field(default="cost.compare", description="Where the price comes from.")


class CacheSpec(_Section):
    path: str | None = Field(
        default=None,
        description="A response cache shared by jobs (a local directory or s3://...): an "
        "answer is looked up there before its request is sent, and every new one is stored.",
    )


class CostSpec(_Section):
    gpu: str = Field(default="h100", description="Accelerator name, shown in the report.")
    gpus: int = Field(default=1, gt=0, description="Accelerators the job holds while it runs.")
    usd_per_gpu_hour: float = Field(default=0.0, ge=0, description="Price of one GPU hour.")
    expected_tokens_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Throughput (prompt + output tokens/s) used by `jobs plan` to project "
        "cost before any run; without it the plan uses the last run's measured figure.",
    )
    compare: list[ProviderPrice] | None = Field(
        default=None,
        description="Provider batch prices the report compares the self-hosted cost with; "
        "unset: the published prices nightshift ships (see reports.compare), [] for none.",
    )
