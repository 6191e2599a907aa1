"""``jobs tune``'s harder cases on the fake engine: FP8 candidates measured without a canary
of their own, a job whose answers are sampled, and a --dir holding someone else's files."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.tuning.candidates import Candidate
from nightshift.tuning.files import candidate_folders
from nightshift.tuning.verdict import choose

from .test_tune import generate_job

runner = CliRunner()


def tune(spec, *extra):
    args = ["jobs", "tune", str(spec), "--set", "run.engine=fake", "--no-defaults", *extra]
    return runner.invoke(app, args)


def test_fp8_candidates_are_measured_without_a_canary_inside_them(
    models, tmp_path, write_spec, monkeypatch
):
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FP8_CHANGES", "0.3")  # below any canary's bar
    data = generate_job(models, tmp_path, records=120, max_tokens=4)
    data["run"] = {}  # the job's own canary left at its default: on for FP8
    result = tune(write_spec(data), "--sample", "16")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "out.tune"
    by_name = {c["name"]: c for c in json.loads((folder / "tune.json").read_text())["candidates"]}
    job = by_name["job"]
    assert "error" not in job and job["kv_cache_dtype"] == "fp8"
    assert 0.4 < job["agreement"] < 0.95  # measured, a row of its own
    round_report = json.loads((folder / "runs" / "job" / "round-1" / "report.json").read_text())
    assert "canary" not in round_report and round_report["time_s"]["canary"] == 0
    assert not (folder / "runs" / "job" / "round-1" / "canary").exists()


def test_a_sampled_job_compares_nothing_and_never_picks_the_reference_for_it(
    models, tmp_path, write_spec
):
    data = generate_job(models, tmp_path, records=120, max_tokens=4)
    data["sampling"]["temperature"] = 0.7  # no seed: two runs are two draws
    result = tune(write_spec(data), "--sample", "16", "--try", "engine.max_num_seqs=4")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out.tune" / "tune.json").read_text())
    assert "sampled" in summary["sample"]["nothing_to_compare"]
    assert summary["sample"]["compared"] == 0
    for entry in summary["candidates"]:
        assert entry["agreement"] is None  # not 0%: no agreement was measured
        if entry["name"] != "reference":
            assert "sampled" in entry["nothing_to_compare"]
    assert "Agreement: nothing to compare" in (tmp_path / "out.tune" / "tune.md").read_text()
    # the choice: on speed alone among settings that change no answer; a faster FP8 one,
    # its answers unmeasured, is never chosen
    why = "the answers are sampled"

    def entry(name, speed, sets, **more):
        return {
            "name": name,
            "sets": sets,
            "tokens_per_s": speed,
            "rounds_tokens_per_s": [speed, speed],
            "agreement_ci": None,
            "nothing_to_compare": why,
            **more,
        }

    job = entry("job", 100.0, {}, same_answers=True)
    ref = entry("reference", 90.0, {"engine.kv_cache_dtype": "auto"})
    fp8 = entry("kv_cache_dtype=fp8", 300.0, {"engine.kv_cache_dtype": "fp8"})
    seqs = entry("max_num_seqs=4", 150.0, {"engine.max_num_seqs": 4}, same_answers=True)
    assert choose([ref, job, fp8], 0.98)["name"] == "job"
    assert choose([ref, job, fp8, seqs], 0.98)["name"] == "max_num_seqs=4"


def test_tune_dir_refuses_a_folder_of_other_files_and_takes_its_own(models, tmp_path, write_spec):
    spec = write_spec(generate_job(models, tmp_path, records=60, max_tokens=4))
    project = tmp_path / "project"
    (project / "runs" / "job").mkdir(parents=True)
    (project / "runs" / "job" / "notes.txt").write_text("my notes")
    (project / "tune.md").write_text("my own tune notes")
    result = tune(spec, "--dir", str(project))
    assert result.exit_code == 2 and "--dir" in result.output, result.output
    assert "runs/job/notes.txt" in result.output and "tune.md" in result.output
    assert (project / "tune.md").read_text() == "my own tune notes"
    assert (project / "runs" / "job" / "notes.txt").read_text() == "my notes"
    assert sorted(p.name for p in project.rglob("*")) == ["job", "notes.txt", "runs", "tune.md"]
    # a new folder, then the same folder again: an earlier tune's is the tune's own
    fresh = tmp_path / "fresh"
    assert tune(spec, "--dir", str(fresh)).exit_code == 0
    (fresh / "runs" / "job" / "notes.txt").write_text("mine")  # inside a run: never touched
    again = tune(spec, "--dir", str(fresh))
    assert again.exit_code == 0, again.output
    assert (fresh / "runs" / "job" / "notes.txt").read_text() == "mine"
    (fresh / "notes.txt").write_text("mine too")  # beside the tune's own files: refused
    assert tune(spec, "--dir", str(fresh)).exit_code == 2


def test_candidates_never_share_a_folder():
    long = "x" * 70
    tries = [
        Candidate(f"extra.{long}=1", {f"engine.extra.{long}": 1}),
        Candidate(f"extra.{long}=2", {f"engine.extra.{long}": 2}),
        Candidate("a/b", {"a": 1}),
        Candidate("a_b", {"a": 2}),
        Candidate("max_num_seqs=4", {"engine.max_num_seqs": 4}),
        Candidate("max_num_seqs=4", {"other.max_num_seqs": 4}),
    ]
    names = candidate_folders(tries)
    assert len(set(names)) == len(names) and names[4] == "max_num_seqs=4"
    assert all(len(n) <= 71 and "/" not in n for n in names)
