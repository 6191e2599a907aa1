"""What bound a candidate's run, as measured, beside what the capacity planner predicts.

Measured, from the engine's own counters (``EngineStats``): preemptions and the peak
share of the KV cache in use (memory), the batch size reached against
``engine.max_num_seqs`` (the batch cap), the tokens per engine step against
``engine.max_num_batched_tokens`` (the token budget), else where the requests' time
went (prefill or decode). Predicted: ``scheduling.capacity`` on the candidate's own
plan and settings, for the GPU this machine has, or the one ``--gpu`` names; the
planner knows GPUs only, so on a CPU host there is no prediction, and it says so.
"""

from __future__ import annotations

from typing import Any

from nightshift.jobs.platform import batch_limits
from nightshift.jobs.spec import JobSpec

KV_FULL = 0.95  # a peak KV-cache usage this high: the cache is what holds the batch back
# With requests waiting, steps this full (on average, the ramp and tail included) mean
# the token budget is what keeps them waiting.
BUDGET_FULL = 0.5
MEMORY = "memory (KV cache)"
BATCH_CAP = "engine.max_num_seqs"
TOKEN_BUDGET = "engine.max_num_batched_tokens"
NO_GPU = "the capacity planner knows GPUs only; this machine has none (--gpu predicts for one)"


def measured_limit(report: dict[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The limit that bound the run, and the counters that say so."""
    c = (report.get("engine") or {}).get("counters") or {}
    # the limits the engine ran with: its report's (its own choice when the spec set none)
    chosen = ((report.get("engine") or {}).get("settings") or {}).get("chosen") or {}
    limits = batch_limits(spec.engine)
    steps = c.get("engine_steps") or 0
    engine_tokens = (c.get("prompt_tokens") or 0) - (c.get("prompt_tokens_cached") or 0)
    engine_tokens += c.get("output_tokens") or 0
    per_step = engine_tokens / steps if steps else None
    prefill, decode = c.get("prefill_seconds", 0.0), c.get("decode_seconds", 0.0)
    facts = {
        "kv_cache_peak": c.get("peak_kv_cache_usage"),
        "preemptions": c.get("preemptions", 0),
        "batch_reached": c.get("peak_running"),
        "max_num_seqs": chosen.get("max_num_seqs") or limits[0],
        "waiting_peak": c.get("peak_waiting"),
        "tokens_per_step": round(per_step, 1) if per_step is not None else None,
        "max_num_batched_tokens": chosen.get("max_num_batched_tokens") or limits[1],
        "prefill_share": round(prefill / (prefill + decode), 3) if prefill + decode else None,
    }
    return {"bound_by": _binding(facts), **facts}


def _binding(f: dict[str, Any]) -> str | None:
    if f["preemptions"] or (f["kv_cache_peak"] or 0) >= KV_FULL:
        return MEMORY
    if f["batch_reached"] and f["batch_reached"] >= f["max_num_seqs"]:
        return BATCH_CAP
    per_step = f["tokens_per_step"] or 0
    if f["waiting_peak"] and per_step >= BUDGET_FULL * f["max_num_batched_tokens"]:
        return TOKEN_BUDGET
    if f["prefill_share"] is None:
        return None
    return "prefill" if f["prefill_share"] >= 0.5 else "decode"


def local_gpu() -> str | None:
    """The planner's name for this machine's GPU (``h200`` for an NVIDIA H200), if any;
    an H100's PCIe and NVL forms by their own rows (``capacity.gpus.gpu_for_device``)."""
    from nightshift.capacity.gpus import local_gpu as from_driver

    return from_driver()


def predicted_limit(
    spec: JobSpec, output: str, report: dict[str, Any], gpu: str | None
) -> dict[str, Any]:
    """The planner's figures for the run in ``output`` (its plan, its settings, its
    measured answer length) on ``gpu``; a note where there is no GPU to predict for."""
    if gpu is None:
        return {"note": NO_GPU}
    import polars as pl

    from nightshift.errors import NightshiftError
    from nightshift.io.outputs import JobOutput
    from nightshift.scheduling.capacity import predict_plan, prepare
    from nightshift.scheduling.dedup import ANSWERED_FROM, distinct_records

    records = report["records"]["ok"] + report["records"]["failed"]
    per_record = max(1, round(report["tokens"]["output"] / records)) if records else None
    try:
        planner = prepare(spec, gpu, None, per_record)
        columns = ["tokens", "predicted_cached", ANSWERED_FROM]
        plan = pl.from_arrow(JobOutput(output).plans.read_records(columns))
        found = predict_plan(planner, distinct_records(plan), {})
    except (NightshiftError, OSError, ValueError) as exc:
        return {"gpu": gpu, "note": f"no prediction: {exc}"}
    return {
        "gpu": gpu,
        "bound_by": found["binding_limit"],
        "batch": found["batch"],
        "batch_limited_by": found["memory"]["batch_limited_by"],
        "tokens_per_s": round(found["tokens_per_s"], 1),
    }
