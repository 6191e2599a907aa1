"""One OpenAI batch file through vLLM's ``run_batch`` and through ``nightshift batch run``.

The file (written by ``batch_workload``, deterministic) holds N ``/v1/chat/completions``
requests for the demo model: each has one of S long shared system texts (the records of
each system text interleaved at random through the file, so prefix order matters) and a
distinct user text (a demo ticket); a share of them ask for a JSON schema through
``response_format``, and ``max_tokens`` is small. Both sides are the commands users run,
each timed end to end as a subprocess (engine start-up included), with the same engine
settings: dtype, eager mode, context length, batch limits, KV cache size and dtype,
prefix caching on, guided-decoding backend. Sides alternate (A B, B A, ...) and each rep
starts from nothing (outputs and ``OUTPUT.nightshift/`` deleted).

Per run: wall seconds, requests ok and failed, prompt, cached
(``usage.prompt_tokens_details.cached_tokens``) and completion tokens summed over the
output lines, JSON-schema answers that parse; for nightshift also its ``report.json``
token counts. The results file holds every run, the medians per side and their ratios.

    .venv/bin/python benchmarks/batch_vs_runbatch.py [--requests 2000] [--reps 2] \\
        [--systems 8] [--blocks 48] [--out benchmarks/results/batch_vs_runbatch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batch_workload import (
    SCHEMA,
    build_model,
    optimum_cached,
    read_lines,
    write_input,
)
from sides import alternated

ROOT = Path(__file__).resolve().parents[1]
# run_batch's log: the engine is up and the file is being read
READY_MARK = "Reading batch from"
SIDES = ("run_batch", "nightshift")
ENGINE_KEYS = ("kv_cache_dtype", "kv_cache_tokens", "block_size", "prefix_caching", "settings")


def engine_settings(args) -> dict:
    """The one set of engine settings both sides get."""
    return {
        "dtype": args.dtype,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "kv_cache_dtype": args.kv_cache_dtype,
        "cpu_kv_cache_gib": args.kv_gib,
        "num_gpu_blocks_override": args.blocks,
        "enable_prefix_caching": True,
        "enforce_eager": True,
        "seed": 0,
        "structured_outputs": {"backend": "xgrammar", "disable_any_whitespace": True},
    }


def run_batch_command(s: dict, model: Path, inp: Path, out: Path) -> list[str]:
    values = {
        "--model": model,
        "--served-model-name": model.name,
        "--dtype": s["dtype"],
        "--max-model-len": s["max_model_len"],
        "--max-num-seqs": s["max_num_seqs"],
        "--max-num-batched-tokens": s["max_num_batched_tokens"],
        "--kv-cache-dtype": s["kv_cache_dtype"],
        "--seed": s["seed"],
        # nightshift's engine fixes these (engines.engine_arguments): compact guided JSON
        "--structured-outputs-config": json.dumps(s["structured_outputs"]),
    }
    if s["num_gpu_blocks_override"]:
        values["--num-gpu-blocks-override"] = s["num_gpu_blocks_override"]
    flags = [str(x) for pair in values.items() for x in pair]
    flags += ["--enable-prefix-caching", "--enforce-eager"]
    flags.append("--enable-prompt-tokens-details")  # usage.prompt_tokens_details.cached_tokens
    module = "vllm.entrypoints.openai.run_batch"
    return [sys.executable, "-m", module, "-i", str(inp), "-o", str(out), *flags]


def nightshift_command(s: dict, model: Path, inp: Path, out: Path, errors: Path) -> list[str]:
    keys = {
        "model.max_model_len": s["max_model_len"],
        "model.dtype": s["dtype"],
        "engine.max_num_seqs": s["max_num_seqs"],
        "engine.max_num_batched_tokens": s["max_num_batched_tokens"],
        "engine.kv_cache_dtype": s["kv_cache_dtype"],
        "engine.cpu_kv_cache_gib": s["cpu_kv_cache_gib"],
        "engine.enable_prefix_caching": "true",
        "engine.extra.enforce_eager": "true",
    }
    if s["num_gpu_blocks_override"]:
        keys["engine.extra.num_gpu_blocks_override"] = s["num_gpu_blocks_override"]
    sets = [x for k, v in keys.items() for x in ("--set", f"{k}={v}")]
    cli = [sys.executable, "-m", "nightshift.cli", "batch", "run", str(inp), str(out)]
    # the name every request gives (as run_batch's --served-model-name); errors apart
    flags = ["--model", str(model), "--served-model-name", model.name, "--errors", str(errors)]
    return [*cli, *flags, "--format", "openai", *sets]


def timed(cmd: list[str], env: dict, log: Path) -> tuple[float, int, float | None]:
    """Run ``cmd`` (output to ``log``): wall seconds, exit code, when READY_MARK showed."""
    ready, started = None, time.perf_counter()
    with (
        log.open("w") as sink,
        subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc,
    ):
        for line in proc.stdout:
            sink.write(line)
            if ready is None and READY_MARK in line:
                ready = time.perf_counter() - started
    return time.perf_counter() - started, proc.returncode, ready


def answered(line: dict) -> bool:
    response = line.get("response") or {}
    return (
        not line.get("error") and response.get("status_code", 200) == 200 and response.get("body")
    )


def tally(lines: list[dict], schema_ids: set[str]) -> dict:
    """Requests ok and failed, token sums and parseable JSON-schema answers over ``lines``."""
    ok = [line for line in lines if answered(line)]
    usage = [line["response"]["body"].get("usage") or {} for line in ok]
    cached = [(u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0 for u in usage]
    valid = 0
    for line in (x for x in ok if x.get("custom_id") in schema_ids):
        try:
            answer = json.loads(line["response"]["body"]["choices"][0]["message"]["content"])
            valid += isinstance(answer, dict) and set(answer) == set(SCHEMA["required"])
        except (ValueError, KeyError, IndexError, TypeError):
            pass
    return {
        "requests_ok": len(ok),
        "requests_failed": len(lines) - len(ok),
        "distinct_custom_ids": len({line.get("custom_id") for line in lines}),
        "prompt_tokens": sum(u.get("prompt_tokens", 0) for u in usage),
        "cached_tokens": sum(cached),
        "completion_tokens": sum(u.get("completion_tokens", 0) for u in usage),
        "json_schema_answers_valid": valid,
        "first_error": next((line.get("error") for line in lines if not answered(line)), None),
    }


def report_figures(state: Path) -> dict:
    """Token counts and times from nightshift's report.json in its working state."""
    reports = sorted(state.rglob("report.json")) if state.exists() else []
    if not reports:
        return {"report": None}
    report = json.loads(reports[-1].read_text())
    tokens, t = report.get("tokens", {}), report.get("time_s", {})
    return {
        "report": str(reports[-1].relative_to(state)),
        "report_tokens": {k: tokens.get(k) for k in ("prompt", "prompt_cached", "output")},
        "report_records": report.get("records"),
        "report_time_s": {k: t.get(k) for k in ("engine_startup", "plan", "generate", "total")},
        "report_prefix_reuse": report.get("prefix_reuse"),
        "report_engine": {k: report.get("engine", {}).get(k) for k in ENGINE_KEYS},
    }


