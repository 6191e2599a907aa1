"""The canary: a sample of the job run under its settings and under the reference,
before the full run relies on a setting that may change answers (``run.canary``).

vLLM's own FP8-KV guidance reports 1-2 points lost uncalibrated and worse on some
models; SmolLM2-135M's demo labels change on 16% of records under an FP8 KV cache
(``jobs tune``). So a job that uses one (or speculative decoding) first runs about
``run.canary.records`` of its records, spread over the plan, twice: under the reference
(``jobs.reference``: the model's dtype in the KV cache, no speculation) on an engine of
its own, then under the job's settings on the job's own engine, each as a whole job
(``pipelines.direct.run_job``) into ``OUTPUT/canary/``. The share of equal answers is
kept in ``plan/canary.json`` with its 95% Wilson interval and judged by
``running.canary``: an interval below ``run.canary.min_agreement`` stops the job (exit
2), one at or above it lets the job on, and one that straddles it doubles the sample
(up to ``run.canary.max_records``, then the figure itself decides): a 64-record sample
is +-7 points at 92%, too wide to tell 92% from 95%. Each side's answers are cached
(``CACHES``), so a grown sample runs only its new records, and the full run reads the
job's, so none of them is generated twice.

Of several runs of one output (``jobs work`` on many machines after ``jobs plan
--write``), the one holding ``CanaryLease`` measures; the others wait for its measure.

The reference runs first and its engine is closed before the job's starts: two engines
never share one GPU. Where the setting cannot take effect (an FP8 KV cache on a CPU
without AVX-512 falls back to the model's dtype), there is nothing to compare, and the
canary says so instead of reporting a meaningless 100%.
"""

from __future__ import annotations

import logging
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from threading import Event
from typing import Any

from nightshift.evaluation.agreement import (
    agreement_figures,
    answers,
    outputs_answers,
    quality_figures,
)
from nightshift.io.inputs import write_records
from nightshift.io.leases import LEASES, LeaseKeeper, ShardLeases
from nightshift.io.planstore import CANARY_DIR
from nightshift.jobs.loading import set_key, validate_spec
from nightshift.jobs.reference import KV, answer_changing, reference_sets
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import sampling_for
from nightshift.running.cached import canary_answers
from nightshift.running.canary import (
    MORE,
    NONE_DETERMINISTIC,
    NOTHING,
    canary_wanted,
    decide,
    deterministic_ids,
    enforce,
    measure_again,
    nothing_to_compare_yet,
)
from nightshift.running.engines import EnginePool
from nightshift.running.runner import JobRun

log = logging.getLogger(__name__)
MIN_RECORDS = 8  # a canary of a small job still compares this many records
LOOK_AT = 50_000  # records whose own sampling is read to find the deterministic ones


RunSide = Callable[..., Any]  # pipelines.direct.run_job, passed in: direct calls us
POLL_S = 2.0  # how often a run waiting for another's canary looks again
CANARY_LEASE = 0  # the one "shard" of the canary's lease folder


class CanaryLease(ShardLeases):
    """The right to measure the job's canary: one run at a time (a `jobs run` or the
    first `jobs work`), the others wait for its measure. It is a shard lease under
    ``leases/canary/``, so a measurer that dies stops renewing it and, once it expires
    (``run.lease_s``), the next waiter measures instead."""

    def _prefix(self, shard: int) -> str:
        return f"{LEASES}/canary/"


def check_canary(
    job: JobRun, engines: EnginePool, run_side: RunSide, stopping: Event | None = None
) -> None:
    """Measure the job's canary unless one is kept, then stop the job (exit 2) when its
    figure is below ``run.canary.min_agreement`` and not accepted. ``run_side`` runs
    each side of the canary as a whole job (``pipelines.direct.run_job``). Of several
    runs of one output (workers), the holder of ``CanaryLease`` measures and the others
    wait for its measure; returns unjudged only when ``stopping`` is set meanwhile."""
    if not canary_wanted(job.spec) or not job.todo:
        return
    kept = job.output.plans.canary()
    if kept is None or measure_again(kept):
        kept = _measure_once(job, engines, run_side, stopping)
    if kept is None:
        return
    if job.runner.canary_answers is None:  # measured by another run while this one waited
        sampling = sampling_for(job.spec, job.runner.task)
        job.runner.canary_answers = canary_answers(job.output.plans, job.manifest, sampling)
    enforce(job.spec, kept)


