"""Progress in a log: a line every 30 s and one at the end, when the screen is no terminal."""

from __future__ import annotations

import io

from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.running.progresslines import ProgressLines

from .conftest import spec_dict


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_line_at_the_start_every_30_s_and_at_the_end():
    clock, log = Clock(), io.StringIO()
    lines = ProgressLines("generate", 400, "records", stream=log, clock=clock)
    assert log.getvalue() == "generate: 0/400 records (0.0%) in 0 s, waiting for the first\n"
    clock.now += 10  # the engine loads: the rate counts from the first record
    lines.update(20)
    clock.now += 15
    lines.update(100)  # 25 s in: no line yet
    assert len(log.getvalue().splitlines()) == 1
    clock.now += 5
    lines.update(100)  # 30 s in: 200 more records in the 20 s since the first 20
    assert log.getvalue().splitlines()[-1] == (
        "generate: 220/400 records (55.0%) in 30 s, 10.00 records/s, ETA 18 s"
    )
    for _ in range(50):  # an update between lines is a count, not a line
        lines.update(1)
    lines.set_postfix_str("1,234 tok/s")
    clock.now += 5
    lines.at(400)
    lines.close()
    lines.close()  # once
    last = log.getvalue().splitlines()
    assert len(last) == 3
    assert last[-1] == "generate: 400/400 records (100.0%) in 35 s, 15.20 records/s, 1,234 tok/s"


def test_no_eta_from_a_single_answer_after_a_long_start():
    """The engine took 44 s to start and one answer came: no rate, so no ETA (the old
    line promised 27 minutes for a job that ended 10 s later)."""
    clock, log = Clock(), io.StringIO()
    lines = ProgressLines("generate", 39, "records", stream=log, clock=clock)
    clock.now += 44
    lines.update(1)
    assert log.getvalue().splitlines()[-1] == "generate: 1/39 records (2.6%) in 44 s, no rate yet"
    clock.now += 10
    lines.at(39)
    lines.close()
    assert (
        log.getvalue().splitlines()[-1]
        == "generate: 39/39 records (100.0%) in 54 s, 3.80 records/s"
    )


def test_jobs_run_writes_progress_lines_when_the_screen_is_a_log(
    models, ticket_dir, tmp_path, write_spec, capfd
):
    """Under pytest the screen (stderr) is a file, as in a CI log or under nohup."""
    spec = write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    result = CliRunner().invoke(app, ["jobs", "run", str(spec), "--set", "run.engine=fake"])
    assert result.exit_code == 0, result.output
    seen = result.output + capfd.readouterr().err
    assert "generate: 0/120 records (0.0%)" in seen  # the start, at once
    assert "generate: 120/120 records (100.0%) in" in seen  # the end
    assert "\r" not in seen  # no bar redrawn in place
    quiet = CliRunner().invoke(
        app, ["jobs", "run", str(spec), "--set", "run.engine=fake", "--overwrite", "-q"]
    )
    assert quiet.exit_code == 0, quiet.output
    assert "records (" not in quiet.output + capfd.readouterr().err