def agreement(work: Path) -> dict:
    """How many requests got the same answer text from both sides (the last rep's files)."""
    texts = {}
    for side in SIDES:
        texts[side] = {
            line["custom_id"]: line["response"]["body"]["choices"][0]["message"]["content"]
            for line in read_lines(work / f"{side}-out.jsonl")
            if answered(line)
        }
    a, b = texts.values()
    return {
        "answered_by_both": len(a.keys() & b.keys()),
        "same_text": sum(a[k] == b[k] for k in a.keys() & b.keys()),
    }


def run_side(side: str, work: Path, rep: int, model: Path, settings: dict, env: dict) -> dict:
    """One run of ``side`` from nothing: its command, wall time and output figures."""
    inp, out = work / "batch-in.jsonl", work / f"{side}-out.jsonl"
    errors, state = work / f"{side}-errors.jsonl", work / f"{side}-out.jsonl.nightshift"
    for stale in (out, errors):
        stale.unlink(missing_ok=True)
    shutil.rmtree(state, ignore_errors=True)
    if side == "run_batch":
        cmd = run_batch_command(settings, model, inp, out)
    else:
        cmd = nightshift_command(settings, model, inp, out, errors)
    log = work / f"{side}-rep{rep}.log"
    wall, code, ready = timed(cmd, env, log)
    schema_ids = {x["custom_id"] for x in read_lines(inp) if "response_format" in x["body"]}
    result = {"side": side, "rep": rep, "wall_s": round(wall, 2), "exit_code": code}
    if ready is not None:
        result["engine_ready_s"] = round(ready, 2)
    result.update(tally(read_lines(out) + read_lines(errors), schema_ids))
    result["error_file_lines"] = len(read_lines(errors))
    if side == "nightshift":
        result.update(report_figures(state))
    if code:
        result["log_tail"] = log.read_text()[-2000:]
        print(f"{side} rep {rep} exited {code}:\n{result['log_tail']}", file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}), file=sys.stderr)
    return result


