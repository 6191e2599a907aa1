"""``jobs tune``: candidates, the sample, agreement with the reference and the choice,
through the CLI on the fake engine (tests/test_tune_engine.py runs it on vLLM)."""

from __future__ import annotations

import json

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.errors import SpecError
from nightshift.jobs.loading import load_spec, validate_spec
from nightshift.tuning.candidates import default_candidates, parse_tries, split_values
from nightshift.tuning.sample import default_size, sample_ids
from nightshift.tuning.verdict import choose

from .conftest import spec_dict, write_records

runner = CliRunner()


def test_try_values_split_on_commas_outside_brackets():
    assert split_values("64,128") == ["64", "128"]
    assert split_values('{"method": "ngram", "k": 4},null') == [
        '{"method": "ngram", "k": 4}',
        "null",
    ]
    [a, b] = parse_tries(["engine.max_num_seqs=8,16"])
    assert a.sets == {"engine.max_num_seqs": 8} and b.sets == {"engine.max_num_seqs": 16}
    with pytest.raises(SpecError, match="--try"):
        parse_tries(["engine.max_num_seqs"])


def test_default_levers_halve_and_double_the_batch_limits_and_flip_the_kv_cache():
    spec = validate_spec(spec_dict("m", "i", "o", engine={"max_num_seqs": 64}))
    sets = [c.sets for c in default_candidates(spec)]
    assert {"engine.max_num_seqs": 32} in sets and {"engine.max_num_seqs": 128} in sets
    assert {"engine.kv_cache_dtype": "auto"} in sets  # the job's default is fp8
    assert not any("engine.extra.speculative_config" in s for s in sets)  # one-token labels
    long = validate_spec(
        spec_dict("m", "i", "o", task={"kind": "generate"}, sampling={"max_tokens": 64})
    )
    assert any("engine.extra.speculative_config" in c.sets for c in default_candidates(long))


def test_the_sample_is_a_few_runs_of_consecutive_records_in_plan_order(models, tmp_path):
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 5}", "body": "x " * (i % 40 + 1)}
        for i in range(300)
    ]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    spec = validate_spec(spec_dict(models["chat"], inputs, tmp_path / "out"))
    ids, total = sample_ids(spec, 40)
    assert total == 300 and len(ids) == len(set(ids)) == 40
    from nightshift.scheduling.plan import build_plan, load_encoder

    order = build_plan(spec, load_encoder(spec), progress=False).records.sort("position")
    place = {r: i for i, r in enumerate(order["record_id"].to_list())}
    spots = sorted(place[i] for i in ids)
    runs = 1 + sum(b != a + 1 for a, b in zip(spots, spots[1:], strict=False))
    assert runs <= 4 and spots[0] == 0 and spots[-1] == 299  # spread to both ends
    assert default_size(400) == 20 and default_size(100_000) == 2000 and default_size(10) == 10
    assert default_size(200) == 16  # the smallest sample, a tenth of the job at most


def test_choose_keeps_the_job_unless_a_candidate_beats_it_beyond_the_spread():
    def entry(name, rounds, ci=(0.99, 1.0), **more):
        speed = sorted(rounds)[len(rounds) // 2]
        return {
            "name": name,
            "sets": {name: 1},
            "tokens_per_s": speed,
            "rounds_tokens_per_s": rounds,
            "agreement_ci": ci,
            **more,
        }

    job = entry("job", [100.0, 120.0])
    within = entry("within", [115.0, 130.0])  # its slowest round is under the job's fastest
    assert choose([job, within], 0.98)["name"] == "job"
    assert choose([job, within], 0.98)["why"] == "no candidate beats the job's setting beyond noise"
    beyond = entry("beyond", [125.0, 135.0])
    assert choose([job, within, beyond], 0.98) == {
        "name": "beyond",
        "sets": {"beyond": 1},
        "speedup_over_job": 1.125,
        "why": "beats the job's setting beyond the rounds' spread",
        "is_job": False,
    }
    # faster, but its agreement interval reaches under the bar: not chosen
    assert choose([job, entry("unsure", [200.0, 210.0], ci=(0.95, 1.0))], 0.98)["name"] == "job"
    # faster, but its round could not show its batch limit: never chosen
    blind = entry("blind", [300.0, 310.0], not_measurable="not measurable on this sample")
    assert choose([job, blind], 0.98)["name"] == "job"
    assert choose([{"name": "job", "error": "no"}], 0.5) is None


def generate_job(models, tmp_path, records: int, max_tokens: int) -> dict:
    """A generate job's spec over ``records`` short tickets (the tiny chat model)."""
    rows = [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 4}", "body": f"my order {i} is late"}
        for i in range(records)
    ]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    task, sampling = {"kind": "generate"}, {"max_tokens": max_tokens}
    return spec_dict(models["chat"], inputs, tmp_path / "out", task=task, sampling=sampling)