def _measure_once(
    job: JobRun, engines: EnginePool, run_side: RunSide, stopping: Event | None
) -> dict[str, Any] | None:
    """The canary's measure: taken under ``CanaryLease`` here, or waited for."""
    plans, told = job.output.plans, False
    worker = f"canary-{uuid.uuid4().hex[:8]}"
    leases = CanaryLease(job.output.store, worker, ttl_s=job.spec.run.lease_s)
    while stopping is None or not stopping.is_set():
        lease = leases.claim(CANARY_LEASE)
        if lease is not None:
            with LeaseKeeper(leases, lease):
                kept = plans.canary()  # measured by the holder before us?
                if kept is None or measure_again(kept):
                    kept = _measure_and_keep(job, engines, run_side, kept is not None)
            leases.release(lease)
            return kept
        kept = plans.canary()
        if kept is not None and not measure_again(kept):
            return kept
        if not told:
            log.warning(
                "waiting for the job's canary (%s), being measured by another run: no shard "
                "is claimed before it",
                job.output.store.uri("plan/canary.json"),
            )
            told = True
        time.sleep(POLL_S)
    return None


def _measure_and_keep(
    job: JobRun, engines: EnginePool, run_side: RunSide, again: bool
) -> dict[str, Any]:
    plans, began = job.output.plans, time.perf_counter()
    kept = measure_canary(job, engines, run_side)
    kept = plans.replace_canary(kept) if again else plans.keep_canary(kept)
    job.progress.canary_measured(began, time.perf_counter())  # a band on report.png
    sampling = sampling_for(job.spec, job.runner.task)
    job.runner.canary_answers = canary_answers(plans, job.manifest, sampling)
    return kept


def measure_canary(job: JobRun, engines: EnginePool, run_job: RunSide) -> dict[str, Any]:
    """Run the sample under the reference, then under the job's settings on ``engines``,
    growing it while its agreement interval straddles the bar; what
    ``plan/canary.json`` keeps."""
    spec, began = job.spec, time.perf_counter()
    changing = answer_changing(spec)
    found = {"settings": changing, "reference": reference_sets(spec)}
    reason = _nothing_to_compare(spec, changing)
    sample = Sample([], 0, 0) if reason else sample_ids(job)
    if not sample.count:
        fell_back = reason and set(changing) == {KV} and reason.startswith("engine.kv_cache")
        again = {"measure_again": True} if fell_back else {}  # this machine's, not the job's
        reason = reason or (NONE_DETERMINISTIC if sample.left_out else "no record to sample")
        return {**found, "status": NOTHING, "reason": reason, **again}
    if sample.left_out:  # records whose own sampling is random: two runs of them never agree
        found["records_left_out_sampled"] = sample.left_out
    runs = {side: job.output.store.uri(f"{CANARY_DIR}/{side}") for side in ("reference", "job")}
    ran = _rounds(job, engines, run_job, sample, runs)
    if ran.get("fallback") and set(changing) == {KV}:  # the job's engine fell back
        return {**found, "status": NOTHING, "reason": ran["fallback"], "runs": runs,
                "measure_again": True}  # fmt: skip
    if ran.get("fallback"):  # another setting (a narrower model.dtype) still changes answers
        found["kv_cache_fallback"] = ran["fallback"]
    return {
        **found,
        "status": "measured",
        "records": ran["records"],
        **ran["figures"],
        "decision": ran["decision"],
        "max_records": sample.cap,
        "rounds": ran["rounds"],
        "accuracy": {"job": _accuracy(ran["job"]), "reference": _accuracy(ran["reference"])},
        "seconds": round(time.perf_counter() - began, 2),
        "runs": runs,
        "answers": CACHES["job"],
    }


def _rounds(
    job: JobRun, engines: EnginePool, run_job: RunSide, sample: Sample, runs: dict[str, str]
) -> dict[str, Any]:
    """The sample run and compared, doubled while its interval straddles the bar and it
    is under its cap; the last round's reports and figures, and each round's size and
    seconds (all of them in the canary's time band)."""
    ids, rounds = sample.first(), []
    while True:
        began = time.perf_counter()
        ran = _run_sample(job, engines, run_job, ids, runs)
        rounds.append({"records": len(ids), "seconds": round(time.perf_counter() - began, 2)})
        if ran.get("fallback") and set(answer_changing(job.spec)) == {KV}:
            return ran  # nothing compared: the caller says so
        figures = _figures(job.spec, runs)
        decision = decide(figures["agreement_ci"], job.spec.run.canary.min_agreement)
        if decision != MORE or len(ids) >= sample.cap:
            decision = decision if decision != MORE else "point value at the cap"
            return {**ran, "records": len(ids), "figures": figures, "decision": decision,
                    "rounds": rounds}  # fmt: skip
        ids = sample.grown(ids)


