"""Real answers from a real model: SmolLM2-135M-Instruct on vLLM, through the job path.

The tiny random demo model gives valid answers but never right ones, so a broken chat
template, a doubled BOS or a broken guided-decoding path would pass every other test.
These assert answers that are right. Few and short: one engine for the module.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.tasks import shared_first_tokens
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .inprocess import vllm_in_this_process

pytestmark = [pytest.mark.engine, pytest.mark.engine_in_process]

DEMO = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs/classify.yaml").read_text())
# Two of each label, so no constant answer (the model's leaning, uncorrected) passes.
OBVIOUS = [
    ("o1", "Double charge", "I was charged twice for my subscription this month.", "payment"),
    ("o2", "Refund", "Please refund my last invoice, the price was wrong.", "payment"),
    ("o3", "Error 500", "Uploading a file fails with error 500.", "defect"),
    ("o4", "Crash", "The app crashes every time I open the settings page.", "defect"),
    ("o5", "Password", "I forgot my password and cannot sign in.", "login"),
    ("o6", "Two-factor", "The two-factor code never arrives, so I cannot log in.", "login"),
    ("o7", "Office hours", "What are your opening hours in December?", "general"),
    ("o8", "Feedback", "Just wanted to say thanks, the new design looks nice.", "general"),
]


def _spec(model: Path, inputs: Path, out: Path, **sections) -> dict:
    spec = spec_dict(model, inputs, out, **sections)
    # float32 KV: the FP8 cache turns "error 500" into payment on this model (README)
    spec["engine"] = {**spec["engine"], "max_num_seqs": 8, "kv_cache_dtype": "auto"}
    return spec


@pytest.fixture(scope="module")
def engine(smollm2, tmp_path_factory):
    from nightshift.running.engines import start_vllm

    spec = validate_spec(_spec(smollm2, "unused", tmp_path_factory.mktemp("o")))
    with vllm_in_this_process():  # one engine for the module, started in 3 s
        engine = start_vllm(spec)
    yield engine
    engine.close()


def test_the_demo_labels_start_with_distinct_tokens_under_smollm2(smollm2):
    encoder = PromptEncoder.load(str(smollm2))
    encode = lambda text: encoder.encode_texts([text])[0]  # noqa: E731
    assert shared_first_tokens(DEMO["task"]["labels"], encode) == []
    assert shared_first_tokens(["billing", "bug", "account", "other"], encode) != []


def test_a_plain_question_gets_the_right_answer(smollm2, engine, tmp_path):
    inputs = write_records(
        tmp_path / "in" / "q.parquet", [{"id": "q1", "q": "What is the capital of France?"}]
    )
    spec = _spec(
        smollm2,
        inputs,
        tmp_path / "out",
        input={"path": str(inputs), "id_column": "id"},
        prompt={"template": "{q}"},
        task={"kind": "generate"},
        sampling={"max_tokens": 16, "temperature": 0.0},
    )
    run_job(validate_spec(spec), engine=engine, progress=False)
    [text] = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")["text"].to_list()
    assert "Paris" in text


def _labels(smollm2, engine, tmp_path, **task) -> dict[str, str]:
    rows = [{"ticket_id": i, "subject": s, "body": b, "true_label": t} for i, s, b, t in OBVIOUS]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    task = {**DEMO["task"], "calibration_records": len(OBVIOUS), **task}
    spec = _spec(smollm2, inputs, tmp_path / "out", prompt=DEMO["prompt"], task=task)
    run_job(validate_spec(spec), engine=engine, progress=False)
    results = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    return dict(zip(results["ticket_id"], results["label"], strict=True))


def test_calibrated_labels_beat_guided_choice_on_obvious_tickets(smollm2, engine, tmp_path):
    """Measured here: 5 of 8 scored and calibrated, 3 of 8 by guided choice (which gave
    payment to five, the model's first-token habit). A 135M model stays a weak
    classifier (README: the demo's accuracy), so the bar is a majority and the gain."""
    calibrated = _labels(smollm2, engine, tmp_path / "c")
    guided = _labels(smollm2, engine, tmp_path / "g", calibrate=False)
    right = {
        name: sum(answers[i] == t for i, _, _, t in OBVIOUS)
        for name, answers in (("calibrated", calibrated), ("guided", guided))
    }
    assert right["calibrated"] >= 5 and right["calibrated"] > right["guided"], (
        right,
        calibrated,
        guided,
    )
