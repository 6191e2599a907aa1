"""Classify by scored, calibrated labels: the model's leaning measured on a sample of the
job's records and taken out, once per job (plan/calibration.json), on the fake engine."""

from __future__ import annotations

import json
import math

import polars as pl
import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.engines.base import EngineRequest
from nightshift.engines.fake import FakeEngine
from nightshift.errors import RecordError
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.tasks import LabelScoring, handler_for, label_encoder, sampling_for
from nightshift.running.calibration import calibration_of, measure

from .conftest import spec_dict, write_records

runner = CliRunner()
LABELS = ["billing", "bug", "account", "other"]
FAKE = ["--set", "run.engine=fake"]  # a plan is made for the engine that runs it
SCORED = ["payment", "defect", "login", "general"]  # distinct first tokens, tiny model too


def classify_spec(**task):
    data = spec_dict("m", "in", "out", task={"kind": "classify", "labels": LABELS, **task})
    return validate_spec(data)


def encode_by_letter(text: str) -> list[int]:
    """A toy tokenizer: one id per character (so ``billing`` and ``bug`` share one)."""
    return [ord(c) for c in text]


def encode_by_word(text: str) -> list[int]:
    return [sum(ord(c) * 31**i for i, c in enumerate(text)) % 100_000]


class LeaningEngine(FakeEngine):
    """The fake engine with a model that leans: ``lean`` added to the first label's
    score on every prompt, whatever it says (the fake's scores flattened, as a real
    model's are over a few labels)."""

    def __init__(self, lean: float = 4.0) -> None:
        super().__init__()
        self.lean = lean

    def _one(self, request, sampling):
        result = super()._one(request, sampling)
        if result.scores is None:
            return result
        first, *rest = (s / 5 for s in result.scores)
        return type(result)(**{**vars(result), "scores": (first + self.lean, *rest)})


def test_labels_with_distinct_first_tokens_are_scored_and_answered_in_one_step():
    spec = classify_spec(labels=["payment", "defect", "login", "general"])
    handler = handler_for(spec.task, encode_by_word)
    assert handler.scoring is not None and handler.constraint is None
    sampling = sampling_for(spec, handler)
    assert sampling.max_tokens == 1 and sampling.score_tokens == handler.scoring.tokens


def test_labels_sharing_a_first_token_or_calibrate_off_keep_guided_choice():
    shared = handler_for(classify_spec().task, encode_by_letter)  # billing, bug: 'b'
    assert shared.scoring is None and shared.constraint.choice == tuple(LABELS)
    off = handler_for(classify_spec(calibrate=False).task, encode_by_word)
    assert off.scoring is None and sampling_for(classify_spec(), off).score_tokens == ()


def test_raw_prompts_score_labels_after_a_space():
    class Encoder:
        def encode_texts(self, texts):
            return [[len(t)] for t in texts]

    data = spec_dict("m", "in", "out")
    data["prompt"] = {"template": "Ticket: {body}\nCategory:", "chat_template": False}
    assert label_encoder(validate_spec(data), Encoder())("bug") == [4]  # " bug"
    data["prompt"]["template"] = "Ticket: {body}\nCategory: "
    assert label_encoder(validate_spec(data), Encoder())("bug") == [3]
    assert label_encoder(classify_spec(), Encoder())("bug") == [3]  # chat: no space


def test_parse_takes_the_likeliest_label_once_the_leaning_is_divided_out():
    scoring = LabelScoring(("a", "b"), (97, 98))
    handler = handler_for(
        validate_spec(
            spec_dict("m", "i", "o", task={"kind": "classify", "labels": ["a", "b"]})
        ).task,
        lambda text: [ord(text)],
    )
    assert handler.scoring == scoring
    assert handler.parse("x", "length", [-0.1, -2.0])["label"] == "a"
    # the model gives "a" e^3 times b's share on average: a small lead of a is no lead
    leaning = handler.calibrated([math.log(2 * 0.95), math.log(2 * 0.05)])
    parsed = leaning.parse("x", "length", [-0.1, -2.0])
    assert parsed["label"] == parsed["text"] == "b"
    assert 0.5 < parsed["confidence"] < 1
    with pytest.raises(RecordError, match="no score"):
        handler.parse("a", "stop", None)
    with pytest.raises(RecordError, match="probability of 0"):
        handler.parse("a", "stop", [-math.inf, -math.inf])


