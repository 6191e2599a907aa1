"""Per-record sampling (``input.sampling_column``): one record's override of the job's.

Each value is a JSON object; any key left out or null keeps the job's ``sampling``.
``RecordSampling`` checks one, ``parse_record_sampling`` reads one from its column's
text (a bad one is a ``RecordError`` naming the key, and rejects only that record), and
``merge_sampling`` lays it over the job's ``Sampling`` for the engine. ``SamplingColumn``
does both for a whole job, once per distinct value (records tend to share a few).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from nightshift.engines.base import Constraint, Sampling
from nightshift.engines.reasoning import thinking_allowance
from nightshift.errors import RecordError
from nightshift.jobs.section import MAX_INT
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import TaskHandler, handler_for, sampling_for

BAD_SAMPLING = "bad_sampling"  # the reject kind of a value that does not parse
MAX_N = 128  # choices per record; past this it is a typo, and each is a whole generation
MAX_TOP_LOGPROBS = 20  # what OpenAI allows, and vLLM's default max_logprobs


class RecordSampling(BaseModel):
    """One record's sampling override; every key optional, null meaning the job's."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    max_tokens: int | None = Field(default=None, gt=0, le=MAX_INT)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)  # 0: every token (no top-k cut)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**64 - 1)  # what torch takes
    stop: list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    json_schema: dict[str, Any] | None = None
    json_object: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    reasoning_budget: int | None = Field(default=None, ge=0, le=MAX_INT)  # model.reasoning

    @field_validator("stop")
    @classmethod
    def _stops_not_empty(cls, stop: list[str] | None) -> list[str] | None:
        if stop is not None and any(not s for s in stop):
            raise ValueError("holds an empty string, which would end every answer at once")
        return stop

    @field_validator("json_schema")
    @classmethod
    def _schema_is_valid(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        import jsonschema

        if schema is not None:
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"is not a valid JSON schema: {exc.message}") from None
        return schema

    def problem(self, task: TaskHandler) -> str | None:
        """Why this override cannot go with the job (keys that contradict), or None."""
        if self.json_schema is not None and self.json_object:
            return "json_schema and json_object are both set; keep one"
        if self.top_logprobs and not self.logprobs:
            return "top_logprobs needs logprobs: true"
        guided = "json_schema" if self.json_schema is not None else None
        guided = guided or ("json_object" if self.json_object else None)
        if guided and task.constraint is not None:
            return f"{guided}: the job's task already fixes the answer's form"
        return None

    def canonical(self) -> str:
        """The override as canonical JSON (equal overrides, equal text): dedup's key."""
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True, separators=(",", ":"))


def parse_record_sampling(text: str | None, task: TaskHandler | None = None) -> RecordSampling:
    """One column value as an override; null or blank is no override. Raises
    ``RecordError`` (kind ``bad_sampling``) with a reason naming the key."""
    if text is None or not text.strip():
        return RecordSampling()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"sampling value is not JSON: {exc.msg}", BAD_SAMPLING) from None
    except RecursionError:  # "[[[[..." a hundred thousand deep: one record's problem
        raise RecordError("sampling value is nested too deeply", BAD_SAMPLING) from None
    if not isinstance(data, dict):
        what = type(data).__name__
        raise RecordError(f"sampling value is a JSON {what}, not an object", BAD_SAMPLING)
    try:
        override = RecordSampling.model_validate(data)
    except ValidationError as exc:
        raise RecordError(_first_problem(exc), BAD_SAMPLING) from None
    problem = override.problem(task) if task is not None else None
    if problem:
        raise RecordError(f"sampling {problem}", BAD_SAMPLING)
    return override


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors()[0]
    key = ".".join(str(part) for part in error["loc"]) or "value"
    if error["type"] == "extra_forbidden":
        keys = ", ".join(RecordSampling.model_fields)
        return f"sampling key {key!r} is not known; the keys are {keys}"
    message = error["msg"].removeprefix("Value error, ")
    return f"sampling {key}: {message}"