def medians(runs: list[dict]) -> dict:
    out = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side and r["exit_code"] == 0]
        keys = ("wall_s", "requests_ok", "requests_failed", "prompt_tokens", "cached_tokens")
        keys += ("completion_tokens", "json_schema_answers_valid")
        out[side] = {k: statistics.median(r[k] for r in mine) for k in keys} if mine else None
    return out


def ratios(median: dict, optimum: int) -> dict:
    a, b = median["run_batch"], median["nightshift"]
    if not (a and b):
        return {"error": "a side failed every rep; see runs"}
    return {
        "wall_run_batch_over_nightshift": a["wall_s"] / b["wall_s"],
        "cached_tokens_nightshift_over_run_batch": b["cached_tokens"] / max(1, a["cached_tokens"]),
        "cached_share_run_batch": a["cached_tokens"] / max(1, a["prompt_tokens"]),
        "cached_share_nightshift": b["cached_tokens"] / max(1, b["prompt_tokens"]),
        "cached_of_optimum_run_batch": a["cached_tokens"] / max(1, optimum),
        "cached_of_optimum_nightshift": b["cached_tokens"] / max(1, optimum),
    }


NOTES = [
    "wall_s: the whole command as a subprocess, engine start-up and file writing included",
    "cached_tokens: usage.prompt_tokens_details.cached_tokens summed over the output lines "
    "(run_batch needs --enable-prompt-tokens-details for it)",
    "requests_failed: run_batch writes failures into the output file; nightshift into the "
    "errors file; both counted",
    "json_schema_answers_valid: answers of the response_format requests that parse as JSON "
    "with exactly the schema's keys",
    "optimum_cached_tokens: per request, the whole 128-token KV blocks its chat prompt "
    "shares with an earlier request (at most len - 1 tokens); no order caches more",
    "answers_agree: requests whose answer text is the same on both sides (temperature 0)",
    "timings are noisy on a shared 2-core machine; token counts are not",
]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--systems", type=int, default=8, help="distinct shared system texts")
    p.add_argument("--system-tokens", type=int, default=650)
    p.add_argument("--body-chars", type=int, default=600, help="user text cut to this")
    p.add_argument("--schema-share", type=float, default=0.2, help="share with a JSON schema")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--schema-max-tokens", type=int, default=48)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--kv-cache-dtype", default="auto", help="fp8 needs AVX-512 on CPU")
    p.add_argument("--dtype", default="float32", help="weights: fp32 is fastest on AVX2 CPUs")
    p.add_argument("--kv-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE")
    p.add_argument("--blocks", type=int, default=48, help="KV blocks (0: as the GiB allow)")
    p.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    p.add_argument("--model", type=Path, default=None, help="default: built in .cache")
    p.add_argument("--work", type=Path, default=None, help="keep inputs, outputs, logs here")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/batch_vs_runbatch.json")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    model = (args.model or build_model()).resolve()
    settings = engine_settings(args)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "PYTHONUNBUFFERED": "1"}
    runs = []
    with tempfile.TemporaryDirectory(prefix="batch_vs_runbatch-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        workload = write_input(work / "batch-in.jsonl", model, args)
        workload["optimum_cached_tokens"] = optimum_cached(work / "batch-in.jsonl", model)
        for turn, side in enumerate(alternated(list(args.sides), args.reps)):
            rep = turn // len(args.sides)
            runs.append(run_side(side, work, rep, model, settings, env))
        same = agreement(work) if len(args.sides) == 2 else None
        commands = {
            "run_batch": run_batch_command(settings, model, Path("IN"), Path("OUT")),
            "nightshift": nightshift_command(settings, model, Path("IN"), Path("OUT"), Path("ERR")),
        }
    median = medians(runs)
    figures = {
        "benchmark": "one OpenAI batch file: vLLM run_batch vs nightshift batch run",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "model": str(model.relative_to(ROOT)) if model.is_relative_to(ROOT) else str(model),
        "workload": {**workload, **{k: getattr(args, k) for k in ("systems", "system_tokens")}},
        "engine_settings": settings,
        "commands": {k: [str(x) for x in v] for k, v in commands.items()},
        "reps": args.reps,
        "medians": median,
        "ratios": ratios(median, workload["optimum_cached_tokens"]),
        "answers_agree": same,
        "runs": runs,
        "notes": NOTES,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps({k: figures[k] for k in ("workload", "medians", "ratios")}, indent=2))


if __name__ == "__main__":
    main()