def test_measure_finds_the_leaning_and_the_calibrated_labels_spread_again():
    spec = classify_spec(labels=["payment", "defect", "login", "general"])
    handler = handler_for(spec.task, encode_by_word)
    engine = LeaningEngine(lean=1.5)
    prompts = [EngineRequest(k, [7, k, k * 3 % 11, 5]) for k in range(400)]
    sampling = sampling_for(spec, handler)

    def shares(h) -> list[float]:
        labels = [
            h.parse(r.text, r.finish_reason, r.scores)["label"]
            for r in engine.run(prompts, sampling)
        ]
        return [labels.count(label) / len(labels) for label in h.scoring.labels]

    assert shares(handler)[0] > 0.8  # uncorrected: the leaning wins nearly every record
    stored = measure(engine, prompts[:64], sampling, handler.scoring)
    assert stored["records"] == 64 and stored["mean_probability"][0] > 0.5
    calibrated = shares(handler.calibrated(stored["log_prior"]))
    assert all(0.1 < share < 0.45 for share in calibrated), calibrated


def test_nothing_measured_corrects_nothing():
    scoring = LabelScoring(("a", "b", "c"), (1, 2, 3))
    stored = calibration_of(scoring, [])
    assert stored["records"] == 0 and stored["log_prior"] == [0.0, 0.0, 0.0]


def _run(tmp_path, models, write_spec, *more, **sections):
    rows = [
        {"ticket_id": i, "subject": f"s{i % 3}", "body": f"ticket {i} on {i % 7}"}
        for i in range(90)
    ]
    input_path = write_records(tmp_path / "in" / "t.parquet", rows)
    labels = {"kind": "classify", "labels": SCORED}
    spec = write_spec(
        spec_dict(models["chat"], input_path, tmp_path / "out", task=labels, **sections)
    )
    return spec


def test_a_run_measures_once_keeps_the_measure_and_labels_every_row_by_it(
    models, tmp_path, write_spec
):
    out = tmp_path / "out"
    spec = _run(tmp_path, models, write_spec, plan={"shard_records": 30})
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    stored = json.loads((out / "plan" / "calibration.json").read_text())
    assert stored["labels"] == SCORED
    assert stored["records"] == 32  # task.calibration_records, spread over the 3 shards
    report = json.loads((out / "report.json").read_text())
    assert report["calibration"]["records"] == 32
    rows = pl.read_parquet(out / "results" / "*.parquet")
    assert rows.height == 90 and rows["label"].is_in(stored["labels"]).all()
    assert ((rows["confidence"] > 0) & (rows["confidence"] <= 1)).all()
    assert (rows["text"] == rows["label"]).all()
    assert (rows["finish_reason"] == "stop").all()  # one step, yet the label is whole


def test_a_stored_measure_is_taken_up_not_measured_again(models, tmp_path, write_spec):
    out = tmp_path / "out"
    spec = _run(tmp_path, models, write_spec)
    planned = runner.invoke(app, ["jobs", "plan", str(spec), "--write", *FAKE])
    assert planned.exit_code == 0, planned.output
    # a measure that says the model leans away from "general" by far: every row is that
    lean = {
        "labels": SCORED,
        "records": 5,
        "mean_probability": [0.33, 0.33, 0.33, 0.01],
        "log_prior": [20.0, 20.0, 20.0, -20.0],
    }
    (out / "plan" / "calibration.json").write_text(json.dumps(lean))
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    rows = pl.read_parquet(out / "results" / "*.parquet")
    assert rows.height == 90 and (rows["label"] == "general").all()
    assert json.loads((out / "report.json").read_text())["calibration"]["records"] == 5


