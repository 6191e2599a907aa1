"""The canary: a sample of the job run under its settings and under the reference,
before the full run relies on a setting that may change answers (``run.canary``).

vLLM's own FP8-KV guidance reports 1-2 points lost uncalibrated and worse on some
models; SmolLM2-135M's demo labels change on 16% of records under an FP8 KV cache
(``jobs tune``). So a job that uses one (or speculative decoding) first runs about
``run.canary.records`` of its records, spread over the plan, twice: under the reference
(``jobs.reference``: the model's dtype in the KV cache, no speculation) on an engine of
its own, then under the job's settings on the job's own engine, each as a whole job
(``pipelines.direct.run_job``) into ``OUTPUT/canary/``. The share of equal answers is
kept in ``plan/canary.json`` and judged by ``running.canary``: below
``run.canary.min_agreement`` the job stops (exit 2). The job's answers to the sample are
kept in a response cache the full run reads, so none of them is generated twice.

The reference runs first and its engine is closed before the job's starts: two engines
never share one GPU. Where the setting cannot take effect (an FP8 KV cache on a CPU
without AVX-512 falls back to the model's dtype), there is nothing to compare, and the
canary says so instead of reporting a meaningless 100%.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nightshift.evaluation.agreement import agreement, answers
from nightshift.io.inputs import write_records
from nightshift.io.planstore import CANARY_DIR
from nightshift.jobs.loading import set_key, validate_spec
from nightshift.jobs.reference import KV, answer_changing, reference_sets
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import sampling_for
from nightshift.running.cached import canary_answers
from nightshift.running.canary import (
    NONE_DETERMINISTIC,
    NOTHING,
    canary_wanted,
    deterministic_ids,
    enforce,
    measure_again,
    nothing_to_compare_yet,
)
from nightshift.running.engines import EnginePool
from nightshift.running.runner import JobRun

MIN_RECORDS = 8  # a canary of a small job still compares this many records
LOOK_AT = 50_000  # records whose own sampling is read to find the deterministic ones


RunSide = Callable[..., Any]  # pipelines.direct.run_job, passed in: direct calls us


def check_canary(job: JobRun, engines: EnginePool, run_side: RunSide) -> None:
    """Measure the job's canary unless one is kept, then stop the job (exit 2) when its
    figure is below ``run.canary.min_agreement`` and not accepted. ``run_side`` runs
    each side of the canary as a whole job (``pipelines.direct.run_job``)."""
    if not canary_wanted(job.spec) or not job.todo:
        return
    plans = job.output.plans
    kept = plans.canary()
    if kept is None or measure_again(kept):
        began, again = time.perf_counter(), kept is not None
        kept = measure_canary(job, engines, run_side)
        kept = plans.replace_canary(kept) if again else plans.keep_canary(kept)
        job.progress.canary_measured(began, time.perf_counter())  # a band on report.png
        sampling = sampling_for(job.spec, job.runner.task)
        job.runner.canary_answers = canary_answers(plans, job.manifest, sampling)
    enforce(job.spec, kept)


def measure_canary(job: JobRun, engines: EnginePool, run_job: RunSide) -> dict[str, Any]:
    """Run the sample under the reference, then under the job's settings on ``engines``;
    what ``plan/canary.json`` keeps."""
    spec, began = job.spec, time.perf_counter()
    changing = answer_changing(spec)
    found = {"settings": changing, "reference": reference_sets(spec)}
    reason = _nothing_to_compare(spec, changing)
    ids, sampled = ([], 0) if reason else sample_ids(job)
    if not ids:
        fell_back = reason and set(changing) == {KV} and reason.startswith("engine.kv_cache")
        again = {"measure_again": True} if fell_back else {}  # this machine's, not the job's
        reason = reason or (NONE_DETERMINISTIC if sampled else "no record to sample")
        return {**found, "status": NOTHING, "reason": reason, **again}
    if sampled:  # records whose own sampling is random: two runs of them never agree
        found["records_left_out_sampled"] = sampled
    runs = {side: job.output.store.uri(f"{CANARY_DIR}/{side}") for side in ("reference", "job")}
    cache = f"{CANARY_DIR}/cache"
    with tempfile.TemporaryDirectory(prefix="nightshift-canary-") as tmp:
        sample = write_records(
            spec.input.path,
            spec.input.id_column,
            ids,
            Path(tmp) / "sample.parquet",
            spec.output.path,
        )
        reference = _side(spec, found["reference"], sample, runs["reference"], None)
        ref_report = run_job(reference, overwrite=True, progress=False).report
        mine = _side(spec, {}, sample, runs["job"], job.output.store.uri(cache))
        engine = engines.acquire()
        job_report = run_job(mine, overwrite=True, progress=False, engine=engine).report
    fallback = (engine.info.settings or {}).get("kv_cache_fallback")
    if fallback and set(changing) == {KV}:  # the job's engine fell back at its start
        return {**found, "status": NOTHING, "reason": fallback, "runs": runs, "measure_again": True}
    if fallback:  # another setting (a narrower model.dtype) still changes answers
        found["kv_cache_fallback"] = fallback
    return {
        **found,
        "status": "measured",
        "records": len(ids),
        "agreement": agreement(answers(runs["reference"]), answers(runs["job"])),
        "accuracy": {"job": _accuracy(job_report), "reference": _accuracy(ref_report)},
        "seconds": round(time.perf_counter() - began, 2),
        "runs": runs,
        "answers": cache,
    }


def sample_ids(job: JobRun) -> tuple[list, int]:
    """About ``run.canary.records`` record ids (at most a tenth of the job, at least
    ``MIN_RECORDS``), evenly spaced over the plan's order (a plan groups records by
    prefix and length, so its head alone would be no fair sample), of the records whose
    answers are deterministic; and how many records looked at were left out as sampled
    (``input.sampling_column``: temperature above 0, no seed)."""
    files = job.manifest.get("records_files", [])
    ids = [i for i in job.output.plans.read_column(files, "record_id").to_pylist() if i is not None]
    count = min(len(ids), job.spec.run.canary.records, max(MIN_RECORDS, len(ids) // 10))
    if count and job.spec.input.sampling_column is not None:
        looked = _spaced(ids, min(len(ids), LOOK_AT))
        ids = deterministic_ids(job.spec, looked)
        count, sampled = min(count, len(ids)), len(looked) - len(ids)
        return _spaced(ids, count), sampled
    return _spaced(ids, count), 0


def _spaced(ids: list, count: int) -> list:
    return [ids[int(k * len(ids) / count)] for k in range(count)] if count else []


def _side(
    spec: JobSpec, sets: dict[str, Any], sample: Path, out: str, cache: str | None
) -> JobSpec:
    """``spec`` as one side of the canary runs it: on ``sample`` into ``out``."""
    data = spec.model_dump(mode="json", by_alias=True)
    if spec.task.kind == "embed":  # its sampling is the validator's placeholder, not the user's
        data.pop("sampling", None)
    for key, value in {
        **sets,
        "input.path": str(sample),
        "output.path": out,
        "cache.path": cache,
        "run.canary": {"enabled": False},
        "schedule": None,
    }.items():
        set_key(data, key, value)
    return validate_spec(data)


def _nothing_to_compare(spec: JobSpec, changing: dict[str, Any]) -> str | None:
    """Why the job would run exactly as its reference here, or None."""
    if not changing:
        return "the job uses no setting that may change answers"
    sampled_or_fake = nothing_to_compare_yet(spec)
    if sampled_or_fake:
        return sampled_or_fake
    reason = kv_fallback_reason(spec)
    if reason and set(changing) == {KV}:
        return f"engine.kv_cache_dtype {changing[KV]} falls back to auto here: {reason}"
    return None


def kv_fallback_reason(spec: JobSpec) -> str | None:
    """Why ``spec``'s FP8 KV cache would fall back to the model's dtype on this machine
    (``VllmEngine.start``), or None (it takes effect, or the job asks for none)."""
    if spec.run.engine != "vllm" or not spec.engine.kv_cache_dtype.startswith("fp8"):
        return None
    from nightshift.engines.vllm_engine import fp8_kv_unsupported_reason

    return fp8_kv_unsupported_reason()


def _accuracy(report: dict[str, Any]) -> float | None:
    return (report.get("quality") or {}).get("accuracy")
