"""Reasoning models (issue 42) on the fake engine: the thinking apart from the answer,
its budget, records that think until no token is left, and the spec's checks. The same
job on vLLM itself is tests/test_reasoning_engine.py."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from nightshift.demo.model import build_model
from nightshift.demo.reasoning import PARSER
from nightshift.demo.tickets import LABELS, corpus
from nightshift.errors import SpecError
from nightshift.io.outputs import JobOutput, committed_files
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.sampling import SamplingColumn
from nightshift.jobs.tasks import handler_for, label_encoder, sampling_for
from nightshift.pipelines.direct import run_job
from nightshift.scheduling.plan import load_encoder

from .conftest import spec_dict, write_records
from .durable import read_table


@pytest.fixture(scope="module")
def thinker(tmp_path_factory) -> Path:
    """The demo model's reasoning variant, as `nightshift demo init` builds it."""
    return build_model(tmp_path_factory.mktemp("reasoning") / "m", corpus(), reasoning=True)


def rows(kind: str, location: Path) -> pl.DataFrame:
    output = JobOutput(str(location))
    tables = [pl.from_arrow(read_table(output, u)) for u in committed_files(str(location), kind)]
    return pl.concat(tables) if tables else pl.DataFrame()


def reasoning_spec(model: Path, ticket_dir: Path, out: Path, **changes) -> dict:
    data = spec_dict(model, ticket_dir, out, task={"kind": "classify", "labels": list(LABELS)})
    data["model"] = {"path": str(model), "max_model_len": 2048, "reasoning": PARSER}
    data["run"] = {**data["run"], "engine": "fake"}
    data["sampling"] = {"max_tokens": 8, "reasoning_budget": 6}
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    return data


@pytest.mark.parametrize("calibrate", [True, False], ids=["scored", "guided"])
def test_classify_answers_are_labels_with_the_thinking_apart_and_within_budget(
    thinker, ticket_dir, tmp_path, calibrate
):
    data = reasoning_spec(thinker, ticket_dir, tmp_path / "out", task={"calibrate": calibrate})
    report = run_job(validate_spec(data), progress=False).report
    ok = rows("results", tmp_path / "out")
    assert ok.height == 120 and report["records"]["failed"] == 0
    assert set(ok["label"]) <= set(LABELS)
    assert (ok["text"] == ok["label"]).all()  # no thinking in front of the answer
    assert ok["reasoning"].str.starts_with("r").all()
    assert ok["reasoning_tokens"].max() <= 6 and ok["reasoning_tokens"].min() >= 4
    thought = int(ok["reasoning_tokens"].sum())
    assert report["tokens"]["reasoning"] == thought
    assert report["reasoning"]["tokens"] == thought
    assert report["reasoning"]["this_run"]["tokens_max_per_record"] <= 6
    # the thinking is output: paid for as output tokens
    assert report["tokens"]["output"] >= thought + 120
    assert (
        "| of which reasoning | " + f"{thought:,}" in (tmp_path / "out" / "report.md").read_text()
    )


def test_records_that_think_until_no_token_is_left_fail_as_reasoning_length(
    thinker, ticket_dir, tmp_path
):
    data = reasoning_spec(thinker, ticket_dir, tmp_path / "out")
    data["task"] = {"kind": "generate"}
    data["sampling"] = {"max_tokens": 20}  # no budget: thoughts of 4-32 tokens, some longer
    report = run_job(validate_spec(data), progress=False).report
    ok, failed = rows("results", tmp_path / "out"), rows("failed", tmp_path / "out")
    assert failed.height > 0 and ok.height > 0
    assert failed["error"].str.starts_with("reasoning_length:").all()
    assert (failed["text"] == "").all() and failed["reasoning"].str.len_chars().min() > 0
    assert (ok["text"].str.len_chars() > 0).all() and (ok["reasoning_tokens"] < 19).all()
    assert report["records"]["failed"] == failed.height
    assert report["reasoning"]["records_out_of_tokens"] == failed.height


def test_a_record_s_own_budget_overrides_the_job_s(thinker, tmp_path):
    budgets = [0, 2, None, 5]
    records = [
        {
            "ticket_id": f"t{i}",
            "subject": f"s{i}",
            "body": f"body {i}",
            "sampling": None if b is None else json.dumps({"reasoning_budget": b}),
        }
        for i, b in enumerate(budgets)
    ]
    path = write_records(tmp_path / "in" / "part.parquet", records)
    data = reasoning_spec(thinker, path, tmp_path / "out", input={"sampling_column": "sampling"})
    run_job(validate_spec(data), progress=False)  # scored labels, read after the thinking
    ok = rows("results", tmp_path / "out").sort("ticket_id")
    assert ok.height == 4 and set(ok["label"]) <= set(LABELS)
    assert ok["reasoning_tokens"].to_list()[0] == 0
    assert ok["reasoning_tokens"].to_list()[1] <= 2
    assert ok["reasoning_tokens"].to_list()[2] <= 6 and ok["reasoning_tokens"].to_list()[3] <= 5
    # a scored label's one step keeps its form, its thinking gets the record's budget
    spec = validate_spec(data)
    task = handler_for(spec.task, label_encoder(spec, load_encoder(spec)))
    job = sampling_for(spec, task)
    own = SamplingColumn(spec, job).sampling('{"reasoning_budget": 30, "max_tokens": 99}')
    assert own.reasoning_budget == 30 and own.constraint == job.constraint
    assert own.max_tokens == job.max_tokens - (6 + 1) + (30 + 1)