def test_an_output_planned_before_scoring_keeps_guided_choice(models, tmp_path, write_spec):
    """A plan.json without labels_by (older nightshift) was answered by guided choice:
    resuming it goes on so, and one output never mixes two ways of labelling."""
    out = tmp_path / "out"
    spec = _run(tmp_path, models, write_spec)
    assert runner.invoke(app, ["jobs", "plan", str(spec), "--write", *FAKE]).exit_code == 0
    manifest = json.loads((out / "plan" / "plan.json").read_text())
    assert manifest.pop("labels_by") == "score"
    (out / "plan" / "plan.json").write_text(json.dumps(manifest))
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    rows = pl.read_parquet(out / "results" / "*.parquet")
    assert rows.height == 90 and rows["confidence"].is_null().all()
    assert not (out / "plan" / "calibration.json").exists()
    assert "calibration" not in json.loads((out / "report.json").read_text())


def _adapter_job(models, tmp_path, write_spec, **sections):
    """90 records: a third under adapter a, a third under b, a third on the base model."""
    from nightshift.demo.adapters import build_lora_adapter

    base = models["chat"]
    adapters = {n: str(build_lora_adapter(base, tmp_path / f"lora-{n}", seed=i))
                for i, n in enumerate(["a", "b"])}  # fmt: skip
    rows = [
        {"ticket_id": i, "subject": f"s{i % 3}", "body": f"ticket {i} on {i % 7}",
         "lora": ["a", "b", None][i % 3], "own": json.dumps({"temperature": 0.5 + i % 2})}
        for i in range(90)
    ]  # fmt: skip
    input_path = write_records(tmp_path / "in" / "t.parquet", rows)
    labels = {"kind": "classify", "labels": SCORED}
    data = spec_dict(base, input_path, tmp_path / "out", task=labels, **sections)
    data["model"] = {**data["model"], "adapters": adapters}
    data["input"] = {**data["input"], "adapter_column": "lora", "keep_columns": ["lora"]}
    return write_spec(data)


def test_each_adapter_is_calibrated_on_its_own_records_under_it(models, tmp_path, write_spec):
    out = tmp_path / "out"
    spec = _adapter_job(models, tmp_path, write_spec, plan={"shard_records": 30})
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    stored = json.loads((out / "plan" / "calibration.json").read_text())
    each = {e["adapter"]: e for e in stored["adapters"]}
    assert set(each) == {"a", "b", None}
    assert all(e["records"] == 30 for e in each.values())  # all 30 of each: under 32
    leanings = {tuple(e["mean_probability"]) for e in each.values()}
    assert len(leanings) == 3  # each adapter leans its own way, the base model its own
    report = json.loads((out / "report.json").read_text())["calibration"]
    assert [e["adapter"] for e in report["adapters"]] == ["a", "b", None]


def test_each_adapters_records_are_labelled_by_its_own_measure(models, tmp_path, write_spec):
    out = tmp_path / "out"
    spec = _adapter_job(models, tmp_path, write_spec)
    assert runner.invoke(app, ["jobs", "plan", str(spec), "--write", *FAKE]).exit_code == 0
    # adapter a leans away from "general" by far; the base model and b lean nowhere
    none = {"records": 5, "mean_probability": [0.25] * 4, "log_prior": [0.0] * 4}
    lean = {"records": 5, "mean_probability": [0.33, 0.33, 0.33, 0.01],
            "log_prior": [20.0, 20.0, 20.0, -20.0]}  # fmt: skip
    stored = {"labels": SCORED, **none, "adapters": [
        {"adapter": "a", **lean}, {"adapter": "b", **none}, {"adapter": None, **none}]}  # fmt: skip
    (out / "plan" / "calibration.json").write_text(json.dumps(stored))
    result = runner.invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    rows = pl.read_parquet(out / "results" / "*.parquet")
    assert rows.height == 90
    assert (rows.filter(pl.col("lora") == "a")["label"] == "general").all()
    others = rows.filter(pl.col("lora").is_null() | (pl.col("lora") == "b"))
    assert others["label"].n_unique() > 1