def test_jobs_tune_measures_each_candidate_and_writes_the_chosen_spec(models, tmp_path, write_spec):
    data = generate_job(models, tmp_path, records=200, max_tokens=6)
    spec = write_spec(data)
    tuned = tmp_path / "tuned.yaml"
    result = runner.invoke(
        app,
        [
            "jobs",
            "tune",
            str(spec),
            "--set",
            "run.engine=fake",
            "--sample",
            "24",
            "--no-defaults",
            "--try",
            "engine.max_num_seqs=4",
            "--gpu",
            "h100",
            "--try",
            "sampling.max_tokens=2",
            "--write",
            str(tuned),
        ],
    )
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out.tune"
    summary = json.loads((folder / "tune.json").read_text())
    names = [c["name"] for c in summary["candidates"]]
    assert names == ["reference", "job", "max_num_seqs=4", "max_tokens=2"]
    # not a terminal (a log): a line as each candidate ends, none redrawn in place
    assert "tune: 2/4 candidates (50.0%) in" in result.output, result.output
    assert "tune: 4/4 candidates (100.0%) in" in result.output
    assert summary["sample"]["per_round"] == 24 and summary["sample"]["records"] == 48
    by_name = {c["name"]: c for c in summary["candidates"]}
    # agreement, counted here from the two outputs: the fake's answers follow the prompt
    # and sampling, not engine settings; shorter answers differ from the reference's
    ref = _texts(by_name["reference"]["output"])
    for name in names:
        got = _texts(by_name[name]["output"])
        expected = sum(got.get(i) == t for i, t in ref.items()) / len(ref)
        assert by_name[name]["agreement"] == pytest.approx(expected)
    assert (
        by_name["max_num_seqs=4"]["agreement"] == 1.0
        and by_name["max_tokens=2"]["agreement"] == 0.0
    )
    assert all(
        c["tokens_per_s"] > 0 and c["usd_per_million_tokens"] > 0 for c in summary["candidates"]
    )
    assert summary["chosen"]["name"] in {"reference", "job", "max_num_seqs=4"}
    # the binding limit as the engine measured it: the fake's batch is 8, or max_num_seqs
    capped, free = by_name["max_num_seqs=4"]["limit"], by_name["reference"]["limit"]
    assert capped["measured"]["batch_reached"] == 4 and free["measured"]["batch_reached"] == 8
    assert by_name["max_num_seqs=4"]["bound_by"] == "engine.max_num_seqs"
    assert by_name["reference"]["bound_by"] in {"prefill", "decode"}
    # beside it, the capacity planner's prediction for the GPU named, at the same settings
    assert capped["predicted"]["gpu"] == "h100" and capped["predicted"]["batch"] <= 4
    assert free["predicted"]["batch"] > capped["predicted"]["batch"]
    assert "| engine.max_num_seqs | 4 |" in (folder / "tune.md").read_text()
    assert (folder / "tune.png").read_bytes()[:4] == b"\x89PNG"
    assert "| max_tokens=2 |" in (folder / "tune.md").read_text()
    written = tuned.read_text()
    assert written.startswith("# Tuned by `nightshift jobs tune` on 48 of 200 records")
    assert load_spec(tuned).name == data["name"]


def _texts(out: str) -> dict:
    rows = pl.read_parquet(f"{out}/round-*/results/*.parquet")
    return dict(zip(rows["ticket_id"].to_list(), rows["text"].to_list(), strict=True))


@pytest.mark.parametrize(
    ("counters", "bound"),
    [
        ({"preemptions": 3, "peak_kv_cache_usage": 0.7, "peak_running": 40}, "memory (KV cache)"),
        ({"peak_kv_cache_usage": 0.97, "peak_running": 40}, "memory (KV cache)"),
        ({"peak_kv_cache_usage": 0.3, "peak_running": 64}, "engine.max_num_seqs"),
        (
            {"peak_running": 20, "peak_waiting": 5, "engine_steps": 10, "prompt_tokens": 980},
            "engine.max_num_batched_tokens",
        ),
        ({"peak_running": 20, "prefill_seconds": 1.0, "decode_seconds": 3.0}, "decode"),
        ({"peak_running": 20, "prefill_seconds": 3.0, "decode_seconds": 1.0}, "prefill"),
    ],
)
def test_the_measured_binding_limit_follows_the_engine_counters(models, tmp_path, counters, bound):
    from nightshift.tuning.binding import measured_limit

    data = generate_job(models, tmp_path, records=4, max_tokens=2)
    data["engine"] = {**data["engine"], "max_num_seqs": 64, "max_num_batched_tokens": 100}
    report = {"engine": {"counters": counters}}
    assert measured_limit(report, validate_spec(data))["bound_by"] == bound
