"""What nightshift touches in an output: only the files it wrote, by their exact names.

--overwrite and a plain run leave others' files alone and refuse a location that holds
nothing of nightshift's; the end-of-run clean-up deletes only data a marker has made
dead, never that of an attempt elsewhere still on its way to its marker.
"""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.io.outputs import JobOutput
from nightshift.io.shardstore import ShardStore
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.status import export_results, output_status
from nightshift.pipelines.direct import run_job

from .conftest import spec_dict, write_records
from .durable import assert_exactly_once, run_cli

# Users' files under names nightshift uses for folders (or for its own files elsewhere).
USER_FILES = {
    "plan/roadmap.txt": b"Q3: ship it\n",
    "committed/notes.json": b'{"who": "me"}',
    "_work/draft.txt": b"draft\n",
    "leases/office-lease.pdf": b"%PDF-1.4 lease",
    "results/summary.parquet": b"not parquet at all",
    "mine.csv": b"a,b\n1,2\n",
}


def tickets(n: int, start: int = 0) -> list[dict]:
    return [
        {"ticket_id": f"t{i:03d}", "subject": f"s{i % 5}", "body": f"body {i} " * (1 + i % 4)}
        for i in range(start, start + n)
    ]


def plant(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def assert_intact(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (root / name).read_bytes() == data, name


def files_of(root) -> dict[str, tuple[int, int]]:
    """Each file under ``root``: its inode and modification time."""
    stats = {p.relative_to(root).as_posix(): p.stat() for p in root.rglob("*") if p.is_file()}
    return {name: (st.st_ino, st.st_mtime_ns) for name, st in stats.items()}


@pytest.fixture
def fake_job(models, tmp_path, write_spec):
    write_records(tmp_path / "in" / "a.parquet", tickets(30))
    data = spec_dict(
        models["chat"],
        tmp_path / "in",
        tmp_path / "out",
        plan={"shard_records": 10},
        run={"engine": "fake", "chunk_records": 4},
    )
    return write_spec(data), data


@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_a_folder_of_user_files_that_never_held_a_run_is_refused(fake_job, tmp_path, flags):
    spec_path, _ = fake_job
    out = tmp_path / "out"
    plant(out, USER_FILES)
    done = run_cli(spec_path, *flags)
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]  # (Prefect logs the plan task's failure)
    assert last.startswith("error: output.path:") and "not a nightshift run" in last
    assert_intact(out, USER_FILES)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == sorted(
        USER_FILES
    )


def test_a_users_report_and_rejects_are_not_replaced_without_overwrite(fake_job, tmp_path):
    spec_path, _ = fake_job
    out = tmp_path / "out"
    mine = {"report.md": b"# my report\n", "rejects.parquet": b"my rejects"}
    plant(out, mine)
    done = run_cli(spec_path)
    assert done.returncode == 2, done.stderr
    assert "not a nightshift run" in done.stderr
    assert_intact(out, mine)
    assert not (out / "plan").exists() and not (out / "report.json").exists()


def test_overwrite_of_a_real_run_removes_every_nightshift_file_and_no_user_file(fake_job, tmp_path):
    """A run, then an increment (rejects-0001.parquet, plan/records-0001.parquet), then
    users' files beside them; --overwrite leaves only the new run's files and theirs."""
    _, data = fake_job
    out = tmp_path / "out"
    spec = validate_spec(data)
    run_job(spec, engine=FakeEngine(), progress=False)
    rows = [*tickets(10, start=30), {"ticket_id": "t999", "subject": "s", "body": None}]
    write_records(tmp_path / "in" / "b.parquet", rows)
    run_job(spec, engine=FakeEngine(), progress=False)
    assert (out / "rejects-0001.parquet").exists() and (out / "plan/records-0001.parquet").exists()
    plant(out, USER_FILES)
    before = files_of(out)

    done = run_cli(tmp_path / "job.yaml", "--overwrite")
    assert done.returncode == 0, done.stderr
    assert_intact(out, USER_FILES)
    after = files_of(out)
    # Every file of the earlier run is gone or written anew (atomic writes: a new inode).
    left_over = [k for k in after if k in before and after[k] == before[k]]
    assert sorted(left_over) == sorted(USER_FILES)
    assert not (out / "rejects-0001.parquet").exists()
    assert not (out / "plan/records-0001.parquet").exists()
    ids = [f"t{i:03d}" for i in range(40)] + ["t999"]
    assert_exactly_once(str(out), "ticket_id", ids)
    assert JobOutput(str(out)).plans.manifest()["rejects_files"] == ["rejects.parquet"]


def test_a_plan_cut_short_beside_user_files_is_planned_again(fake_job, tmp_path):
    """plan.json missing but the plan's own files there: a run killed while planning;
    the rerun takes it up without --overwrite and leaves the user's files alone."""
    _, data = fake_job
    out = tmp_path / "out"
    plant(out, {"plan/records.parquet": b"half a plan", **USER_FILES})
    run_job(validate_spec(data), engine=FakeEngine(), progress=False)
    assert_intact(out, USER_FILES)
    assert_exactly_once(str(out), "ticket_id", [t["ticket_id"] for t in tickets(30)])


def test_clean_up_keeps_the_data_of_an_attempt_elsewhere_until_it_commits(
    fake_job, tmp_path, monkeypatch
):
    """Attempt B (another `jobs run`, or a worker) has written shard 0's data and not yet
    its marker when run A ends; A's clean-up must not delete B's data: B then creates its
    marker, and status and export read every committed file."""
    import nightshift.io.shardstore as shardstore
    from nightshift.reports.assemble import finish_run
    from nightshift.running.engines import EnginePool
    from nightshift.running.runner import start_run

    _, data = fake_job
    out = str(tmp_path / "out")
    spec = validate_spec(data)
    paused, resume = threading.Event(), threading.Event()
    b_thread: list[threading.Thread] = []

    def pause_b(name: str) -> None:  # B, between its data and its marker
        if name == "shard.data_written" and threading.current_thread() in b_thread:
            paused.set()
            assert resume.wait(60)

    monkeypatch.setattr(shardstore, "crash_point", pause_b)
    job_b = start_run(spec, progress=False)
    engines_b = EnginePool(spec, FakeEngine())
    commit_b = job_b.runner.shards.commit

    def b_commits(*args, **kwargs):  # on B's commit thread (running.committing)
        b_thread.append(threading.current_thread())
        return commit_b(*args, **kwargs)

    job_b.runner.shards.commit = b_commits
    b = threading.Thread(target=job_b.runner.run, args=([0], engines_b))
    b.start()
    assert paused.wait(60)

    job_a = start_run(spec, progress=False)  # A takes the other shards
    job_a.todo = [s for s in job_a.todo if s != 0]
    engines_a = EnginePool(spec, FakeEngine())
    job_a.runner.run(job_a.todo, engines_a)
    engines_a.close()
    finish_run(job_a, engines_a)  # its clean-up runs while B is paused

    resume.set()
    b.join(60)
    assert job_b.runner.committed == [0]
    status = output_status(out)
    assert status["shards"]["done"] == len(status["each"]) > 1
    destination, rows = export_results(out, str(tmp_path / "all.parquet"))
    assert rows == status["records"]["ok"] == 30
    assert_exactly_once(out, "ticket_id", [t["ticket_id"] for t in tickets(30)])


def test_clean_up_deletes_only_files_a_marker_made_dead(tmp_path):
    store = ShardStore(JobOutput(str(tmp_path / "out")).store)
    table = pa.table({"ticket_id": ["a"]})
    assert store.commit(0, "aaaa0001", {"ok": table}, {})  # the winner of shard 0
    store._put_table("results/shard-00000-bbbb0002.parquet", table, "ok")  # its loser
    store._put_table("results/shard-00001-cccc0003.parquet", table, "ok")  # on its way
    store._put_table("results/shard-00002-dddd0004.parquet", table, "ok")  # ours, uncommitted
    assert store.delete_unnamed("dddd0004") == 2
    assert store.data_files() == [
        "results/shard-00000-aaaa0001.parquet",
        "results/shard-00001-cccc0003.parquet",
    ]


def test_a_plan_is_not_written_among_user_files(fake_job, tmp_path):
    from nightshift.errors import OutputExistsError
    from nightshift.scheduling.dryrun import plan_summary

    _, data = fake_job
    mine = {"rejects.parquet": b"my rejects", "plan/roadmap.txt": b"mine"}
    plant(tmp_path / "out", mine)
    with pytest.raises(OutputExistsError, match="not a nightshift run"):
        plan_summary(validate_spec(data), write=True)
    assert_intact(tmp_path / "out", mine)