def test_the_sample_runs_as_the_run_sends_each_record(models, tmp_path, write_spec):
    """Calibration requests carry each record's adapter and its own sampling (over the
    scoring step); a scored job with input.sampling_column answers every record."""
    from nightshift.io.outputs import JobOutput
    from nightshift.jobs.loading import load_spec
    from nightshift.running.calibration import sample_requests
    from nightshift.scheduling.plan import load_encoder

    out = tmp_path / "out"
    data = yaml.safe_load(_adapter_job(models, tmp_path, write_spec).read_text())
    data["input"]["sampling_column"] = "own"
    spec_file = write_spec(data)
    result = runner.invoke(app, ["jobs", "run", str(spec_file), "--set", "run.engine=fake", "-q"])
    assert result.exit_code == 0, result.output
    assert "90 ok, 0 rejected, 0 failed" in result.output  # each record's scores came back
    spec = load_spec(spec_file)
    plans = JobOutput(str(out)).plans
    handler_sampling = sampling_for(spec, handler_for(spec.task, lambda t: [ord(t[0])]))
    requests = sample_requests(
        spec, plans, plans.manifest(), load_encoder(spec), iter(range(10**6)), handler_sampling
    )
    assert {r.adapter for r in requests} == {"a", "b", None}
    assert {r.sampling.temperature for r in requests} == {0.5, 1.5}
    assert all(r.sampling.score_tokens and r.sampling.max_tokens == 1 for r in requests)


def test_an_adapter_whose_few_records_fill_one_shard_of_many_is_sampled(
    models, tmp_path, write_spec, monkeypatch
):
    """The plan walks adapter a's 40 records, then b's 5, then the base model's 45: with
    shards of 5, b's lie in a shard or two of 18, which one spacing over all shards (one
    shard an adapter here) passes over; each adapter's own shards are chosen instead."""
    from nightshift.demo.adapters import build_lora_adapter
    from nightshift.io.outputs import JobOutput
    from nightshift.jobs.loading import load_spec
    from nightshift.running import calibration
    from nightshift.scheduling.plan import load_encoder

    base = models["chat"]
    adapters = {n: str(build_lora_adapter(base, tmp_path / f"lora-{n}", seed=i))
                for i, n in enumerate(["a", "b"])}  # fmt: skip
    lora = ["a"] * 40 + ["b"] * 5 + [None] * 45
    rows = [{"ticket_id": i, "subject": f"s{i % 3}", "body": f"ticket {i} on {i % 7}",
             "lora": name} for i, name in enumerate(lora)]  # fmt: skip
    input_path = write_records(tmp_path / "in" / "t.parquet", rows)
    data = spec_dict(base, input_path, tmp_path / "out", task={"kind": "classify",
                     "labels": SCORED}, plan={"shard_records": 5})  # fmt: skip
    data["model"] = {**data["model"], "adapters": adapters}
    data["input"] = {**data["input"], "adapter_column": "lora"}
    spec_file = write_spec(data)
    plan = runner.invoke(app, ["jobs", "plan", str(spec_file), "--write", *FAKE])
    assert plan.exit_code == 0, plan.output
    spec, plans = load_spec(spec_file), JobOutput(str(tmp_path / "out")).plans
    manifest = plans.manifest()
    shards = manifest["shards"]["each"]
    monkeypatch.setattr(calibration, "SAMPLE_SHARDS", 1)
    spaced = calibration._evenly(shards, 3)  # one spacing, one shard an adapter
    spaced_names = set()
    for shard in spaced:
        table = pa.Table.from_batches(list(plans.shard_batches(shard["index"], 100)))
        spaced_names |= set(table.column("lora").to_pylist())
    assert len(shards) >= 18 and "b" not in spaced_names  # the case this guards against
    for shard in shards:  # plan.json lists each shard's adapters, as its file holds them
        table = pa.Table.from_batches(list(plans.shard_batches(shard["index"], 100)))
        assert shard["adapters"] == table.column("lora").unique().to_pylist()
    sampling = sampling_for(spec, handler_for(spec.task, lambda t: [ord(t[0])]))
    read, shard_batches = [], type(plans).shard_batches

    def counted(self, shard, rows, columns=None):  # which shards calibration reads
        read.append(shard)
        yield from shard_batches(self, shard, rows, columns)

    monkeypatch.setattr(type(plans), "shard_batches", counted)
    requests = calibration.sample_requests(
        spec, plans, manifest, load_encoder(spec), iter(range(10**6)), sampling
    )
    assert {r.adapter for r in requests} == {"a", "b", None}
    assert len(read) <= 3  # the shards sampled, not every shard for its adapters
    for shard in manifest["shards"]["each"]:  # a plan from before shards listed them
        del shard["adapters"]
    older = calibration.sample_requests(
        spec, plans, manifest, load_encoder(spec), iter(range(10**6)), sampling
    )
    assert [(r.adapter, r.token_ids) for r in older] == [(r.adapter, r.token_ids) for r in requests]
    assert len(read) > len(shards)  # each shard read for its adapters
    monkeypatch.setattr(calibration, "SAMPLE_SHARDS", 8)  # every shard of b's, and so
    requests = calibration.sample_requests(  # all 5 of its records (fewer than the count)
        spec, plans, manifest, load_encoder(spec), iter(range(10**6)), sampling
    )
    assert sum(r.adapter == "b" for r in requests) == 5


