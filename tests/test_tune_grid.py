"""``jobs tune`` measuring what the full job will do, on the fake engine: the grid of
``--try`` values, rounds sized for the batch limits (a candidate its round cannot show
is never chosen), agreement and accuracy with their Wilson intervals, flips both ways
against the reference, the choice only beyond the rounds' spread, and ``--check``."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.errors import SpecError
from nightshift.intervals import wilson
from nightshift.tuning.grid import grid_candidates
from nightshift.tuning.sizing import ROUND_FACTOR, Sizing, not_measurable, round_ids, size_rounds

from .conftest import spec_dict, write_records

LABELS = ["billing", "bug", "feature_request", "account", "other"]


def test_grid_runs_every_combination_of_the_try_values():
    found = grid_candidates(
        ["engine.max_num_seqs=16,64,256", "engine.max_num_batched_tokens=1024,8192"]
    )
    assert len(found) == 6
    pairs = {
        (c.sets["engine.max_num_seqs"], c.sets["engine.max_num_batched_tokens"]) for c in found
    }
    assert pairs == {(s, t) for s in (16, 64, 256) for t in (1024, 8192)}
    assert found[0].name == "max_num_seqs=16 max_num_batched_tokens=1024"
    with pytest.raises(SpecError, match="--grid"):
        grid_candidates([])
    with pytest.raises(SpecError, match="combinations"):
        grid_candidates(["a.b=" + ",".join(map(str, range(9))), "a.c=" + ",".join("abcdefghi")])


def test_rounds_are_sized_for_the_largest_batch_and_never_share_records():
    # 4,000 records of 100 tokens: max_num_seqs 256 needs rounds of 512 records
    sizing = size_rounds(4000, 400_000, [(16, 1024), (256, 8192)])
    assert sizing.per_round == ROUND_FACTOR * 256 and sizing.disjoint and sizing.rounds == 2
    # a budget of 65,536 tokens needs 2 x 65,536 / 100 records in a round
    assert size_rounds(10_000, 1_000_000, [(16, 65_536)]).per_round == 1311
    # a small job: at most half of it over all rounds, and what cannot bind is said
    small = size_rounds(400, 40_000, [(512, 8192)])
    assert small.per_round == 100 and small.needed == 400
    assert not_measurable(small, 64) and not_measurable(small, 50) is None
    order = pl.DataFrame({"record_id": [f"r{i:04d}" for i in range(4000)]})
    rounds = round_ids(order, sizing)
    assert [len(r) for r in rounds] == [512, 512] and not set(rounds[0]) & set(rounds[1])
    place = {r: i for i, r in enumerate(order["record_id"])}
    spots = sorted(place[i] for i in rounds[0])
    runs = 1 + sum(b != a + 1 for a, b in zip(spots, spots[1:], strict=False))
    assert runs == 4 and spots[-1] > 3000  # four runs of plan order, spread over the job
    whole = Sizing(50, 2, 50, 5000, 50, False)  # the whole job: every round, fresh engines
    assert round_ids(order.head(50), whole)[1] == round_ids(order.head(50), whole)[0]
    assert not_measurable(whole, 50) is None  # the sample is the job itself


def labelled_job(models, tmp_path, records: int) -> dict:
    rows = [
        {
            "ticket_id": f"t{i:03d}",
            "subject": f"s{i % 7}",
            "body": f"ticket {i} about {LABELS[i % 5]}",
            "true_label": LABELS[(i * 7) % 5],
        }
        for i in range(records)
    ]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    data = spec_dict(models["chat"], inputs, tmp_path / "out", eval={"label_column": "true_label"})
    data["engine"] = {**data["engine"], "max_num_seqs": 4, "kv_cache_dtype": "fp8"}
    return data


def test_tune_grid_on_rounds_with_intervals_flips_and_check(
    models, tmp_path, write_spec, monkeypatch
):
    # the fake's FP8 KV cache changes 40% of answers: the job (FP8) is shown to differ
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.4")
    data = labelled_job(models, tmp_path, records=80)
    args = ["jobs", "tune", str(write_spec(data)), "--set", "run.engine=fake", "--no-defaults"]
    args += ["--grid", "--try", "engine.max_num_seqs=2,8", "--try", "sampling.seed=1,2"]
    result = CliRunner().invoke(app, [*args, "--sample", "12", "--check"])
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out.tune"
    summary = json.loads((folder / "tune.json").read_text())
    entries = {e["name"]: e for e in summary["candidates"]}
    grid = [n for n in entries if n.startswith("max_num_seqs=")]
    assert sorted(grid) == sorted(
        f"max_num_seqs={s} seed={d}" for s in (2, 8) for d in (1, 2)
    )  # every pair, not each value alone
    assert summary["sample"] == {**summary["sample"], "per_round": 12, "rounds": 2, "records": 24}
    for e in entries.values():
        assert len(e["rounds_tokens_per_s"]) == 2 and e["spread"] is not None
    # the fake's batch is max_num_seqs up to 8: 8 x 2 > 12 records, so not measurable
    for name in grid:
        blind = "max_num_seqs=8" in name
        assert bool(entries[name].get("not_measurable")) == blind
        assert not blind or "not measurable on this sample" in entries[name]["not_measurable"]
    assert summary["chosen"]["name"] not in {n for n in grid if "max_num_seqs=8" in n}
    _check_intervals_and_flips(entries)
    # the sample's cost against the job's generation time predicted from its own rounds
    cost, job = summary["sample"]["cost"], entries["job"]
    predicted = job["rounds_wait_s"][0] + 80 / job["records_per_s"]
    assert cost["job_generate_s_predicted"] == pytest.approx(predicted, abs=0.01)
    assert cost["share_per_candidate"]["job"] == pytest.approx(
        job["generate_s"] / predicted, rel=0.01
    )
    # the job's answers differ from the reference beyond the bar: the reference is chosen
    chosen = summary["chosen"]
    assert chosen["name"] == "reference" and "differ" in chosen["why"]
    check = summary["check"]
    job_run, chosen_run = check["job"], check["chosen_run"]
    assert job_run["records_answered"] == chosen_run["records_answered"] == 80
    assert check["measured_gain"] == pytest.approx(
        chosen_run["tokens_per_s"] / job_run["tokens_per_s"], abs=1e-3
    )
    assert check["predicted_gain"] == chosen["speedup_over_job"]
    md = (folder / "tune.md").read_text()
    assert "agreement 95% CI" in md and "right to wrong" in md and "check: the full job" in md
    assert "not measurable on this sample" in md


def _check_intervals_and_flips(entries: dict) -> None:
    """Agreement, accuracy and flips recomputed from the committed rows of each round."""
    ref = _rows(entries["reference"]["output"])
    for e in entries.values():
        got = _rows(e["output"])
        same = sum(got["label"].get(i) == a for i, a in ref["label"].items())
        assert e["agreement_ci"] == list(wilson(same, len(ref["label"])))
        right = {i: got["label"][i] == got["truth"][i] for i in got["label"]}
        assert e["accuracy_ci"] == list(wilson(sum(right.values()), len(right)))
        was = {i: ref["label"][i] == ref["truth"][i] for i in ref["label"]}
        flips = e["flips"]
        assert flips["right_to_wrong"] == sum(w and not right[i] for i, w in was.items())
        assert flips["wrong_to_right"] == sum(not w and right[i] for i, w in was.items())
    job = entries["job"]
    assert job["flips"]["right_to_wrong"] + job["flips"]["wrong_to_right"] > 0
    assert job["agreement_ci"][1] < 0.98  # shown to differ


def _rows(out: str) -> dict:
    rows = pl.read_parquet(f"{out}/round-*/results/*.parquet")
    ids = rows["ticket_id"].to_list()
    return {
        "label": dict(zip(ids, rows["label"].to_list(), strict=True)),
        "truth": dict(zip(ids, rows["true_label"].to_list(), strict=True)),
    }
