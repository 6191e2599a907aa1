"""Stops and the processes nightshift starts: a cancel never ends the batch server, an
engine still starting can be killed, a signal to the whole process group stops a run
gracefully, and no child process (Prefect's temporary server, engine start-ups)
outlives nightshift, however it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from nightshift.pipelines.stops import GracefulStop

from .batchserver import KEY, Server, chat_line, finished, free_port, openai_batch
from .batchserver import wait_for as wait_until
from .durable import NIGHTSHIFT, report
from .test_stops import SLOW, checkpointed, fake_job

STOPPED = 3


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    living = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                living.append(p)
    return living


def none_alive_soon(processes: list[psutil.Process], within: float = 10) -> list:
    deadline = time.monotonic() + within
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive(processes)


def kill_all(processes: list[psutil.Process]) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.kill()


def own_server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No PREFECT_API_URL: the run boots Prefect's temporary server (the session's
    PREFECT_HOME, whose database is migrated already)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return {**env, "NIGHTSHIFT_GPU_LIMIT": f"test-gpu-{uuid.uuid4().hex[:8]}", **extra}


def start_job(spec: Path, env: dict[str, str]) -> psutil.Popen:
    # A session of its own, as a terminal gives a command: killpg reaches it alone.
    return psutil.Popen(
        [*NIGHTSHIFT, "jobs", "run", str(spec), "-q"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, process: psutil.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def prefect_server_of(process: psutil.Popen) -> list[psutil.Process]:
    found = []
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "prefect.server.api.server:create_app" in " ".join(child.cmdline()):
                found.append(child)
    return found


def ended(process: psutil.Popen, timeout: float) -> tuple[float, str]:
    began = time.monotonic()
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_all([*process.children(recursive=True), process])
        _, err = process.communicate()
    return time.monotonic() - began, err


# -- a stop's overrun, and engines killed while they start (in process) --------------


def test_a_stop_past_stop_s_abandons_the_run_where_the_process_must_not_exit():
    """Inside ``batch serve`` (no ``exit_on_overrun``) a stop that overruns kills the
    engine and abandons the run; the process goes on (it used to ``os._exit``)."""
    stop, killed = GracefulStop(0.4), threading.Event()
    stop.on_kill(killed.set)
    stop.request("cancelled")
    time.sleep(1.0)  # past stop_s: os._exit would have ended this test process here
    assert killed.is_set() and stop.abandoned
    stop.finished.set()


def test_killing_an_engine_pool_while_its_engine_starts_kills_the_start(
    models, ticket_dir, tmp_path, monkeypatch
):
    """A start that would last for ever (the fake engine's start-up child waits on a
    file): ``kill`` (a stop past its time) kills that child and the run waiting for
    the engine gets an error at once instead of hanging."""
    from nightshift.errors import RunStoppedError
    from nightshift.jobs.loading import validate_spec
    from nightshift.running.engines import EnginePool

    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("NIGHTSHIFT_FAKE_START_HOLD", str(hold))
    data = fake_job(models, ticket_dir, tmp_path / "out", lambda d, n: d)
    pool = EnginePool(validate_spec(data))
    before = set(psutil.Process().children())
    pool.start_early()
    deadline = time.monotonic() + 60
    while not (starting := set(psutil.Process().children()) - before):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    errors: list[BaseException] = []

    def acquire() -> None:
        try:
            pool.acquire()
        except BaseException as exc:
            errors.append(exc)

    waiter = threading.Thread(target=acquire)
    waiter.start()
    time.sleep(0.3)
    pool.kill()
    waiter.join(10)
    assert not waiter.is_alive() and isinstance(errors[0], RunStoppedError)
    assert none_alive_soon(list(starting)) == []
    pool.close()


# -- signals to `jobs run` ----------------------------------------------------------


def test_ctrl_c_to_the_process_group_stops_the_run_gracefully(
    models, ticket_dir, tmp_path, write_spec
):
    """A terminal's Ctrl-C reaches every process of its group; Prefect's temporary
    server is in a session of its own, so the stop still ends the flow run: exit 3
    within run.stop_s, the report marked stopped, and no child left."""
    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec)
    run = start_job(spec, own_server_env(tmp_path, **SLOW))
    wait_for(lambda: checkpointed(out), run)
    children = run.children(recursive=True)
    assert prefect_server_of(run)
    os.killpg(run.pid, signal.SIGINT)
    took, err = ended(run, 40)
    assert run.returncode == STOPPED, err[-3000:]
    assert took < 20
    assert report(str(out))["stopped"]["signal"] == "SIGINT"
    assert none_alive_soon(children) == []


def test_sigterm_to_the_group_and_the_prefect_server_still_exits_3(
    models, ticket_dir, tmp_path, write_spec
):
    """systemd's KillMode=control-group: SIGTERM to nightshift and Prefect's server at
    once. The stop does not need Prefect's API: the answers are checkpointed, the report
    is written, and the run exits 3 well within run.stop_s (not 128 + 15 after it)."""
    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec)
    run = start_job(spec, own_server_env(tmp_path, **SLOW))
    wait_for(lambda: checkpointed(out), run)
    children = run.children(recursive=True)
    for p in [run, *children]:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGTERM)
    took, err = ended(run, 60)
    assert run.returncode == STOPPED, err[-3000:]
    assert took < 20
    assert report(str(out))["stopped"]["signal"] == "SIGTERM"
    assert none_alive_soon(children) == []


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_run_ended_in_its_first_seconds_leaves_no_process(
    how, models, ticket_dir, tmp_path, write_spec
):
    """Before the flow's own handler exists (the head start boots Prefect's temporary
    server): SIGTERM unwinds the command (exit 3) and SIGKILL cannot be handled at all;
    either way Prefect's server dies with nightshift."""
    out = tmp_path / "out"
    spec = fake_job(models, ticket_dir, out, write_spec)
    run = start_job(spec, own_server_env(tmp_path))
    wait_for(lambda: prefect_server_of(run), run, timeout=120)
    children = run.children(recursive=True)
    run.send_signal(how)
    _, err = ended(run, 60)
    assert run.returncode == (STOPPED if how == signal.SIGTERM else -how), err[-3000:]
    left = none_alive_soon(children)
    kill_all(left)
    assert left == []