def test_the_sample_is_read_a_few_rows_at_a_time_and_spread_through_each_shard(
    models, tmp_path, write_spec, monkeypatch
):
    """Without adapters each chosen shard is read a batch at a time and only its evenly
    spaced records kept (a whole shard was 0.3 GiB of a run's peak at a million records):
    read 7 rows at a time, the sample is those records of each shard, in order."""
    from nightshift.io.outputs import JobOutput
    from nightshift.jobs.loading import load_spec
    from nightshift.running import calibration
    from nightshift.scheduling.plan import load_encoder
    from nightshift.scheduling.render import renderer_for, rows

    spec_file = _run(tmp_path, models, write_spec, plan={"shard_records": 30})
    plan = runner.invoke(app, ["jobs", "plan", str(spec_file), "--write", *FAKE])
    assert plan.exit_code == 0, plan.output
    spec, plans = load_spec(spec_file), JobOutput(str(tmp_path / "out")).plans
    manifest = plans.manifest()
    sampling = sampling_for(spec, handler_for(spec.task, lambda t: [ord(t[0])]))
    monkeypatch.setattr(calibration, "SAMPLE_READ_ROWS", 7)
    reads = []
    shard_batches = type(plans).shard_batches

    def watched(self, shard, rows):
        reads.append(rows)
        return shard_batches(self, shard, rows)

    monkeypatch.setattr(type(plans), "shard_batches", watched)
    requests = calibration.sample_requests(
        spec, plans, manifest, load_encoder(spec), iter(range(10**6)), sampling
    )
    shards = manifest["shards"]["each"]
    assert len(shards) == 3 and reads == [7, 7, 7]
    # each shard's records 0, 2.5, 5, ... of 30: 11 of each (32 over 3 shards), 32 in all
    expected = []
    for shard in shards:
        records = pl.concat([pl.from_arrow(b) for b in shard_batches(plans, shard["index"], 1000)])
        expected += records["ticket_id"].gather([int(i * 30 / 11) for i in range(11)]).to_list()
    encoder = load_encoder(spec)
    frame = pl.DataFrame({"ticket_id": expected[:32]}).join(
        pl.read_parquet(tmp_path / "in" / "t.parquet"), on="ticket_id", maintain_order="left"
    )
    want = encoder.encode_pieces(rows(renderer_for(spec, encoder).pieces(frame)))
    assert [r.token_ids for r in requests] == want
