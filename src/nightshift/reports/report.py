"""The run report: counts, tokens, times, throughput and cost, as plain arithmetic.

Cost model (stated in the README and in every report):

* ``cost.usd_total = usd_per_gpu_hour x gpus x time_s.total / 3600``: the whole wall
  time is billed, planning and engine start-up included, because the GPUs are held.
* ``cost.usd_per_million_tokens.total = usd_total / (prompt + output tokens) x 1e6``.
* The split between input and output follows where the engine spent its time: the
  engine's summed per-request prefill seconds against its summed decode seconds.
  ``input = usd_total x prefill_share / prompt tokens x 1e6`` and
  ``output = usd_total x (1 - prefill_share) / output tokens x 1e6``. When the engine
  reports no phase times, the share is the prompt tokens' share of all tokens, which
  makes both figures equal to the total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nightshift.engines.base import EngineInfo, EngineStats
from nightshift.engines.identity import engine_identity
from nightshift.jobs.spec import CostSpec
from nightshift.reports.lines import cost_line, time_line
from nightshift.reports.quality import quality_summary_lines
from nightshift.reports.reasoning import reasoning_lines
from nightshift.running.canary import summary_line
from nightshift.running.totals import RunTotals
from nightshift.scheduling.reuse import NONE_SHARE, reuse_note

COST_FORMULA = (
    "usd_total = usd_per_gpu_hour x gpus x wall_hours (planning and start-up included); "
    "per million tokens = share of usd_total / tokens x 1e6, split between input and output "
    "by the engine's prefill and decode seconds"
)


@dataclass(frozen=True)
class Timings:
    total: float
    plan: float
    engine_startup: float
    generate: float
    overlap: float = 0.0  # engine start-up seconds that ran before the plan was written
    prepare: float = 0.0  # before planning: nightshift's and Prefect's own start-up
    wrap_up: float = 0.0  # after the last answer: engine shutdown, counters, report


def _ratio(part: float, whole: float) -> float:
    """part / whole, and 0 for an empty whole (a run with no tokens costs 0 per token)."""
    return part / whole if whole > 0 else 0.0


def _per_million(usd: float, tokens: int) -> float:
    return _ratio(usd, tokens) * 1e6


def prefill_share(stats: EngineStats, prompt_tokens: int, output_tokens: int) -> float:
    """Share of engine time spent reading prompts (see the module docstring)."""
    phase = stats.prefill_seconds + stats.decode_seconds
    if phase > 0:
        return stats.prefill_seconds / phase
    return _ratio(prompt_tokens, prompt_tokens + output_tokens)


def cost_section(cost: CostSpec, wall_s: float, totals: RunTotals, share: float) -> dict:
    usd = cost.usd_per_gpu_hour * cost.gpus * wall_s / 3600
    return {
        "gpu": cost.gpu,
        "gpus": cost.gpus,
        "usd_per_gpu_hour": cost.usd_per_gpu_hour,
        "gpu_hours": cost.gpus * wall_s / 3600,
        "usd_total": usd,
        "input_share": share,
        "usd_per_million_tokens": {
            "input": _per_million(usd * share, totals.prompt_tokens),
            "output": _per_million(usd * (1 - share), totals.output_tokens),
            "total": _per_million(usd, totals.prompt_tokens + totals.output_tokens),
        },
        "formula": COST_FORMULA,
    }


def hit_rate(stats: EngineStats, totals: RunTotals) -> float:
    """The engine's own prefix-cache hit rate (hits / queries, in tokens)."""
    if stats.prefix_cache_queries:
        return stats.prefix_cache_hits / stats.prefix_cache_queries
    return _ratio(totals.prompt_tokens_cached, totals.prompt_tokens)


def build_report(
    job: str,
    totals: RunTotals,
    times: Timings,
    stats: EngineStats,
    info: EngineInfo | None,
    cost: CostSpec,
) -> dict[str, Any]:
    all_tokens = totals.prompt_tokens + totals.output_tokens
    share = prefill_share(stats, totals.prompt_tokens, totals.output_tokens)
    return {
        "job": job,
        "records": {
            "input": totals.input_records,
            "ok": totals.ok,
            "rejected": totals.rejected,
            "failed": totals.failed,
        },
        "tokens": {
            "prompt": totals.prompt_tokens,
            "prompt_cached": totals.prompt_tokens_cached,
            "output": totals.output_tokens,
            "total": all_tokens,
        },
        "time_s": {
            "total": times.total,
            "prepare": times.prepare,
            "plan": times.plan,
            "engine_startup": times.engine_startup,
            "generate": times.generate,
            "startup_during_plan": times.overlap,
            "wrap_up": times.wrap_up,
        },
        "throughput": {
            "output_tokens_per_s": _ratio(totals.output_tokens, times.generate),
            "total_tokens_per_s": _ratio(all_tokens, times.generate),
            "records_per_s": _ratio(totals.ok + totals.failed, times.generate),
        },
        "cost": cost_section(cost, times.total, totals, share),
        "prefix_cache_hit_rate": hit_rate(stats, totals),
        "finish_reasons": dict(sorted(totals.finish_reasons.items())),
        "engine": _engine_section(info, stats),
    }


