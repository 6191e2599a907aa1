"""The capacity planner against published throughput figures, and its calibration.

For every figure in ``nightshift.capacity.published.FIGURES`` (model, GPUs, fixed input
and output lengths, measured output tokens/s, source), predicts the same run with the
planner's default efficiency factors and reports the error. Also fits the two factors
(share of data-sheet bandwidth, share of data-sheet FLOP/s) by least squares on the log
of predicted over measured, one pair for every row, to show where the defaults come from.
No GPU is needed: this is arithmetic.

    .venv/bin/python benchmarks/capacity_validation.py

Writes benchmarks/results/capacity_validation.json and the table in docs/capacity.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from nightshift.capacity.published import FIGURES, error, predict_figure
from nightshift.capacity.settings import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "capacity_validation.json"
DOC = ROOT / "docs" / "capacity.md"
GRID = [round(0.2 + 0.02 * i, 2) for i in range(41)]  # 0.20 .. 1.00


def fit() -> dict[str, float]:
    """The factor pair with the least sum of squared log errors over every figure."""
    best = None
    for bandwidth in GRID:
        for compute in GRID:
            logs = [
                math.log(predict_figure(r, bandwidth, compute).output_tokens_per_s)
                - math.log(r.output_tokens_per_s)
                for r in FIGURES
            ]
            score = sum(x * x for x in logs)
            if best is None or score < best[0]:
                best = (score, bandwidth, compute)
    return {"bandwidth": best[1], "compute": best[2], "sum_squared_log_error": best[0]}


def rows() -> list[dict]:
    out = []
    for r in FIGURES:
        p = predict_figure(r)
        out.append(
            {
                "model": r.model,
                "weights": r.weights,
                "kv_cache": r.kv_cache,
                "gpu": r.gpu,
                "gpus": r.gpus,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
                "engine": r.engine,
                "measured_output_tokens_per_s": r.output_tokens_per_s,
                "predicted_output_tokens_per_s": round(p.output_tokens_per_s, 1),
                "error": round(error(r, p), 4),
                "batch": p.batch.size,
                "batch_limited_by": p.batch.limited_by,
                "binding_limit": p.binding,
                "source": r.source,
            }
        )
    return out


def table(results: list[dict]) -> str:
    lines = [
        "| model | weights / KV | GPUs | in / out tokens | engine | measured out tok/s "
        "| predicted | error | batch | binds | source |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['weights']} / {r['kv_cache']} | {r['gpus']} x {r['gpu'].upper()} "
            f"| {r['input_tokens']:,} / {r['output_tokens']:,} | {r['engine']} "
            f"| {r['measured_output_tokens_per_s']:,.0f} "
            f"| {r['predicted_output_tokens_per_s']:,.0f} "
            f"| {r['error']:+.0%} | {r['batch']:,} | {r['binding_limit']} | [link]({r['source']}) |"
        )
    return "\n".join(lines)


def replace_block(doc: Path, name: str, text: str) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = doc.read_text()
    head, rest = body.split(start, 1)
    _, tail = rest.split(end, 1)
    doc.write_text(f"{head}{start}\n{text}\n{end}{tail}")


def main() -> None:
    results = rows()
    errors = [abs(r["error"]) for r in results]
    summary = {
        "efficiency_in_use": {"bandwidth": BANDWIDTH_EFFICIENCY, "compute": COMPUTE_EFFICIENCY},
        "least_squares_fit": fit(),
        "figures": len(results),
        "max_abs_error": max(errors),
        "mean_abs_error": sum(errors) / len(errors),
        "rows": results,
    }
    RESULT.write_text(json.dumps(summary, indent=2) + "\n")
    fitted = summary["least_squares_fit"]
    note = (
        f"\n\n{len(results)} figures; factors in use: {BANDWIDTH_EFFICIENCY:.0%} of bandwidth, "
        f"{COMPUTE_EFFICIENCY:.0%} of FLOP/s (least-squares fit: {fitted['bandwidth']:.0%}, "
        f"{fitted['compute']:.0%}); mean absolute error {summary['mean_abs_error']:.0%}, "
        f"largest {summary['max_abs_error']:.0%}."
    )
    replace_block(DOC, "validation", table(results) + note)
    print(table(results) + note)


if __name__ == "__main__":
    main()
