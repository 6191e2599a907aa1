"""Engine start-up overlaps planning, and the engine's own output stays off the screen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import nightshift.running.engines as engines_module
from nightshift.console import engine_output_to, kept_log, screen
from nightshift.engines.fake import FakeEngine
from nightshift.errors import SpecError
from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.reports.assemble import startup_seconds
from nightshift.reports.chart import chart_bands

from .conftest import spec_dict, write_records

START_S = 1.5  # a slow engine start, so it clearly overlaps planning


class ClosingEngine(FakeEngine):
    closed: list[ClosingEngine] = []

    def close(self) -> None:
        ClosingEngine.closed.append(self)
        super().close()


@pytest.fixture
def slow_start(monkeypatch):
    """build_engine takes START_S seconds; records when each build began and ended."""
    builds: list[tuple[float, float]] = []
    ClosingEngine.closed = []

    def build(spec):
        began = time.perf_counter()
        time.sleep(START_S)
        builds.append((began, time.perf_counter()))
        return ClosingEngine()

    monkeypatch.setattr(engines_module, "build_engine", build)
    return builds


def test_the_engine_starts_while_the_plan_is_built(models, ticket_dir, tmp_path, slow_start):
    spec = validate_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    began = time.perf_counter()
    report = run_job(spec, progress=False).report
    ((build_began, build_ended),) = slow_start
    assert build_began - began < 0.5  # at once, not after the plan
    t = report["time_s"]
    assert t["startup_during_plan"] > 0
    plan_written = t["prepare"] + t["plan"]  # on the run's clock
    ran_at_once = min(build_ended - began, plan_written) - (build_began - began)
    assert t["startup_during_plan"] == pytest.approx(ran_at_once, abs=0.2)
    # The parts add up: checks and plan + start-up - what ran at once + generation +
    # wrap-up = wall.
    parts = plan_written + t["engine_startup"] - t["startup_during_plan"] + t["generate"]
    assert parts + t["wrap_up"] == pytest.approx(t["total"], abs=0.05)
    assert report["records"]["ok"] == 120


def test_report_json_says_when_the_engine_began_starting_and_was_ready(
    models, ticket_dir, tmp_path, slow_start, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", "1")  # the suite's runs draw none
    out = tmp_path / "out"
    began = time.perf_counter()
    run_job(validate_spec(spec_dict(models["chat"], ticket_dir, out)), progress=False)
    ((build_began, build_ended),) = slow_start
    report = json.loads((out / "report.json").read_text())
    (startup,) = report["timeline"]["engine_startups"]
    assert startup["began_s"] == pytest.approx(build_began - began, abs=0.2)
    assert startup["ready_s"] == pytest.approx(build_ended - began, abs=0.2)
    drawn = [b for b in chart_bands(report) if b["label"] == "engine start-up"]
    assert drawn == [
        {"label": "engine start-up", "start_s": startup["began_s"], "end_s": startup["ready_s"]}
    ]
    assert (out / "report.png").read_bytes().startswith(b"\x89PNG")


def test_overlap_startup_false_starts_the_engine_only_after_the_plan(
    models, ticket_dir, tmp_path, slow_start
):
    spec = spec_dict(models["chat"], ticket_dir, tmp_path / "out", run={"overlap_startup": False})
    began = time.perf_counter()
    report = run_job(validate_spec(spec), progress=False).report
    ((build_began, _),) = slow_start
    t = report["time_s"]
    assert build_began - began >= t["prepare"] + t["plan"] and t["startup_during_plan"] == 0
    assert t["engine_startup"] == pytest.approx(START_S, abs=0.3)
    assert report["records"]["ok"] == 120


def test_a_plan_that_fails_shuts_down_the_engine_that_was_starting(models, tmp_path, slow_start):
    write_records(tmp_path / "in.parquet", [{"ticket_id": "a", "subject": "s"}])  # no body
    spec = validate_spec(spec_dict(models["chat"], tmp_path / "in.parquet", tmp_path / "out"))
    threads = set(threading.enumerate())
    with pytest.raises(SpecError, match="body"):
        run_job(spec, progress=False)
    assert len(slow_start) == 1 and len(ClosingEngine.closed) == 1
    assert set(threading.enumerate()) <= threads  # the start thread is gone too


def test_a_job_with_nothing_left_starts_no_engine_early(models, ticket_dir, tmp_path, slow_start):
    spec = validate_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    run_job(spec, progress=False)
    assert len(slow_start) == 1
    again = run_job(spec, progress=False).report
    assert len(slow_start) == 1
    assert again["this_run"]["engine_starts"] == 0


def test_startup_seconds_count_only_what_ran_during_the_plan():
    # clock starts at 100; plan 10 s; engine start 102..130, then a restart 140..150
    startup, overlap = startup_seconds([(102.0, 130.0), (140.0, 150.0)], 100.0, 10.0)
    assert (startup, overlap) == (38.0, 8.0)
    assert startup_seconds([(95.0, 105.0)], 100.0, 10.0) == (5.0, 5.0)  # clipped to the run


def test_engine_output_goes_to_the_log_and_nightshift_lines_to_the_screen(tmp_path, capfd):
    log = tmp_path / "out.logs" / "engine.log"
    with engine_output_to(log):
        os.write(2, b"Triton is installed, but doesn't include CPU backend\n")
        os.write(1, b"INFO engine noise on stdout\n")
        print("FutureWarning: from python", file=sys.stderr, flush=True)
        subprocess.run(
            [sys.executable, "-c", "import sys; print('child noise', file=sys.stderr)"],
            check=True,
        )
        screen().write("generate: 10 rec\n")
        screen().flush()
    out, err = capfd.readouterr()
    assert "generate: 10 rec" in err
    for noise in ("Triton", "engine noise", "FutureWarning", "child noise"):
        assert noise not in out + err
        assert noise in log.read_text()
    os.write(2, b"after\n")  # the terminal is back
    assert "after" in capfd.readouterr().err


def test_a_log_nothing_was_written_to_is_not_kept(tmp_path):
    """The fake engine prints nothing: its run names no log and leaves none behind; a
    log with anything in it stays where the summary says."""
    empty, written = tmp_path / "a.logs" / "engine.log", tmp_path / "b.logs" / "engine.log"
    with engine_output_to(empty):
        pass
    with engine_output_to(written):
        os.write(2, b"INFO engine noise\n")
    assert kept_log(empty) is None and not empty.parent.exists()
    assert kept_log(written) == written and "noise" in written.read_text()
    beside = tmp_path / "c.logs"
    with engine_output_to(beside / "engine.log"):
        pass
    (beside / "worker-2.log").write_text("from another run\n")
    assert kept_log(beside / "engine.log") is None
    assert [p.name for p in beside.iterdir()] == ["worker-2.log"]  # the folder stays


@pytest.fixture
def flow_spec(models, ticket_dir, tmp_path, write_spec):
    """A fake-engine spec file for the flow; ``sections`` replace whole sections."""

    def make(input_path=ticket_dir, **sections):
        data = spec_dict(models["chat"], input_path, tmp_path / "out", **sections)
        data["run"] = {"engine": "fake", **data.get("run", {})}
        return write_spec(data)

    return make


def test_the_head_start_begins_the_engine_before_the_flow_and_the_flow_takes_it(
    flow_spec, slow_start
):
    from nightshift.pipelines.local import run_flow_once

    began = time.perf_counter()
    report = run_flow_once(str(flow_spec()), None, verbose=True)
    ((build_began, _),) = slow_start  # one engine: the flow took the head-started one
    t = report["time_s"]
    assert t["prepare"] > 0  # the flow's own start-up, counted on the run's clock
    assert build_began - began < t["prepare"]  # the engine began before planning did
    assert t["engine_startup"] == pytest.approx(START_S, abs=0.3)  # all of it on the clock
    parts = t["prepare"] + t["plan"] + t["engine_startup"] - t["startup_during_plan"]
    assert parts + t["generate"] + t["wrap_up"] == pytest.approx(t["total"], abs=0.05)
    assert report["records"]["ok"] == 120 and len(ClosingEngine.closed) == 1


def test_a_flow_whose_plan_fails_shuts_down_the_head_started_engine(
    flow_spec, tmp_path, slow_start
):
    from nightshift.pipelines.local import run_flow_once

    bad = write_records(tmp_path / "in.parquet", [{"ticket_id": "a", "subject": "s"}])
    threads = set(threading.enumerate())
    with pytest.raises(SpecError, match="body"):
        run_flow_once(str(flow_spec(bad)), None, verbose=True)
    assert len(slow_start) == 1 and len(ClosingEngine.closed) == 1
    assert not engines_module._head  # nothing left for the next run to take
    assert {t for t in threading.enumerate() if t.name.startswith("nightshift")} <= threads


def test_no_head_start_for_a_job_with_nothing_left_or_overlap_startup_false(flow_spec, slow_start):
    from nightshift.pipelines.local import run_flow_once

    run_flow_once(str(flow_spec()), None, verbose=True)
    again = run_flow_once(str(flow_spec()), None, verbose=True)
    assert len(slow_start) == 1 and again["this_run"]["engine_starts"] == 0
    began = time.perf_counter()
    spec = flow_spec(run={"engine": "fake", "overlap_startup": False})
    late = run_flow_once(str(spec), None, overwrite=True, verbose=True)
    (_, (late_began, _)) = slow_start
    t = late["time_s"]
    assert late_began - began >= t["prepare"] + t["plan"] and t["startup_during_plan"] == 0


def test_jobs_run_without_a_server_boots_prefects_temporary_one_during_the_head_start(
    flow_spec, tmp_path
):
    """No PREFECT_API_URL (a newcomer's first run): the head start boots Prefect's
    temporary server in the background; the flow uses it and the screen stays quiet."""
    # The session's PREFECT_HOME: its database is migrated already (a fresh one takes
    # half a minute on two cores).
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    run = subprocess.run(
        [sys.executable, "-m", "nightshift.cli", "jobs", "run", str(flow_spec())],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "120 ok, 0 rejected" in run.stdout
    assert "start-up" in run.stdout  # the head start's seconds are on the run's clock
    assert "temporary server" not in run.stdout + run.stderr


def test_while_the_server_boots_the_head_start_imports_what_the_flow_will(monkeypatch):
    """FastAPI's encoder (Prefect's flow start imports it to store the parameters) and the
    chart module, each only while the server boots and no engine is being built."""
    import inspect

    from prefect.flows import Flow

    from nightshift.pipelines import headstart

    assert "from fastapi.encoders import" in inspect.getsource(Flow.serialize_parameters)
    imported: list[str] = []
    monkeypatch.setattr(headstart, "import_module", imported.append)
    monkeypatch.setattr(headstart.engines, "head_starting", lambda wait_s: False)
    booting = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    booting.start()
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", "1")
    headstart._import_while_it_boots(booting)
    assert imported == ["fastapi.encoders", "nightshift.reports.chart"]
    imported.clear()
    monkeypatch.setenv("NIGHTSHIFT_REPORT_CHART", "0")  # no chart drawn: not imported
    headstart._import_while_it_boots(booting)
    assert imported == ["fastapi.encoders"]
    imported.clear()
    monkeypatch.setattr(headstart.engines, "head_starting", lambda wait_s: True)
    headstart._import_while_it_boots(booting)  # an engine thread imports: never two at once
    booted = threading.Thread(target=lambda: None)
    booted.start()
    booted.join()
    monkeypatch.setattr(headstart.engines, "head_starting", lambda wait_s: False)
    headstart._import_while_it_boots(booted)  # the server answers: the flow goes on at once
    assert imported == []
