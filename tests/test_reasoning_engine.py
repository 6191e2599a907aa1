"""Reasoning models on vLLM itself (issue 42), with one engine start for every path: the
demo's reasoning variant thinks (it never closes the thinking itself: the budget does),
and classify by guided choice, classify by scores and extract each constrain only the
answer after the thinking; without a budget every record runs out of tokens before it
answers and is counted as such."""

from __future__ import annotations

import json

import jsonschema
import pytest

from nightshift.demo.tickets import LABELS
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.running.engines import start_vllm

from .conftest import write_records
from .inprocess import vllm_in_this_process
from .test_reasoning import reasoning_spec, rows, thinker  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.engine, pytest.mark.engine_in_process]

BUDGET = 6
RECORDS = 12  # one engine start for every path: the start, not the records, is the cost
SCHEMA = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "high"]}, "needs_refund": {"type": "boolean"}},
    "required": ["priority", "needs_refund"],
    "additionalProperties": False,
}


def test_answers_after_the_thinking_are_labels_or_json_and_the_budget_holds(
    thinker,  # noqa: F811
    tmp_path,
):
    from nightshift.demo.tickets import tickets

    short = [{**t, "body": t["body"][:1500]} for t in tickets(RECORDS, seed=5)]
    path = write_records(tmp_path / "in" / "t.parquet", short)

    def spec(name: str, task: dict | None = None, **sampling):
        data = reasoning_spec(thinker, path, tmp_path / name, sampling=sampling)
        data["task"] = task or data["task"]
        return validate_spec({**data, "run": {"canary": False}})

    labels = {"kind": "classify", "labels": list(LABELS)}
    guided = spec("guided", {**labels, "calibrate": False}, reasoning_budget=BUDGET)
    with vllm_in_this_process():  # one engine for the four jobs, started in 3 s
        engine = start_vllm(guided)
    try:
        for job in (guided, spec("scored", labels, reasoning_budget=BUDGET)):
            report = run_job(job, engine=engine, progress=False).report
            ok = rows("results", job.output.path)
            assert ok.height == RECORDS and set(ok["label"]) <= set(LABELS)
            assert (ok["text"] == ok["label"]).all()  # no thinking in the answer
            assert (ok["reasoning_tokens"] > 0).all() and ok["reasoning_tokens"].max() <= BUDGET
            assert "</think>" not in "".join(ok["reasoning"])
            assert report["tokens"]["reasoning"] == ok["reasoning_tokens"].sum()
        task = {"kind": "extract", "schema": SCHEMA}
        extract = spec("extract", task, max_tokens=64, reasoning_budget=BUDGET)
        run_job(extract, engine=engine, progress=False)
        ok = rows("results", extract.output.path)
        assert ok.height == RECORDS and ok["reasoning_tokens"].max() <= BUDGET
        for answer in ok["json"]:
            jsonschema.validate(json.loads(answer), SCHEMA)
        # no budget: the thinking never ends, and no record is an (empty) answer
        unbounded = spec("unbounded", max_tokens=12, reasoning_budget=None)
        report = run_job(unbounded, engine=engine, progress=False).report
        failed = rows("failed", unbounded.output.path)
        assert report["records"]["ok"] == 0 and failed.height == RECORDS
        assert failed["error"].str.starts_with("reasoning_length:").all()
        assert report["reasoning"]["records_out_of_tokens"] == RECORDS
    finally:
        engine.close()