def merge_sampling(job: Sampling, override: RecordSampling, min_tokens: int = 0) -> Sampling:
    """The job's sampling with ``override``'s keys laid over it. ``min_tokens`` is the
    task's floor for an answer (a classify label must fit), as for the job's own."""
    o = override
    if o.reasoning_budget and not job.reasoning:  # 0 (thinking off) is what it does anyway
        raise RecordError(
            "sampling reasoning_budget: the job's model does not reason (model.reasoning)",
            BAD_SAMPLING,
        )
    constraint = job.constraint
    if o.json_schema is not None:
        constraint = Constraint(json_schema=o.json_schema)
    elif o.json_object:
        constraint = Constraint(json_object=True)
    logprobs = job.logprobs
    if o.logprobs is not None:
        logprobs = (o.top_logprobs or 0) if o.logprobs else None
    own = o.reasoning_budget is not None and job.reasoning
    budget = o.reasoning_budget if own else job.reasoning_budget
    # max_tokens bounds the answer; a reasoning budget's tokens come on top (jobs.tasks)
    answer = job.max_tokens - thinking_allowance(job.reasoning_budget)
    if o.max_tokens is not None:
        answer = max(o.max_tokens, min_tokens)
    return dataclasses.replace(
        job,
        max_tokens=answer + thinking_allowance(budget),
        reasoning_budget=budget,
        temperature=o.temperature if o.temperature is not None else job.temperature,
        top_p=o.top_p if o.top_p is not None else job.top_p,
        top_k=o.top_k if o.top_k is not None else job.top_k,
        seed=o.seed if o.seed is not None else job.seed,
        stop=tuple(o.stop) if o.stop is not None else job.stop,
        n=o.n if o.n is not None else job.n,
        constraint=constraint,
        logprobs=logprobs,
    )


def deterministic(sampling: Sampling) -> bool:
    """Whether the same prompt gets the same answer: temperature 0, or a fixed seed. Only
    then may two requests share one answer (dedup, the response cache)."""
    return sampling.temperature == 0 or sampling.seed is not None


def sampling_key(sampling: Sampling) -> str:
    """Canonical JSON of a whole ``Sampling`` (a JSON schema is an unhashable dict)."""
    return json.dumps(
        dataclasses.asdict(sampling), sort_keys=True, separators=(",", ":"), default=str
    )


class SamplingColumn:
    """A job's per-record sampling: each distinct column value parsed and merged once."""

    def __init__(self, spec: JobSpec, job: Sampling | None = None) -> None:
        self.column = spec.input.sampling_column
        self.task = handler_for(spec.task)
        # the run's own sampling (a classify job's scoring step), else the job's as written
        self.job = job if job is not None else sampling_for(spec, self.task)
        self._seen: dict[str | None, tuple[RecordSampling, Sampling] | RecordError] = {}

    def resolve(self, text: str | None) -> tuple[RecordSampling, Sampling]:
        """The record's override and its merged sampling; ``RecordError`` when bad."""
        found = self._seen.get(text)
        if found is None:
            try:
                override = parse_record_sampling(text, self.task)
                found = (override, self._merged(override))
            except RecordError as exc:
                found = exc
            if len(self._seen) > 100_000:  # bounded: every record may be its own
                self._seen.clear()
            self._seen[text] = found
        if isinstance(found, RecordError):
            raise found
        return found

    def sampling(self, text: str | None) -> Sampling:
        return self.resolve(text)[1]

    def _merged(self, override: RecordSampling) -> Sampling:
        merged = merge_sampling(self.job, override, self.task.min_tokens)
        if not self.job.score_tokens:
            return merged
        # classify by score reads its label from the scores, whatever else the record
        # asks: the scoring step stays as it is (a record's answer budget or schema
        # would only generate text no one reads)
        job = self.job
        # a reasoning model's thinking before that step: the record's own budget for it
        thinking = thinking_allowance(merged.reasoning_budget)
        tokens = job.max_tokens - thinking_allowance(job.reasoning_budget) + thinking
        return dataclasses.replace(merged, max_tokens=tokens, n=1, constraint=job.constraint)


def sampling_column(spec: JobSpec, job: Sampling | None = None) -> SamplingColumn | None:
    """The job's per-record sampling, or None when it has no ``input.sampling_column``;
    ``job``: the sampling the run sends (a scored classify job's step), laid under each."""
    if spec.input.sampling_column is None:
        return None
    return SamplingColumn(spec, job)
