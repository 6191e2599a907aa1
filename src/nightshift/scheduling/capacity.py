"""``nightshift jobs plan --gpu``: the capacity prediction for a planned job.

Reads the model's config.json (the weights are not needed), takes the plan's real
prompt lengths and prefix-cache predictions, and predicts tokens/s, wall time, cost per
million tokens and the binding limit, beside the same figures for the main levers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from nightshift.capacity.gpus import GpuSpec, find_gpu
from nightshift.capacity.predict import (
    Batch,
    DoesNotFit,
    EngineSettings,
    Prediction,
    Workload,
    kv_cache_bytes,
    predict,
)
from nightshift.capacity.roofline import ARITHMETIC, BANDWIDTH, Hardware, hardware
from nightshift.capacity.shape import ModelShape, gpu_dtype, kv_width, local_config, model_shape
from nightshift.engines.tokenizer import model_source
from nightshift.errors import SpecError
from nightshift.jobs.platform import batch_limits, device_class
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget

NO_WEIGHTS = "the planner reads only config.json; the weights are not needed"
ADVICE = {
    ARITHMETIC: "compute fewer prompt tokens (planned order, shared text first), FP8 "
    "weights, or more GPUs",
    BANDWIDTH: "raise engine.max_num_seqs: more records share each read of the weights",
    "memory capacity": "the KV cache is full: engine.kv_cache_dtype fp8, more GPUs, or "
    "shorter answers fit more records in a pass",
}


def read_config(path: str) -> dict[str, Any]:
    """The model's config.json: from a local folder, else from the Hugging Face hub."""
    source = model_source(path)
    if Path(source).is_dir():
        config = local_config(source)
        if config is None:
            fix = f"copy the model's config.json into it; {NO_WEIGHTS}"
            raise SpecError("model.path", f"{path} holds no config.json", fix)
        return config
    try:
        from huggingface_hub import hf_hub_download

        return local_config(Path(hf_hub_download(source, "config.json")).parent) or {}
    except Exception as exc:  # offline, gated, no such repository
        raise SpecError(
            "model.path",
            f"cannot read config.json of {path!r} ({type(exc).__name__})",
            f"point model.path at a folder holding its config.json; {NO_WEIGHTS}",
        ) from None


