"""The scale-out recipe of docs/scale-out.md ("On a real cluster"), executed on loopback.

A Prefect process work pool on the session's server, ``prefect worker start`` on it, the
plan written with ``jobs plan --write``, the page's own ``prefect.yaml`` deployed with
``prefect deploy``, and two flow runs started with ``prefect deployment run``. One run is
SIGKILLed midway while it holds a shard; the other takes that shard over once its lease
expires, and the job ends with every record exactly once. Nothing here is started by
nightshift: the work pool's worker starts the flow runs, as on a cluster.

The flow runs answer on the fake engine, slowed to a pace where the kill lands midway:
what is tested is the recipe (the pool, the deployment, the takeover by lease). The same
takeover on vLLM engines is ``test_workers``' real-engine test; two engines on this
machine's two cores took this test to 160 s of the suite's longest chain.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from uuid import UUID

import psutil
import yaml

import nightshift
from nightshift.io.outputs import JobOutput

from .conftest import spec_dict, write_records
from .durable import NIGHTSHIFT, assert_exactly_once
from .test_workers import held_shards, kill_with_children, tickets

RECIPE = Path(__file__).resolve().parents[1] / "docs" / "scale-out.md"
PREFECT = [sys.executable, "-m", "prefect"]


def readme_deployment() -> dict:
    """The ``prefect.yaml`` of the README's cluster recipe, as written there."""
    text = RECIPE.read_text()
    recipe = text[text.index("**On a real cluster.**") :]
    block = re.search(r"```yaml\n(.*?)```", recipe, re.S)
    assert block, "docs/scale-out.md's cluster recipe has no prefect.yaml block"
    return yaml.safe_load(block.group(1))


def on_process_pool(config: dict, pool: str, spec_path: Path, workdir: Path) -> dict:
    """The README's deployment, pointed at this test's pool, spec and directory: only
    the values a user fills in change, and a process pool has no image."""
    [deployment] = config["deployments"]
    deployment["parameters"]["spec_path"] = str(spec_path)
    deployment["work_pool"] = {"name": pool}
    [step] = deployment["pull"]
    step["prefect.deployments.steps.set_working_directory"]["directory"] = str(workdir)
    return config


def run(command: list[str], env: dict, cwd: Path) -> str:
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def flow_run_processes(worker: psutil.Process, run_id: str) -> list[psutil.Process]:
    """The processes of one flow run the work pool's worker started (the flow's process
    and its engine's): they carry the run's id in their environment."""
    found = []
    for child in worker.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            if child.environ().get("PREFECT__FLOW_RUN_ID") == run_id:
                found.append(child)
    return found


def cpu_binding(index: int) -> dict[str, str]:
    """Flow run ``index``'s vLLM threads on a core of their own where there are two
    (``jobs run --workers`` does the same): two engines spinning on shared cores crawl.
    The recipe's deployment passes it as a job variable, as a cluster's would."""
    cores = sorted(os.sched_getaffinity(0))
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[index])} if len(cores) >= 2 else {}


def state(run_id: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(UUID(run_id)).state


def kill_midway(worker: psutil.Process, run_id: str, out: str, name: str) -> list[int]:
    """SIGKILL flow run ``name`` (and its engine) once a shard has committed somewhere
    and ``name`` holds one that has not: the shards it held that were still not
    committed once it was dead (it may commit one between the look and the kill)."""
    deadline = time.monotonic() + 600
    output = JobOutput(out)
    while time.monotonic() < deadline:
        assert not state(run_id).is_final(), f"{name} ended before it could be killed"
        held = held_shards(out, name) if output.shards.committed() else []
        processes = flow_run_processes(worker, run_id) if held else []
        if processes:
            for process in processes:
                kill_with_children(process)
            committed = output.shards.committed()
            return [shard for shard in held if shard not in committed]
        time.sleep(0.2)
    raise AssertionError(f"{name} never held a shard while another had committed")


def wait_final(run_ids: list[str], timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not all(state(r).is_final() for r in run_ids):
        assert time.monotonic() < deadline, [state(r).name for r in run_ids]
        time.sleep(1)


def test_the_readme_cluster_recipe_on_a_process_pool_survives_a_killed_flow_run(
    models, tmp_path, prefect_server
):
    rows = tickets(240)
    write_records(tmp_path / "in" / "a.parquet", rows)
    out = str(tmp_path / "out")
    spec = spec_dict(
        models["chat"],
        tmp_path / "in",
        out,
        plan={"shard_records": 20},
        run={"engine": "fake", "chunk_records": 5, "lease_s": 10},
    )
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    # The flow runs import this source tree (the README's recipe: the installed package).
    src = str(Path(nightshift.__file__).resolve().parents[1])
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_server,
        "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]),
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # pick up scheduled runs at once
        "NIGHTSHIFT_FAKE_SECONDS_PER_RECORD": "0.05",  # a shard of 20 takes a second
    }
    pool = f"nightshift-{uuid.uuid4().hex[:6]}"
    run([*PREFECT, "work-pool", "create", pool, "--type", "process"], env, tmp_path)
    run([*NIGHTSHIFT, "jobs", "plan", str(spec_path), "--write"], env, tmp_path)
    prefect_yaml = tmp_path / "prefect.yaml"
    config = on_process_pool(readme_deployment(), pool, spec_path, tmp_path)
    prefect_yaml.write_text(yaml.safe_dump(config))
    run([*PREFECT, "deploy", "--prefect-file", str(prefect_yaml), "--all"], env, tmp_path)
    name = f"nightshift-worker/{config['deployments'][0]['name']}"

    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [*PREFECT, "worker", "start", "--pool", pool], env=env, stdout=log, stderr=log
    )
    try:
        runs = {}
        for i, worker_name in enumerate(["w0", "w1"]):
            started = run(
                [
                    *PREFECT,
                    "deployment",
                    "run",
                    name,
                    "--param",
                    f"spec_path={spec_path}",
                    "--param",
                    f"worker={worker_name}",
                    "--job-variable",
                    f"env={json.dumps(cpu_binding(i))}",
                ],
                env,
                tmp_path,
            )
            runs[worker_name] = re.search(r"UUID: *([0-9a-f-]{36})", started).group(1)
        victims = kill_midway(psutil.Process(worker.pid), runs["w1"], out, "w1")
        wait_final(list(runs.values()))
    finally:
        kill_with_children(psutil.Process(worker.pid))
        worker.wait(timeout=60)
        log.close()
    worker_log = (tmp_path / "worker.log").read_text()[-4000:]
    assert state(runs["w0"]).is_completed(), worker_log
    assert not state(runs["w1"]).is_completed()  # killed: crashed, not finished

    assert_exactly_once(out, "ticket_id", [r["ticket_id"] for r in rows])
    output = JobOutput(out)
    assert len(output.shards.committed()) == 12
    [survivor] = [
        json.loads(output.store.get_bytes(key)) for key in output.store.list("_work/workers/")
    ]  # a killed worker leaves no figures
    assert survivor["worker"].startswith("w0-")
    assert set(victims) <= set(survivor["committed"])  # taken over from the killed flow run