# -- the batch server ----------------------------------------------------------------


def serve_process(tmp_path: Path, models, *args: str, env: dict[str, str]) -> tuple:
    """``batch serve`` with Prefect's temporary server of its own (no PREFECT_API_URL)."""
    server = Server(tmp_path / "store", models["chat"], "--set", "run.engine=fake", *args)
    port = free_port()
    log = open(tmp_path / f"server-{port}.log", "w")  # noqa: SIM115 (closed by the test)
    proc = psutil.Popen(server.command(port), env=env, stdout=log, stderr=subprocess.STDOUT)
    server.proc, server.url = proc, f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, (tmp_path / f"server-{port}.log").read_text()
        with contextlib.suppress(httpx.TransportError):
            headers = {"Authorization": f"Bearer {KEY}"}
            if httpx.get(f"{server.url}/v1/models", headers=headers).status_code == 200:
                return server, proc, log
        assert time.monotonic() < deadline
        time.sleep(0.3)


def test_sigterm_to_batch_serve_is_a_graceful_shutdown_that_leaves_no_process(models, tmp_path):
    """SIGTERM to ``batch serve`` exits 0 (not 143) once a batch ran, and Prefect's
    temporary server it booted for that batch is gone with it."""
    server, proc, log = serve_process(tmp_path, models, env=own_server_env(tmp_path))
    client = server.openai()
    done = finished(client, openai_batch(client, [chat_line("a", "hello")]).id)
    assert done.status == "completed"
    children = proc.children(recursive=True)
    assert prefect_server_of(proc)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(120)
    finally:
        log.close()
        kill_all(alive([proc, *children]))
    assert code == 0, (tmp_path / log.name).read_text()[-3000:]
    assert none_alive_soon(children) == []


def test_a_cancel_during_a_start_past_stop_s_cancels_the_batch_not_the_server(models, tmp_path):
    """The engine of a batch takes for ever to start (longer than run.stop_s); a cancel
    kills that start-up, the batch ends cancelled, and the server serves the next one."""
    hold = tmp_path / "hold"
    hold.touch()
    env = own_server_env(tmp_path, NIGHTSHIFT_FAKE_START_HOLD=str(hold))
    server, proc, log = serve_process(tmp_path, models, "--set", "run.stop_s=2", env=env)
    try:
        client = server.openai()
        slow = openai_batch(client, [chat_line("s", "never starts")])

        def starting() -> list[psutil.Process]:
            return [c for c in proc.children(recursive=True) if str(hold) in " ".join(_cmdline(c))]

        wait_until(starting, bool, timeout=180)
        start_up = starting()
        client.batches.cancel(slow.id)
        assert finished(client, slow.id).status == "cancelled"
        time.sleep(3)  # past run.stop_s: the server would have exited by now
        assert proc.poll() is None
        assert none_alive_soon(start_up) == []
        hold.unlink()
        after = openai_batch(client, [chat_line("n", "hello", max_tokens=4)])
        assert finished(client, after.id).status == "completed"
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(psutil.TimeoutExpired):
            proc.wait(120)
        kill_all(alive([proc, *proc.children(recursive=True)] if proc.is_running() else []))
        log.close()


def test_a_cancel_whose_stop_overruns_stop_s_abandons_the_job_not_the_server(models, tmp_path):
    """An engine step the stop cannot interrupt (the slow fake answers 8 requests per
    step, 2 s each) outlasts run.stop_s: the server abandons that job, the batch ends
    cancelled once the step returns, and the next batch runs."""
    env = own_server_env(tmp_path, NIGHTSHIFT_FAKE_SECONDS_PER_RECORD="2")
    server, proc, log = serve_process(tmp_path, models, "--set", "run.stop_s=1", env=env)
    try:
        client = server.openai()
        slow = openai_batch(client, [chat_line(f"s-{i}", f"count to {i}") for i in range(16)])
        wait_until(lambda: client.batches.retrieve(slow.id), lambda b: b.status == "in_progress")
        time.sleep(2)
        client.batches.cancel(slow.id)
        assert finished(client, slow.id).status == "cancelled"
        assert proc.poll() is None
        after = openai_batch(client, [chat_line("n", "hello", max_tokens=4)])
        assert finished(client, after.id).status == "completed"
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(psutil.TimeoutExpired):
            proc.wait(120)
        kill_all(alive([proc, *proc.children(recursive=True)] if proc.is_running() else []))
        log.close()


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
