"""``nightshift jobs plan``: what a job would do and cost, without starting an engine."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import OutputExistsError
from nightshift.io.outputs import JobOutput
from nightshift.jobs.fingerprint import plan_stamp
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget, label_encoder, label_warnings
from nightshift.scheduling.cachescope import sampled_output
from nightshift.scheduling.capacity import capacity_text, predict_plan, prepare
from nightshift.scheduling.dedup import distinct_records
from nightshift.scheduling.helpers import Helpers
from nightshift.scheduling.plan import build_plan, describe, load_encoder
from nightshift.scheduling.reuse import reuse_note


def _measured_throughput(spec: JobSpec) -> float | None:
    """Total tokens/s of the last real-engine run into the same output, if there is one."""
    last = JobOutput(spec.output.path).report()
    if not last or last.get("engine", {}).get("name") != "vllm":  # a fake run's speed means nothing
        return None
    return last.get("throughput", {}).get("total_tokens_per_s") or None


def plan_summary(
    spec: JobSpec,
    progress: bool = False,
    write: bool = False,
    gpu: dict | None = None,
    helpers: Callable[[PromptEncoder], AbstractContextManager[Helpers | None]] | None = None,
) -> dict[str, Any]:
    """The plan in numbers and a cost projection; ``write`` also writes the plan next to
    the output, as a run would before generating; ``gpu`` (the arguments of
    ``capacity.jobplan.prepare``) adds the capacity prediction; ``helpers`` lends the
    plan processes for the encoder (``scheduling.helpers``: the same plan, sooner)."""
    planner = prepare(spec, **gpu) if gpu else None  # fails before the input is read
    encoder = load_encoder(spec)
    with helpers(encoder) if helpers else contextlib.nullcontext() as lent:
        plan = build_plan(spec, encoder, progress, helpers=lent)
    summary = describe(plan, spec)
    summary["warnings"] = label_warnings(spec, label_encoder(spec, encoder))
    if write:
        output = JobOutput(spec.output.path)
        output.refuse_foreign()  # others' files: never write a plan (or rejects) among them
        if output.report() or output.shards.committed():
            raise OutputExistsError(
                f"output.path: {spec.output.path} holds a run; writing a plan there would "
                "replace its plan under it; choose another output.path"
            )
        output.plans.unwrite()  # a plan written here before (nothing ran it): replaced
        summary["written_to"] = output.plans.write(
            plan, {**summary, **plan_stamp(spec), **encoder.identity().as_plan()}
        )
    # Only the distinct work goes to the engine (scheduling.dedup); output lengths come
    # from a previous run or the response cache where they have them.
    distinct = distinct_records(plan.records)
    sampled = sampled_output(spec)
    summary["projection"] = _projection(spec, *_engine_tokens(spec, distinct, sampled))
    if planner:
        if sampled and planner.output_source.startswith(("classify", "sampling")):
            planner = replace(planner, output_per_record=sampled[0], output_source=sampled[1])
        summary["capacity"] = predict_plan(planner, distinct, plan.prefix_reuse)
    return summary


def _engine_tokens(spec: JobSpec, distinct, sampled: tuple[float, str] | None):
    """Prompt plus output tokens the engine will see, and where the output figure is from."""
    prompt = int(distinct["tokens"].sum() or 0)
    if sampled is None:
        return prompt + distinct.height * answer_budget(spec), None
    return prompt + int(distinct.height * sampled[0]), sampled[1]


def _projection(spec: JobSpec, tokens: int, output_source: str | None = None) -> dict[str, Any]:
    tps, source = spec.cost.expected_tokens_per_s, "cost.expected_tokens_per_s"
    if tps is None:
        tps, source = _measured_throughput(spec), "last run's report.json"
    if not tps:
        return {"note": "set cost.expected_tokens_per_s (or run once) to project time and cost"}
    hours = tokens / tps / 3600
    return {
        "tokens_per_s": tps,
        "throughput_source": source,
        "generate_hours": hours,
        "usd": hours * spec.cost.usd_per_gpu_hour * spec.cost.gpus,
        "note": (
            f"output tokens per record from {output_source}"
            if output_source
            else "output tokens counted at sampling.max_tokens per record (an upper bound)"
        )
        + "; repeats of another record's prompt not counted; engine start-up not included",
    }


def summary_text(summary: dict[str, Any]) -> str:
    r, t, p = summary["records"], summary["tokens"], summary["projection"]
    shards, reuse = summary["shards"], summary["prefix_reuse"]
    lines = [
        f"{summary['job']}: {r['input']:,} records, {r['runnable']:,} runnable, "
        f"{r['rejected']:,} rejected ({r['over_length']:,} over length)",
        f"prompt tokens: {t['prompt']:,} (longest {t['prompt_max']:,}; "
        f"{t['counted_exactly_records']:,} records counted exactly, the rest estimated); "
        f"output tokens at most {t['output_at_most']:,}",
    ]
    lines += [f"  rejected: {n:,} x {reason}" for reason, n in summary["rejects_by_kind"].items()]
    lines.append(_repeats_line(summary.get("repeats") or {}))
    lines += [
        f"shards: {shards['count']:,} (largest {shards['records_max']:,} records, "
        f"{shards['prompt_tokens_max']:,} prompt tokens)",
        f"prefix reuse (share of prompt tokens served from cache, {reuse['block_size']}-token "
        f"blocks): planned order {reuse['predicted']:.1%}, input order {reuse['input_order']:.1%}",
        *(f"  why so little: {why}" for why in [reuse_note(reuse)] if why),
    ]
    if "usd" in p:
        lines.append(
            f"projected: {p['generate_hours'] * 3600:,.0f}s generating at "
            f"{p['tokens_per_s']:,.0f} tokens/s ({p['throughput_source']}), ${p['usd']:.4f}"
        )
    else:
        lines.append(f"projected cost: unknown; {p['note']}")
    lines += capacity_text(summary["capacity"]) if "capacity" in summary else []
    if "written_to" in summary:
        lines.append(f"plan written to {summary['written_to']}")
    lines += [f"warning: {w}" for w in summary.get("warnings", [])]
    return "\n".join(lines)


def _repeats_line(repeats: dict[str, int]) -> str:
    """Records whose prompt repeats another's (scheduling.dedup): answered from it."""
    copies = repeats.get("copies", 0)
    if not copies:
        return "repeated prompts: none (every runnable record is sent to the engine)"
    return (
        f"repeated prompts: {copies:,} record(s) repeat an earlier record's prompt and get "
        f"its answer, not sent ({repeats.get('prompt_tokens_not_sent', 0):,} prompt tokens saved)"
    )
