"""``task.kind: embed`` on the real engine: vLLM's pooling runner over the demo's real
model (SmolLM2-135M-Instruct), nightshift's vectors against ``LLM.embed``'s on the same
texts, with the same engine arguments."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.jobs.loading import validate_spec
from nightshift.running.engines import engine_arguments

from .inprocess import vllm_in_this_process
from .test_embed import embed_job

pytestmark = pytest.mark.engine

TEXTS = [
    "I was charged twice for my subscription this month.",
    "The app crashes every time I open the settings page.",
    "How do I reset my password? The reset e-mail never arrives.",
    "Do you ship to Norway, and how long does it take?",
    "Please cancel my order and refund the card I paid with.",
    "Two-factor codes stopped working after I changed phones.",
]


def test_embed_job_vectors_equal_llm_embed_on_the_same_texts(smollm2, tmp_path, write_spec):
    from vllm import LLM

    texts = TEXTS * 2 + TEXTS[:2]  # repeats: each distinct text embedded once
    data = embed_job({"chat": smollm2}, tmp_path, texts)
    data["model"] = {**data["model"], "max_model_len": 512}
    data["engine"] = {**data["engine"], "kv_cache_dtype": "auto"}
    result = CliRunner().invoke(app, ["jobs", "run", str(write_spec(data))])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    rows = pl.read_parquet(out / "results" / "*.parquet").sort("ticket_id")
    assert rows.height == len(texts) and rows["answered_from"].is_not_null().sum() == 8
    report = json.loads((out / "report.json").read_text())
    assert report["embedding"] == {"dimension": 576, "normalized": True}
    assert report["tokens"]["output"] == 0 and "576 dimensions" in result.output
    ours = np.array(rows["embedding"].to_list(), dtype=np.float64)
    with vllm_in_this_process():  # the reference: vLLM's own LLM, started in 3 s
        llm = LLM(**engine_arguments(validate_spec(data)))
    try:
        theirs = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    finally:
        llm.llm_engine.engine_core.shutdown()
    theirs = np.array(theirs, dtype=np.float64)
    cosine = (ours * theirs).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(theirs, axis=1)
    assert cosine.min() >= 0.999, cosine
    # real meaning: the two billing complaints sit closer than billing and a crash
    assert cosine_of(ours[0], ours[4]) > cosine_of(ours[0], ours[1])


def cosine_of(a, b) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
