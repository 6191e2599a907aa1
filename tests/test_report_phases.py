"""Every phase of a run on report.png, generation's split in the summary, and a cost
stated only as what it is (a CPU run is no H100's cost; no price is no figure)."""

from __future__ import annotations

import copy
import json

import pytest

from nightshift.jobs.loading import validate_spec
from nightshift.jobs.spec import CostSpec
from nightshift.pipelines.direct import run_job
from nightshift.reports.chart import _draw, chart_bands
from nightshift.reports.lines import cost_meaning
from nightshift.reports.page import report_markdown
from nightshift.reports.phases import generate_parts
from nightshift.reports.report import summary_lines

from .conftest import spec_dict
from .test_report_page import report  # noqa: F401  (a fixture: a finished run's report)


def legend(run: dict) -> list[str]:
    return [t.get_text() for t in _draw(run).legends[0].get_texts()]


@pytest.fixture
def newcomer(report):  # noqa: F811
    """The README's first job as a newcomer saw it: 32 s of start-up, planning, an engine
    start, 85 s before the first answer, 36 s answering, then wrap-up; no canary ran
    (FP8 cannot run on this CPU, so there was nothing to compare)."""
    run = copy.deepcopy(report)
    run["time_s"] = {
        "total": 160.0,
        "prepare": 32.0,
        "plan": 0.4,
        "engine_startup": 6.5,
        "startup_during_plan": 0.0,
        "generate": 121.0,
        "wrap_up": 0.1,
    }
    run["timeline"]["engine_startups"] = [{"began_s": 32.4, "ready_s": 38.9}]
    run["timeline"]["canary"] = {"began_s": 38.9, "ended_s": 38.95}
    run["canary"] = {"status": "nothing to compare", "reason": "no FP8 KV cache here"}
    run["timeline"]["first_answer_s"] = 123.9
    run["timeline"]["last_answer_s"] = 159.9
    run["timeline"]["samples"][-1]["t_s"] = 159.9
    run["shard_times"] = [
        {"shard": 0, "records": 40, "started_s": 123.9, "finished_s": 159.9, "seconds": 36.0}
    ]
    run["time_s"].update(generate_parts(run))
    return run


def test_every_second_of_the_run_is_in_a_phase_and_no_canary_band_when_none_ran(newcomer):
    bands = chart_bands(newcomer)
    assert [b["label"] for b in bands] == [
        "nightshift and Prefect start-up",
        "planning",
        "engine start-up",
        "waiting for the first answer",
        "generating",
        "wrap-up",
    ]
    edge = 0.0
    for band in sorted(bands, key=lambda b: b["start_s"]):
        assert band["start_s"] <= edge + 1e-9, f"a gap before {band}"
        edge = max(edge, band["end_s"])
    assert edge == pytest.approx(newcomer["time_s"]["total"])
    assert bands[3] == {"label": "waiting for the first answer", "start_s": 38.9, "end_s": 123.9}
    labels = legend(newcomer)
    assert "canary" not in labels and "waiting for the first answer" in labels
    # a canary that ran its sample runs is a band of its own
    newcomer["canary"]["runs"] = {"reference": "r", "job": "j"}
    newcomer["timeline"]["canary"] = {"began_s": 38.9, "ended_s": 80.0}
    assert {"label": "canary", "start_s": 38.9, "end_s": 80.0} in chart_bands(newcomer)
    assert "canary" in legend(newcomer)


def test_the_summary_and_shard_table_say_why_their_times_differ(newcomer):
    t = newcomer["time_s"]
    assert t["generate_before_first_answer"] == pytest.approx(85.0)
    assert t["generate_answering"] == pytest.approx(36.0)
    time = next(line for line in summary_lines(newcomer, "out") if line.startswith("time:"))
    assert "121.0s generate: 85.0s before the first answer, 36.0s answering" in time
    # a report that keeps the canary's seconds apart from generation names them apart
    apart = {**newcomer, "time_s": {**t, "canary": 41.1}}
    time = next(line for line in summary_lines(apart, "out") if line.startswith("time:"))
    assert "6.5s engine start, 41.1s canary, 121.0s generate" in time
    page = report_markdown(newcomer)
    assert "| of generation: before the first answer | 85.0 | s |" in page
    shards = page[page.index("## Shards") :]
    assert "span the answering time (36.0 s), not the whole generation (121.0 s)" in shards


def test_no_price_states_no_cost_and_a_cpu_run_is_no_h100s_cost(newcomer):
    unpriced = {**newcomer["cost"], "usd_total": 0.0, "usd_per_gpu_hour": 0.0}
    unpriced.update(cost_meaning(CostSpec(gpu="h100"), "a CPU"))
    run = {**newcomer, "cost": unpriced}
    cost = next(line for line in summary_lines(run, "out") if line.startswith("cost:"))
    assert cost == "cost: not priced: cost.usd_per_gpu_hour is unset (the price of one h100 hour)"
    assert "not priced (cost.usd_per_gpu_hour is unset)" in report_markdown(run)

    on_cpu = {**newcomer["cost"], "usd_total": 0.42, "usd_per_gpu_hour": 2.99}
    on_cpu.update(cost_meaning(CostSpec(gpu="h100", usd_per_gpu_hour=2.99), "a CPU"))
    run = {**newcomer, "cost": on_cpu}
    cost = next(line for line in summary_lines(run, "out") if line.startswith("cost:"))
    assert cost.startswith("cost: $0.4200 = 1x h100 at $2.99/GPU-hour for this run's 160.0s")
    assert "it ran on a CPU, so this is not what the job costs on h100" in cost
    assert "per 1M" not in cost and "out" not in cost.split(";")[0]
    headline = report_markdown(run).splitlines()[2]
    assert "on a CPU; at the spec's price for 1x h100 that time is $0.4200" in headline

    on_h100 = {**newcomer["cost"]}
    on_h100.update(cost_meaning(CostSpec(gpu="h100", usd_per_gpu_hour=2.99), "1x NVIDIA H100"))
    cost = next(
        line for line in summary_lines({**newcomer, "cost": on_h100}, "o") if "cost" in line
    )
    assert "per 1M tokens" in cost and on_h100["note"] is None


def test_a_fake_engine_run_says_it_was_not_priced_and_when_its_first_answer_came(
    models, ticket_dir, tmp_path
):
    out = tmp_path / "out"
    spec = spec_dict(models["chat"], ticket_dir, out, run={"engine": "fake"}, cost={"gpu": "h100"})
    run_job(validate_spec(spec), progress=False)
    found = json.loads((out / "report.json").read_text())
    assert found["cost"]["priced"] is False and found["cost"]["note"].startswith("not priced")
    timeline, t = found["timeline"], found["time_s"]
    assert 0 < timeline["first_answer_s"] <= timeline["last_answer_s"] <= t["total"] + 0.001
    parts = t["generate_canary"] + t["generate_before_first_answer"] + t["generate_answering"]
    assert parts == pytest.approx(t["generate"], abs=0.05)
    drawn = {b["label"]: b for b in chart_bands(found)}
    if timeline["last_answer_s"] - timeline["first_answer_s"] >= 0.05:  # the fake is quick
        assert drawn["generating"]["start_s"] == timeline["first_answer_s"]
    assert max(b["end_s"] for b in drawn.values()) >= timeline["first_answer_s"] - 0.05
    page = (out / "report.md").read_text()
    assert "| self-hosted | 1x h100 | not priced (cost.usd_per_gpu_hour) |" in page
    assert "not priced (cost.usd_per_gpu_hour is unset)" in page.splitlines()[2]
