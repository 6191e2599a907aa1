"""The seeds' figures, predicted by the capacity planner.

The course notes in shared/seeds/ give, for one H100 serving an 8B model: a decode pass
of 6.80 ms with one conversation in it, 7.89 ms with four and 24.6 ms with fifty; an
8,192-token prompt read in 0.24 s and 256 tokens written in 1.73 s; weights crossing the
memory bus in 4.48 ms; one request using 0.34% of the arithmetic. 4.48 ms is exactly the
bf16 weights of a Llama-3-8B shape (all but the input embedding, 15.0 GB) at the H100's
3.35 TB/s, so that shape is used here, bf16 weights and KV cache, one H100, the
planner's default efficiency factors, and a conversation of the 8,192-token prompt plus
half of its 256-token reply (8,320 tokens) in the cache.

    .venv/bin/python benchmarks/capacity_seeds.py

Writes benchmarks/results/capacity_seeds.json and the table in docs/capacity.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from capacity_validation import replace_block

from nightshift.capacity.gpus import GPUS
from nightshift.capacity.published import LLAMA_3_8B
from nightshift.capacity.roofline import decode_pass, hardware, prefill_pass
from nightshift.capacity.settings import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY
from nightshift.capacity.shape import model_shape

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "capacity_seeds.json"
DOC = ROOT / "docs" / "capacity.md"
PROMPT, REPLY = 8192, 256


def figures() -> list[dict]:
    shape = model_shape(LLAMA_3_8B)
    gpu = GPUS["h100"]
    hw = hardware("h100", gpu, 1, shape.weight_bytes, BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY)
    kv = shape.kv_bytes_per_token(2)
    context = PROMPT + REPLY / 2
    rows = []
    for n, seed in ((1, 6.80), (4, 7.89), (50, 24.6)):
        p = decode_pass(shape, hw, n, context, kv)
        rows.append((f"decode pass, {n} conversation(s), ms", seed, p.seconds * 1e3, p.limit))
    read = prefill_pass(shape, hw, PROMPT, PROMPT * PROMPT / 2, kv)
    rows.append((f"read a {PROMPT:,}-token prompt, s", 0.24, read.seconds, read.limit))
    write = sum(decode_pass(shape, hw, 1, PROMPT + i, kv).seconds for i in range(REPLY))
    rows.append((f"write {REPLY} tokens, s", 1.73, write, "memory bandwidth"))
    weights_ms = shape.weights_read_per_pass(1) / (gpu.bandwidth_gbs * 1e9) * 1e3
    rows.append(("weights cross the bus at the data sheet's bandwidth, ms", 4.48, weights_ms, ""))
    rows.append(
        (
            "the same at the planner's bandwidth share, ms",
            4.48,
            weights_ms / BANDWIDTH_EFFICIENCY,
            "",
        )
    )
    one = decode_pass(shape, hw, 1, context, kv)
    used = one.flops / one.seconds / (gpu.bf16_tflops * 1e12) * 100
    rows.append(("arithmetic one request uses, % of the H100", 0.34, used, ""))
    return [
        {"figure": f, "seeds": s, "planner": round(p, 4), "ratio": round(p / s, 3), "limit": lim}
        for f, s, p, lim in rows
    ]


def table(rows: list[dict]) -> str:
    lines = [
        "| figure | seeds | planner | planner / seeds | limit |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['figure']} | {r['seeds']:g} | {r['planner']:.3g} | {r['ratio']:.2f} "
            f"| {r['limit']} |"
        )
    return "\n".join(lines)


def main() -> None:
    rows = figures()
    RESULT.write_text(
        json.dumps({"model": "Llama-3-8B shape, bf16", "gpu": "h100", "rows": rows}, indent=2)
        + "\n"
    )
    replace_block(DOC, "seeds", table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
