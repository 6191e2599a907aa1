"""n-gram speculative decoding on an extract job whose answers copy the input.

An extract job on the demo's real model (SmolLM2-135M-Instruct): each ticket names an
order id, an e-mail address and an item, and the answer is those three copied into JSON,
so n-gram prompt lookup (``engine.extra.speculative_config``, the candidate ``jobs tune``
tries) has text to draft from. Runs ``nightshift jobs run`` (the command users run) per
side, sides alternating, the same engine settings on both (eager, fp32, KV cache in the
model's dtype) but the speculation:

* ``plain``: no speculation;
* ``ngram``: ``jobs tune``'s n-gram candidate (``tuning.candidates.NGRAM``).

Per run: generation seconds, tokens/s, output tokens, the draft tokens vLLM proposed and
accepted; then the speed-up (ngram over plain, per round) and whether every answer is
identical at temperature 0. Needs ``nightshift demo init`` first.

    .venv/bin/python benchmarks/ngram_extract.py [--records 64] [--reps 2] \\
        [--out benchmarks/results/ngram_extract.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import polars as pl
import yaml
from sides import alternated

from nightshift.tuning.candidates import NGRAM

ROOT = Path(__file__).resolve().parents[1]
SIDES = {"plain": [], "ngram": ["--set", f"engine.extra.speculative_config={json.dumps(NGRAM)}"]}
ITEMS = ["blue ceramic mug set", "walnut desk lamp", "wireless keyboard", "linen throw pillow"]
NAMES = ["maria.gonzalez", "t.okafor", "li.wei", "sam.berg", "nora.haddad", "ivan.petrov"]


def tickets(n: int) -> pl.DataFrame:
    rng = random.Random(7)
    rows = []
    for i in range(n):
        order = f"ORD-{rng.randrange(10000, 99999)}-{rng.choice('ABCDEFGHJK')}{rng.randrange(10)}"
        email, item = f"{rng.choice(NAMES)}@example.com", rng.choice(ITEMS)
        body = (
            f"Hello, my order {order} arrived yesterday but the {item} was broken in the box. "
            f"Please reply to {email} with what I should do next. Thanks!"
        )
        rows.append({"ticket_id": f"X{i:04d}", "body": body})
    return pl.DataFrame(rows)


def job_spec(inputs: Path) -> dict:
    fields = {"order_id": {"type": "string"}, "email": {"type": "string"}}
    fields["item"] = {"type": "string"}
    return {
        "name": "extract-order-fields",
        "input": {"path": str(inputs), "id_column": "ticket_id"},
        "prompt": {
            "system": "Copy the order id, the customer's e-mail address and the broken item "
            "from the message into JSON, exactly as written.",
            "template": "{body}",
        },
        "task": {
            "kind": "extract",
            "schema": {
                "type": "object",
                "properties": fields,
                "required": list(fields),
                "additionalProperties": False,
            },
        },
        "model": {"path": ".nightshift/smollm2-135m-instruct", "max_model_len": 2048},
        "engine": {"kv_cache_dtype": "auto", "extra": {"enforce_eager": True}},
        "sampling": {"max_tokens": 96, "temperature": 0.0},
        "run": {"canary": False},
        "output": {"path": "unused"},
        "cost": {"gpu": "h100", "gpus": 1, "usd_per_gpu_hour": 2.99},
    }


def run_side(side: str, spec: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(ROOT / ".venv/bin/nightshift"), "jobs", "run", str(spec), "-q"]
    cmd += [*SIDES[side], "--set", f"output.path={out}"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"side": side, "error": (done.stderr or done.stdout)[-600:]}
    report = json.loads((out / "report.json").read_text())
    counters = report["engine"]["counters"]
    generate = report["time_s"]["generate"]
    tokens = report["tokens"]
    drafted = counters.get("draft_tokens", 0)
    return {
        "side": side,
        "generate_s": round(generate, 2),
        "output_tokens": tokens["output"],
        "tokens_per_s": round((tokens["prompt"] + tokens["output"]) / generate, 1),
        "output_tokens_per_s": round(tokens["output"] / generate, 1),
        "draft_tokens": drafted,
        "draft_acceptance": round(counters.get("draft_tokens_accepted", 0) / drafted, 3)
        if drafted
        else None,
        "records_ok": report["records"]["ok"],
        "answers": answers(out),
    }


def answers(out: Path) -> dict:
    """Every record's answer text, those that failed to parse (cut off, bad JSON) too."""
    texts = {}
    for part in ("results", "failed"):
        files = list((out / part).glob("*.parquet"))
        if files:
            texts.update(pl.read_parquet(files).select("ticket_id", "text").iter_rows())
    return texts


def same_share(a: dict, b: dict) -> float:
    """The share of records whose answers are identical in two runs."""
    return round(sum(a.get(k) == v for k, v in b.items()) / max(len(b), 1), 4)


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    by_side = {s: [r for r in ok if r["side"] == s] for s in SIDES}
    rounds = list(zip(by_side["plain"], by_side["ngram"], strict=False))
    ratios = [n["output_tokens_per_s"] / p["output_tokens_per_s"] for p, n in rounds]
    # the floor: two runs of one side, which need not match either (batch composition)
    repeats = {s: same_share(r[0]["answers"], r[1]["answers"]) for s, r in by_side.items()}
    return {
        "speedup_output_tokens_per_s": [round(r, 3) for r in ratios],
        "answers_identical": [p["answers"] == n["answers"] for p, n in rounds],
        "same_answers_plain_vs_ngram": [same_share(p["answers"], n["answers"]) for p, n in rounds],
        "same_answers_between_repeats": repeats
        if all(len(r) > 1 for r in by_side.values())
        else None,
        "errors": [r for r in runs if "error" in r],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--out", default="benchmarks/results/ngram_extract.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ns-ngram-") as tmp:
        inputs = Path(tmp) / "tickets.parquet"
        tickets(args.records).write_parquet(inputs)
        spec = Path(tmp) / "extract.yaml"
        spec.write_text(yaml.safe_dump(job_spec(inputs), sort_keys=False))
        runs = [
            run_side(side, spec, Path(tmp) / f"out-{i}")
            for i, side in enumerate(alternated(list(SIDES), args.reps))
        ]
    summary = summarize(runs)
    sample = next((r["answers"] for r in runs if "answers" in r), {})
    result = {
        "benchmark": "ngram_extract",
        "machine": platform.processor() or platform.machine(),
        "records": args.records,
        "speculative_config": NGRAM,
        "runs": [{k: v for k, v in r.items() if k != "answers"} for r in runs],
        **summary,
        "sample_answers": dict(list(sample.items())[:3]),
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=2))


if __name__ == "__main__":
    main()