# Each side's answers are cached, so a grown sample runs only its new records.
CACHES = {"reference": f"{CANARY_DIR}/reference-cache", "job": f"{CANARY_DIR}/cache"}


def _run_sample(
    job: JobRun, engines: EnginePool, run_job: RunSide, ids: list, runs: dict[str, str]
) -> dict[str, Any]:
    """Both sides run over ``ids`` (the reference on an engine of its own, closed before
    the job's starts); their reports, and the job's engine's FP8 fallback if any."""
    spec, store = job.spec, job.output.store
    with tempfile.TemporaryDirectory(prefix="nightshift-canary-") as tmp:
        sample = write_records(
            spec.input.path,
            spec.input.id_column,
            ids,
            Path(tmp) / "sample.parquet",
            spec.output.path,
        )
        ref_cache = store.uri(CACHES["reference"])
        reference = _side(spec, reference_sets(spec), sample, runs["reference"], ref_cache)
        ref_report = run_job(reference, overwrite=True, progress=False).report
        mine = _side(spec, {}, sample, runs["job"], store.uri(CACHES["job"]))
        engine = engines.acquire()
        job_report = run_job(mine, overwrite=True, progress=False, engine=engine).report
    fallback = (engine.info.settings or {}).get("kv_cache_fallback")
    return {"reference": ref_report, "job": job_report, "fallback": fallback}


def _figures(spec: JobSpec, runs: dict[str, str]) -> dict[str, Any]:
    """Agreement with its 95% interval, and where the job has labels the flips: records
    the reference got right and the job's setting wrong, and the other way round."""
    figures = agreement_figures(answers(runs["reference"]), answers(runs["job"]))
    if spec.eval is not None and spec.eval.label_column is not None:
        _, reference = outputs_answers([runs["reference"]], spec)
        _, mine = outputs_answers([runs["job"]], spec)
        flips = quality_figures(reference, mine).get("flips")
        if flips:
            figures["flips"] = flips
    return figures


@dataclass
class Sample:
    """The records the canary may compare (``pool``: deterministic ones in plan order),
    its first sample's size and its cap (``run.canary.max_records``)."""

    pool: list
    count: int
    left_out: int  # records looked at and left out as sampled
    cap: int = 0

    def first(self) -> list:
        return _spaced(self.pool, self.count)

    def grown(self, ids: list) -> list:
        """``ids`` and new records up to twice as many (at most the cap), spread over the
        plan: a doubled spacing holds the first sample's records, so only new ones run."""
        target = min(self.cap, 2 * len(ids))
        have = set(ids)
        extra = [i for i in _spaced(self.pool, target) if i not in have]
        if len(ids) + len(extra) < target:  # a capped spacing that missed some: fill in order
            spaced = set(extra)
            extra += [i for i in self.pool if i not in have and i not in spaced]
        return ids + extra[: target - len(ids)]


def sample_ids(job: JobRun) -> Sample:
    """About ``run.canary.records`` records (at most a tenth of the job, at least
    ``MIN_RECORDS``), evenly spaced over the plan's order (a plan groups records by
    prefix and length, so its head alone would be no fair sample), of the records whose
    answers are deterministic (``input.sampling_column``: temperature above 0 and no
    seed is left out); the sample may grow to ``run.canary.max_records`` (4x records
    unset, at most a quarter of the job)."""
    canary = job.spec.run.canary
    files = job.manifest.get("records_files", [])
    ids = [i for i in job.output.plans.read_column(files, "record_id").to_pylist() if i is not None]
    count = min(len(ids), canary.records, max(MIN_RECORDS, len(ids) // 10))
    cap = canary.max_records or min(4 * canary.records, max(count, len(ids) // 4))
    left_out = 0
    if count and job.spec.input.sampling_column is not None:
        looked = _spaced(ids, min(len(ids), LOOK_AT))
        ids = deterministic_ids(job.spec, looked)
        left_out = len(looked) - len(ids)
    count = min(count, len(ids))
    return Sample(ids, count, left_out, max(count, min(cap, len(ids))))


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
