"""Pipeline overhead: nightshift's run against bare ``LLM.generate`` on the same prompts.

Both sides use the same engine settings (from configs/classify.yaml), the same records,
in the same order (the plan nightshift wrote), as the same token ids, each on a fresh
engine. nightshift's side adds
what a user gets for it: chunked generation and writing, parsing, rejects and the report.

    .venv/bin/python benchmarks/overhead.py [--records 8000]

Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def subset(records: int, directory: Path) -> Path:
    table = ds.dataset(str(ROOT / "data/demo/tickets"), format="parquet").head(records)
    path = directory / "tickets.parquet"
    pq.write_table(table, path)
    return path


def bare_generate(spec, token_ids: list[list[int]]) -> dict:
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    from nightshift.engines.vllm_engine import VllmEngine, _sampling_params
    from nightshift.jobs.tasks import handler_for, sampling_for

    started = time.perf_counter()
    engine = VllmEngine.from_spec(spec)  # same arguments and FP8 fallback as a job
    llm: LLM = engine._llm
    ready = time.perf_counter()
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in token_ids]
    params = _sampling_params(sampling_for(spec, handler_for(spec.task)))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    done = time.perf_counter()
    engine.close()
    return {
        "engine_startup_s": ready - started,
        "generate_s": done - ready,
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=8000)
    args = parser.parse_args()

    from nightshift.io.objectstore import open_store
    from nightshift.io.planstore import PlanStore
    from nightshift.jobs.loading import load_spec
    from nightshift.jobs.runner import RequestFeed, load_encoder, run_job

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"input.path={subset(args.records, Path(tmp))}", f"output.path={tmp}/out"]
        spec = load_spec(ROOT / "configs/classify.yaml", overrides)
        report = run_job(spec, progress=False).report
        # The same prompts, in the order the run took them, from the plan it wrote.
        feed = RequestFeed(spec, PlanStore(open_store(f"{tmp}/out")), load_encoder(spec))
        shards = list(range(report["shards"]["count"]))
        token_ids = [r.token_ids for r in feed.requests(shards)]
        bare = bare_generate(spec, token_ids)

    ours = report["time_s"]["generate"]
    figures = {
        "benchmark": "pipeline overhead: nightshift run vs bare LLM.generate",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": 2},
        "records": args.records,
        "runnable_records": len(token_ids),
        "prompt_tokens": sum(map(len, token_ids)),
        "order": "nightshift's plan (prefix groups, longest first) on both sides",
        "chunk_records": spec.run.chunk_records,
        "kv_cache_dtype": report["engine"]["kv_cache_dtype"],
        "bare": bare,
        "nightshift": {
            "engine_startup_s": report["time_s"]["engine_startup"],
            "generate_s": ours,
            "output_tokens": report["tokens"]["output"],
            "plan_s": report["time_s"]["plan"],
        },
        "overhead_beyond_startup_pct": 100 * (ours - bare["generate_s"]) / bare["generate_s"],
    }
    out = ROOT / "benchmarks/results/overhead.json"
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