@dataclass(frozen=True)
class Planner:
    """Everything the prediction needs besides the plan, checked before planning."""

    spec: JobSpec
    gpu_name: str
    gpu: GpuSpec
    gpus: int
    config: dict[str, Any]
    shape: ModelShape
    output_per_record: float
    output_source: str

    @property
    def hardware(self) -> Hardware:
        """One engine's GPUs: engine.tensor_parallel_size of them."""
        c = self.spec.capacity
        return hardware(
            self.gpu_name,
            self.gpu,
            self.spec.engine.tensor_parallel_size,
            self.shape.weight_bytes,
            c.bandwidth_efficiency,
            c.compute_efficiency,
            c.step_overhead_s,
        )

    @property
    def workers(self) -> int:
        """Engines on ``gpus``: data parallel, one per tensor-parallel group (--workers)."""
        return max(1, self.gpus // self.spec.engine.tensor_parallel_size)

    @property
    def settings(self) -> EngineSettings:
        e = self.spec.engine
        # unset limits: the engine's default on the target GPU (1024 on an H100/H200)
        seqs, tokens = batch_limits(e, device_class(self.gpu.memory_gib, self.gpu_name))
        return EngineSettings(e.kv_cache_dtype, seqs, tokens, e.gpu_memory_utilization)

    def kv_width(self, kv_cache_dtype: str) -> int:
        return kv_width(kv_cache_dtype, self.config, gpu_dtype(self.config, self.spec.model.dtype))


def output_estimate(spec: JobSpec, given: int | None) -> tuple[float, str]:
    """Output tokens per record the prediction assumes, and where the figure comes from."""
    if spec.task.kind == "embed":
        return 0, "embed: prompt tokens only (prefill; nothing is generated)"
    if given:
        return given, "--output-tokens"
    if spec.capacity.output_tokens:
        return spec.capacity.output_tokens, "capacity.output_tokens"
    # a reasoning model's thinking is output too: its budget is counted in (answer_budget)
    thinking = " plus sampling.reasoning_budget" if spec.sampling.reasoning_budget else ""
    if spec.task.kind == "classify":
        bound = f"classify: the longest label's bound{thinking} (an upper bound)"
        return answer_budget(spec), bound
    return answer_budget(spec), (
        f"sampling.max_tokens{thinking}, every answer at its limit (an upper bound; "
        "pass --output-tokens for the expected length)"
    )


def prepare(spec: JobSpec, gpu: str, gpus: int | None, output_tokens: int | None) -> Planner:
    """Check the model config, the GPU and that the weights fit, before any planning."""
    config = read_config(spec.model.path)
    try:
        shape = model_shape(config, gpu_dtype(config, spec.model.dtype))
    except ValueError as exc:
        raise SpecError("model.path", f"config.json: {exc}", NO_WEIGHTS) from None
    out, source = output_estimate(spec, output_tokens)
    count = gpus or spec.cost.gpus
    planner = Planner(
        spec, gpu.lower(), find_gpu(gpu, spec.capacity.gpus), count, config, shape, out, source
    )
    try:
        kv_cache_bytes(shape, planner.hardware, spec.engine.gpu_memory_utilization)
    except DoesNotFit as exc:
        tp, need = spec.engine.tensor_parallel_size, exc.gpus_needed
        raise SpecError(
            "engine.tensor_parallel_size",
            f"{tp} x {gpu} per engine: {exc}",
            f"set engine.tensor_parallel_size to {need} and pass --gpus {need} (or a multiple)",
        ) from None
    return planner


def plan_workload(records: pl.DataFrame, output_per_record: float, cached_scale: float = 1.0):
    """The plan's records as a workload; ``cached_scale`` rescales the cached tokens (to
    model another order whose reuse share is known only in total)."""
    n = pl.col("tokens").cast(pl.Float64)
    k = pl.min_horizontal(pl.col("predicted_cached").cast(pl.Float64) * cached_scale, n)
    sums = records.select(
        n.sum().alias("prompt"), k.sum().alias("cached"), ((n * n - k * k) / 2).sum().alias("att")
    ).row(0)
    prompt, cached, attended = (v or 0 for v in sums)
    return Workload(records.height, int(prompt), int(cached), float(attended), output_per_record)


def headline(prediction: Prediction, usd_per_gpu_hour: float, gpus: int) -> dict[str, Any]:
    hours = prediction.seconds / 3600
    usd = hours * usd_per_gpu_hour * gpus
    tokens = prediction.work.prompt_tokens + prediction.work.output_tokens
    return {
        "tokens_per_s": prediction.tokens_per_s,
        "output_tokens_per_s": prediction.output_tokens_per_s,
        "wall_hours": hours,
        "usd": usd,
        "usd_per_million_tokens": usd / tokens * 1e6 if tokens else 0.0,
        "batch": prediction.batch.size,
        "binding_limit": prediction.binding,
    }


def _levers(planner: Planner, records: pl.DataFrame, reuse: dict[str, Any]) -> list[dict]:
    """The prediction again with one setting changed at a time."""
    s, hw, out = planner.settings, planner.hardware, planner.output_per_record
    other_kv = "auto" if s.kv_cache_dtype.startswith("fp8") else "fp8"
    variants = [
        ("as planned", s, 1.0),
        (f"engine.kv_cache_dtype: {other_kv}", replace(s, kv_cache_dtype=other_kv), 1.0),
    ]
    for seqs in sorted({64, 256, 1024} - {s.max_num_seqs}):
        variants.append((f"engine.max_num_seqs: {seqs}", replace(s, max_num_seqs=seqs), 1.0))
    planned = reuse.get("predicted") or 0.0
    if planned > 0:
        variants.append(("input order (prefix cache)", s, reuse.get("input_order", 0.0) / planned))
    price, rows = planner.spec.cost.usd_per_gpu_hour, []
    for label, settings, scale in variants:
        work = plan_workload(records, out, scale)
        width = planner.kv_width(settings.kv_cache_dtype)
        p = predict(planner.shape, hw, work, settings, width, planner.workers)
        rows.append({"lever": label, **headline(p, price, planner.gpus)})
    return rows


def advice(p: Prediction, levers: list[dict], max_num_seqs: int) -> str:
    """What would move the binding limit, as the levers table shows it: more sequences
    only where a larger engine.max_num_seqs is predicted faster (a batch held by the
    records there are, or by max_num_batched_tokens, gains nothing from it)."""
    if p.binding != BANDWIDTH:
        return ADVICE[p.binding]
    base = levers[0]["tokens_per_s"] or 0.0
    faster = [
        (row["tokens_per_s"], int(row["lever"].rsplit(" ", 1)[1]))
        for row in levers
        if row["lever"].startswith("engine.max_num_seqs:")
        and int(row["lever"].rsplit(" ", 1)[1]) > max_num_seqs
        and row["tokens_per_s"] > base * 1.02
    ]
    if faster:
        best = max(tps for tps, _ in faster)  # the least setting that gets (about) the most
        tps, seqs = min(((t, n) for t, n in faster if t >= best * 0.99), key=lambda f: f[1])
        gain = f" ({tps / base:.2f}x the tokens/s)" if base else ""
        share = "more records share each read of the weights"
        return f"raise engine.max_num_seqs to {seqs}{gain}: {share}"
    held = p.batch.limited_by
    why = "the job has no more records" if held == "records" else f"{held} holds it"
    return (
        f"each pass reads every weight for a batch of {p.batch.size:,}, and {why}: a larger "
        "engine.max_num_seqs changes nothing here (see the levers); more records per job "
        "(or several jobs' records in one) would share each read"
    )


def _model_facts(planner: Planner) -> dict[str, Any]:
    shape = planner.shape
    return {
        "parameters": shape.parameters,
        "active_parameters": shape.active_parameters,
        "layers": shape.layers,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "weight_bytes_per_parameter": shape.weight_bytes,
        "weights_gib": shape.weights_bytes / 2**30,
        "kv_bytes_per_token": {
            "model_dtype": shape.kv_bytes_per_token(planner.kv_width("auto")),
            "fp8": shape.kv_bytes_per_token(1),
        },
    }


def _hardware_facts(planner: Planner) -> dict[str, Any]:
    hw, c = planner.hardware, planner.spec.capacity
    return {
        "name": planner.gpu_name,
        "gpus": planner.gpus,
        "workers": planner.workers,  # data-parallel engines, each on these GPUs:
        "gpus_per_engine": hw.gpus,  # engine.tensor_parallel_size
        **planner.gpu.model_dump(),
        "compute_dtype": hw.compute_dtype,
        "efficiency": {"bandwidth": c.bandwidth_efficiency, "compute": c.compute_efficiency},
    }


def _memory_facts(b: Batch, kv_cache_dtype: str) -> dict[str, Any]:
    return {
        "kv_cache_gib": b.kv_cache_bytes / 2**30,
        "kv_cache_dtype": kv_cache_dtype,
        "kv_bytes_per_token": b.kv_bytes_per_token,
        "kv_cache_tokens": int(b.kv_cache_bytes // b.kv_bytes_per_token),
        "tokens_per_record": b.tokens_per_record,
        "records_that_fit": b.fits,
        "batch": b.size,
        "batch_limited_by": b.limited_by,
    }


def predict_plan(planner: Planner, records: pl.DataFrame, reuse: dict[str, Any]) -> dict[str, Any]:
    """The ``capacity`` section of ``jobs plan``: the prediction, its parts and the levers."""
    settings, hw = planner.settings, planner.hardware
    width = planner.kv_width(settings.kv_cache_dtype)
    work = plan_workload(records, planner.output_per_record)
    p = predict(planner.shape, hw, work, settings, width, planner.workers)
    uncached = predict(
        planner.shape,
        hw,
        plan_workload(records, work.output_per_record, 0),
        settings,
        width,
        planner.workers,
    )
    levers = _levers(planner, records, reuse)
    return {
        **headline(p, planner.spec.cost.usd_per_gpu_hour, planner.gpus),
        "advice": advice(p, levers, settings.max_num_seqs),
        "gpu": _hardware_facts(planner),
        "model": _model_facts(planner),
        "output_tokens": {"per_record": work.output_per_record, "source": planner.output_source},
        "tokens": {
            "prompt": work.prompt_tokens,
            "prompt_computed": work.computed_tokens,
            "output": work.output_tokens,
        },
        "memory": _memory_facts(p.batch, settings.kv_cache_dtype),
        "passes": {"prefill": p.prefill.as_dict(), "decode": p.decode.as_dict()},
        "time_s": {"prefill": p.prefill_s, "decode": p.decode_s, "total": p.seconds},
        "prefix_cache": {
            "cached_tokens": work.cached_tokens,
            "share": work.cached_tokens / work.prompt_tokens if work.prompt_tokens else 0.0,
            "seconds_saved": uncached.seconds - p.seconds,
        },
        "levers": levers,
        "note": "a roofline estimate plus capacity.step_overhead_s per pass (an assumption, "
        "not yet measured with vLLM on a GPU); engine start-up, the ramp and tail of the "
        "job and exchanges between tensor-parallel GPUs are not included. The efficiency "
        "factors are calibrated on TensorRT-LLM's published figures, not vLLM's",
    }


def _secs(seconds: float) -> str:
    return f"{seconds:,.0f} s" if seconds >= 100 else f"{seconds:.3g} s"


def _usd(usd: float) -> str:
    if usd >= 10:
        return f"${usd:,.2f}"
    return f"${usd:.3g}" if usd >= 0.001 else f"${usd:.2e}"


def _count(n: float) -> str:
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{n:,.0f}"


def _cost(row: dict[str, Any]) -> str:
    if not row["usd"]:
        return "cost unknown (set cost.usd_per_gpu_hour)"
    return f"{_usd(row['usd'])}, {_usd(row['usd_per_million_tokens'])} per million tokens"


def _lever_lines(levers: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"  {'levers':<36} {'tokens/s':>12} {'time':>10} {'batch':>6} {'$/M tokens':>10}  binds"
    ]
    for row in levers:
        per_million = _usd(row["usd_per_million_tokens"]) if row["usd"] else "?"
        time = _secs(row["wall_hours"] * 3600)
        lines.append(
            f"    {row['lever']:<34} {row['tokens_per_s']:>12,.0f} {time:>10} "
            f"{row['batch']:>6,} {per_million:>10}  {row['binding_limit']}"
        )
    return lines


def capacity_text(c: dict[str, Any]) -> list[str]:
    """The prediction as ``jobs plan`` prints it."""
    g, m, mem, passes = c["gpu"], c["model"], c["memory"], c["passes"]
    pre, dec, cache = passes["prefill"], passes["decode"], c["prefix_cache"]
    eff = g["efficiency"]
    lines = [
        f"capacity on {g['gpus']} x {g['name']} ({g['memory_gib']:g} GiB, "
        f"{g['bandwidth_gbs']:,.0f} GB/s, {g['compute_dtype']} at {eff['bandwidth']:.0%} of "
        f"bandwidth and {eff['compute']:.0%} of FLOP/s; {g['workers']} engine(s) of "
        f"{g['gpus_per_engine']} GPU(s), data parallel as --workers):",
        f"  model: {_count(m['parameters'])} parameters ({m['weights_gib']:,.1f} GiB), "
        f"{m['layers']} layers, {m['kv_heads']} KV heads x {m['head_dim']}; KV bytes/token "
        f"{m['kv_bytes_per_token']['model_dtype']:,} in the model's dtype, "
        f"{m['kv_bytes_per_token']['fp8']:,} in fp8",
        f"  memory: KV cache {mem['kv_cache_gib']:,.1f} GiB ({mem['kv_cache_dtype']}) = "
        f"{mem['kv_cache_tokens']:,} tokens; {mem['records_that_fit']:,} records fit at "
        f"{mem['tokens_per_record']:,.0f} tokens each; batch {mem['batch']:,} "
        f"(limited by {mem['batch_limited_by']})",
        f"  passes: prefill {pre['seconds'] * 1e3:,.1f} ms ({pre['limit']}), decode "
        f"{dec['seconds'] * 1e3:,.2f} ms ({dec['limit']})",
        f"  prefix cache: {cache['cached_tokens']:,} prompt tokens served ({cache['share']:.1%}), "
        f"saving {_secs(cache['seconds_saved'])}",
        f"  output: {c['output_tokens']['per_record']:g} tokens per record "
        f"({c['output_tokens']['source']})",
        f"  predicted: {c['tokens_per_s']:,.0f} tokens/s ({c['output_tokens_per_s']:,.0f} output), "
        f"{_secs(c['wall_hours'] * 3600)}, {_cost(c)}",
        f"  binding limit: {c['binding_limit']}; {c['advice']}",
    ]
    return lines + _lever_lines(c["levers"])