def test_a_model_without_think_tokens_is_refused_in_one_line(models, ticket_dir, tmp_path):
    data = reasoning_spec(models["chat"], ticket_dir, tmp_path / "out")
    with pytest.raises(SpecError) as refused:
        load_encoder(validate_spec(data))
    message = str(refused.value)
    assert message.startswith("model.reasoning:") and "'<think>'" in message
    assert "\n" not in message


def test_a_budget_needs_a_reasoning_model(models, ticket_dir, tmp_path):
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out")
    data["sampling"] = {"max_tokens": 8, "reasoning_budget": 4}
    with pytest.raises(Exception, match="model.reasoning"):
        validate_spec(data)


def test_a_budget_of_zero_renders_prompts_with_thinking_off(thinker, ticket_dir, tmp_path):
    data = reasoning_spec(thinker, ticket_dir, tmp_path / "out")
    on = load_encoder(validate_spec(data))
    data["sampling"]["reasoning_budget"] = 0
    off = load_encoder(validate_spec(data))
    assert on.template_frame("x")[1].endswith("<think>\n")
    assert off.template_frame("x")[1].endswith("</think>\n\n")


def test_a_repeated_record_copies_the_thinking_but_costs_no_thinking_tokens(thinker, tmp_path):
    same = {"subject": "Refund", "body": "I was charged twice."}
    records = [{"ticket_id": f"t{i}", **same} for i in range(3)]
    records.append({"ticket_id": "t9", "subject": "Login", "body": "Locked out."})
    path = write_records(tmp_path / "in" / "part.parquet", records)
    report = run_job(validate_spec(reasoning_spec(thinker, path, tmp_path / "out")), progress=False)
    ok = rows("results", tmp_path / "out").sort("ticket_id")
    copies = ok.filter(ok["answered_from"].is_not_null())
    assert copies.height == 2 and (copies["reasoning_tokens"] == 0).all()
    assert (copies["reasoning"] == ok["reasoning"][0]).all()  # the answer's thinking, copied
    assert report.report["tokens"]["reasoning"] == ok["reasoning_tokens"].sum() > 0


def test_an_answer_from_the_response_cache_keeps_its_thinking_apart(thinker, tmp_path):
    records = [{"ticket_id": f"t{i}", "subject": f"s{i}", "body": f"b{i}"} for i in range(6)]
    path = write_records(tmp_path / "in" / "part.parquet", records)
    data = reasoning_spec(thinker, path, tmp_path / "first", cache={"path": str(tmp_path / "c")})
    data["task"], data["sampling"] = {"kind": "generate"}, {"max_tokens": 20}  # some run out
    run_job(validate_spec(data), progress=False)
    again = run_job(
        validate_spec({**data, "output": {"path": str(tmp_path / "again")}}), progress=False
    )
    assert again.report["response_cache"]["hits"] == 6
    for kind in ("results", "failed"):
        first, cached = rows(kind, tmp_path / "first"), rows(kind, tmp_path / "again")
        columns = ["ticket_id", "text", "reasoning", "reasoning_tokens"]
        assert (
            first.select(columns).sort("ticket_id").equals(cached.select(columns).sort("ticket_id"))
        )
    assert (
        rows("failed", tmp_path / "again").height
        == again.report["reasoning"]["records_out_of_tokens"]
    )


def test_the_planner_and_capacity_count_the_budget_as_output(thinker, ticket_dir, tmp_path):
    from nightshift.jobs.tasks import answer_budget
    from nightshift.scheduling.capacity import output_estimate

    data = reasoning_spec(thinker, ticket_dir, tmp_path / "out")
    data["task"], data["sampling"] = (
        {"kind": "generate"},
        {"max_tokens": 40, "reasoning_budget": 100},
    )
    spec = validate_spec(data)
    assert answer_budget(spec) == 40 + 100 + 1  # the answer, the thinking, its closing marker
    tokens, why = output_estimate(spec, None)
    assert tokens == 141 and "reasoning_budget" in why
    data["model"]["max_model_len"] = 141  # no room left for a prompt
    with pytest.raises(Exception, match="reasoning_budget"):
        validate_spec(data)


def test_an_unknown_parser_is_refused_in_one_line_with_the_names(thinker, ticket_dir, tmp_path):
    data = reasoning_spec(thinker, ticket_dir, tmp_path / "out")
    data["model"]["reasoning"] = "deepseek_r2"
    with pytest.raises(SpecError) as refused:
        load_encoder(validate_spec(data))
    message = str(refused.value)
    assert message.startswith("model.reasoning: 'deepseek_r2'") and "deepseek_r1" in message
    assert "\n" not in message


def test_thinking_without_an_answer_is_never_an_answer():
    from nightshift.engines.base import EngineResult
    from nightshift.errors import RecordError
    from nightshift.jobs.tasks import TaskHandler

    task = TaskHandler(constraint=None, columns={})
    for finish, kind in (("length", "reasoning_length"), ("stop", "no_answer")):
        result = EngineResult(1, "", finish, 10, 16, reasoning="r1 r2", reasoning_unfinished=True)
        with pytest.raises(RecordError) as failed:
            task.parse_result(result)
        assert failed.value.kind == kind and str(failed.value).startswith(f"{kind}:")


def test_an_embed_job_cannot_reason(models, tmp_path):
    from .test_embed import embed_job

    data = embed_job(models, tmp_path, ["a text"])
    data["model"] = {**data["model"], "reasoning": PARSER}
    with pytest.raises(Exception, match="embed job generates nothing to reason about"):
        validate_spec(data)
