"""What decides an answer besides its prompt (the response cache's scope), and the output
lengths `jobs plan` can learn before a run: from a previous run into the same output, or
from answers the response cache holds for this model and sampling."""

from __future__ import annotations

import dataclasses
from typing import Any

from nightshift.engines.base import Sampling
from nightshift.io.outputs import JobOutput
from nightshift.io.responsecache import sample_answers, scope_digest
from nightshift.jobs.fingerprint import result_inputs
from nightshift.jobs.sampling import deterministic
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import handler_for, sampling_for

SCOPE_KEYS = (
    "model.identity",
    "model.tokenizer",
    "model.dtype",
    "model.max_model_len",
    "engine.kv_cache_dtype",
    "engine.extra",
)
SAMPLE_ANSWERS = 500


def cacheable(sampling: Sampling) -> bool:
    """Whether answers under ``sampling`` may be stored and served: deterministic (the
    definition dedup uses: temperature 0 or a seed), with one choice and no logprobs."""
    return deterministic(sampling) and sampling.n == 1 and sampling.logprobs is None


def cache_scope(
    fingerprint_inputs: dict[str, Any], sampling: Sampling, adapter: str | None = None
) -> dict[str, Any]:
    """The fingerprint's model and engine entries and the sampling the engine is given,
    guided-decoding constraint included, and a request's LoRA adapter by its content.
    Template and task are left out: the token ids are the rendered prompt, and rows are
    parsed from the cached text by each job's task."""
    scope = {
        **{k: fingerprint_inputs.get(k) for k in SCOPE_KEYS},
        "sampling": _sampling_dump(sampling),
    }
    if fingerprint_inputs.get("engine") is not None:  # never across engine versions
        scope["engine"] = fingerprint_inputs["engine"]
    if adapter is not None:  # base-model answers keep the scope they had before adapters
        scope["adapter"] = (fingerprint_inputs.get("model.adapters") or {}).get(adapter, adapter)
    return scope


def _sampling_dump(sampling: Sampling) -> dict[str, Any]:
    """The sampling, less the settings added for per-record sampling where they hold
    their default: a job's scope, and the answers cached under it, stay as they were."""
    data = dataclasses.asdict(sampling)
    defaults = (
        ("n", 1),
        ("logprobs", None),
        ("top_k", 0),
        ("score_tokens", ()),
        ("pooling", None),
        ("reasoning", False),
        ("reasoning_budget", None),
    )
    for key, default in defaults:
        if data[key] == default:
            del data[key]
    if data["constraint"] is not None and not data["constraint"]["json_object"]:
        del data["constraint"]["json_object"]
    return data


def sampled_output(spec: JobSpec) -> tuple[float, str] | None:
    """Mean output tokens per record, and where the figure comes from, or None."""
    last = JobOutput(spec.output.path).report()
    answered = (last or {}).get("records", {}).get("ok", 0) + (last or {}).get("records", {}).get(
        "failed", 0
    )
    if last and answered and last.get("tokens", {}).get("output"):
        return last["tokens"]["output"] / answered, "the previous run's report.json"
    sampling = sampling_for(spec, handler_for(spec.task))
    if not spec.cache.path or not cacheable(sampling):  # a sample is never cached
        return None
    scope = cache_scope(result_inputs(spec), sampling)
    answers = sample_answers(spec.cache.path, scope_digest(scope), SAMPLE_ANSWERS)
    if not answers:
        return None
    mean = sum(a["output_tokens"] for a in answers) / len(answers)
    return mean, f"a sample of {len(answers)} answers in cache.path"