def _engine_section(info: EngineInfo | None, stats: EngineStats) -> dict[str, Any]:
    if info is None:
        return {}
    return {
        "name": info.name,
        # the distribution and version that answered (an answer-changing setting)
        "version": engine_identity(info.name)["version"],
        "distribution": engine_identity(info.name)["name"],
        "kv_cache_dtype": info.kv_cache_dtype,
        "kv_cache_tokens": info.kv_cache_tokens,
        "block_size": info.block_size,
        "prefix_caching": info.prefix_caching,
        "settings": info.settings,
        "counters": vars(stats),
    }


def summary_lines(report: dict[str, Any], output: str) -> list[str]:
    """The few lines a person reads at the end of a run."""
    r, t = report["records"], report["tokens"]
    return [
        f"{report['job']}: {r['ok']:,} ok, {r['rejected']:,} rejected, {r['failed']:,} failed "
        f"of {r['input']:,} records",
        *_shard_line(report),
        f"tokens: {t['prompt']:,} prompt ({t['prompt_cached']:,} cached, hit rate "
        f"{report['prefix_cache_hit_rate']:.1%}), {t['output']:,} output",
        *_reuse_line(report.get("prefix_reuse")),
        time_line(report),  # generation split as report.png draws it
        cost_line(report),  # a price applied to what ran, or no figure at all
        *quality_summary_lines(report),  # eval: accuracy beside the cost
        *reasoning_lines(report),  # model.reasoning: the thinking, apart
        *([summary_line(report["canary"])] if report.get("canary") else []),
        *_embedding_line(report.get("embedding")),
        f"output: {output}",
    ]


def _embedding_line(embedding: dict[str, Any] | None) -> list[str]:
    if not embedding:
        return []
    scaled = "normalized to length 1" if embedding["normalized"] else "not normalized"
    return [f"embeddings: {embedding['dimension']} dimensions (float32), {scaled}"]


def prefix_reuse_section(planned: dict[str, Any], tokens: dict[str, int]) -> dict[str, Any]:
    """What the plan predicted the prefix cache would serve, beside what it served."""
    return {
        "predicted": planned["predicted"],
        "measured": _ratio(tokens["prompt_cached"], tokens["prompt"]),
        "input_order_predicted": planned["input_order"],
        "block_size": planned["block_size"],
        "note": "share of prompt tokens served from the prefix cache; measured = "
        "tokens.prompt_cached / tokens.prompt",
        "shared_start_tokens": planned.get("shared_start_tokens"),
        "why_none": reuse_note(planned),  # a shared start shorter than one KV block
    }


def output_section(
    manifest: dict[str, Any], markers: dict[int, dict[str, Any]], failures: dict[int, str]
) -> dict[str, Any]:
    """The whole output's records and tokens, summed from its commit markers (a resumed
    job's shards may have been generated by several runs)."""
    ok = sum(m["records"]["ok"] for m in markers.values())
    failed = sum(m["records"]["failed"] for m in markers.values())
    tokens = {k: sum(m["tokens"][k] for m in markers.values()) for k in _TOKEN_KEYS}
    if any("reasoning" in m["tokens"] for m in markers.values()):  # of output: the thinking
        tokens["reasoning"] = sum(m["tokens"].get("reasoning", 0) for m in markers.values())
    count = manifest["shards"]["count"]
    return {
        "records": {
            "input": manifest["records"]["input"],
            "ok": ok,
            "rejected": manifest["records"]["rejected"],
            "failed": failed,
            "not_yet_run": manifest["records"]["runnable"] - ok - failed,
        },
        "tokens": {**tokens, "total": tokens["prompt"] + tokens["output"]},
        "shards": {
            "count": count,
            "committed": len(markers),
            "failed": {str(s): e for s, e in sorted(failures.items())},
            "complete": len(markers) == count,
        },
    }


_TOKEN_KEYS = ("prompt", "prompt_cached", "output")


def _shard_line(report: dict[str, Any]) -> list[str]:
    shards, run = report.get("shards"), report.get("this_run")
    if not shards or not run:
        return []
    line = f"shards: {shards['committed']:,} of {shards['count']:,} committed"
    line += f" ({len(run['shards_committed']):,} by this run)"
    if shards["failed"]:
        line += f"; failed: {', '.join(shards['failed'])}"
    return [line]


def _reuse_line(reuse: dict[str, Any] | None) -> list[str]:
    if not reuse:
        return []
    why = reuse.get("why_none")
    return [
        f"prefix reuse: {reuse['measured']:.1%} of prompt tokens from cache "
        f"(plan predicted {reuse['predicted']:.1%}; "
        f"input order {reuse['input_order_predicted']:.1%})",
        *([f"  why so little: {why}"] if why and reuse["measured"] < NONE_SHARE else []),
    ]
