"""Prefect's temporary server as nightshift starts it (``pipelines.tempserver``)."""

from __future__ import annotations

import contextvars
import functools
import os
import subprocess
import sys

import httpx
import pytest
from prefect.context import refresh_global_settings_context
from prefect.settings import PREFECT_API_URL, temporary_settings

from nightshift.pipelines import stops, tempserver


@pytest.fixture
def no_server_url(monkeypatch):
    """This process as a newcomer's run sees it: no PREFECT_API_URL (the session's server
    is put back afterwards), no temporary server started yet, and no settings context
    (the session's Prefect test harness holds one: each test runs in an empty one)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv(tempserver._TEMPORARY_URL, "")  # put back as it was afterwards
    monkeypatch.setattr(tempserver, "_server", None)
    monkeypatch.setattr(tempserver, "_early", None)
    refresh_global_settings_context()
    yield
    if tempserver._server is not None:
        tempserver._server.stop()
    monkeypatch.undo()
    refresh_global_settings_context()


def outside_the_harness(test):
    """Run ``test`` in an empty context, as a CLI run's main thread is."""

    @functools.wraps(test)  # pytest still sees the test's fixtures
    def in_empty_context(*args, **kwargs):
        return contextvars.Context().run(test, *args, **kwargs)

    return in_empty_context


def _exits(code: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])


@outside_the_harness
def test_the_booted_server_answers_and_every_prefect_client_of_the_process_uses_it(
    no_server_url,
):
    thread = tempserver.boot()
    assert thread is not None
    thread.join()
    tempserver.use()
    url = tempserver._server.api_url
    assert os.environ["PREFECT_API_URL"] == url == PREFECT_API_URL.value()
    assert httpx.get(f"{url}/health").status_code == 200
    assert stops.prefect_api_gone(ask=False) is False
    assert tempserver.boot() is None  # one a process: the next run reports to it
    tempserver._server.stop()
    assert stops.prefect_api_gone(ask=False) is True


@outside_the_harness
def test_flows_send_no_heartbeats_to_the_temporary_server(no_server_url, monkeypatch):
    """A heartbeat marks a dead process's flow run crashed on a server that outlives it;
    this one dies with the run, and a flow's end would wait up to a second for the
    heartbeat thread to wake."""
    import threading

    from prefect import flow, get_client
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings

    assert get_current_settings().flows.heartbeat_frequency == 180  # Prefect's default
    thread = tempserver.boot()
    thread.join()
    tempserver.use()
    assert get_current_settings().flows.heartbeat_frequency is None
    assert get_current_settings().api.url == tempserver._server.api_url
    started = []
    start = threading.Thread.start

    def noting(self):
        started.extend(getattr(a, "__name__", "") for a in self._args)
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", noting)

    @flow
    def one() -> int:
        return 1

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: 30}):
        assert one() == 1  # the control: Prefect's heartbeats, where they are asked for
    assert "heartbeat_loop" in started
    started.clear()
    assert one() == 1
    assert "heartbeat_loop" not in started
    # a `--workers` process is given the URL as the flow's client has it (launch.py):
    # no heartbeats there either
    with get_client(sync_client=True) as client:
        monkeypatch.setenv("PREFECT_API_URL", str(client.api_url))
    refresh_global_settings_context()
    assert get_current_settings().flows.heartbeat_frequency == 180
    tempserver.for_a_worker()
    assert get_current_settings().flows.heartbeat_frequency is None
    # ... but a worker reporting to a server of the user's keeps Prefect's heartbeats
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    refresh_global_settings_context()
    tempserver.for_a_worker()
    assert get_current_settings().flows.heartbeat_frequency == 180


@outside_the_harness
def test_a_server_that_lost_its_port_starts_again_on_another(no_server_url, monkeypatch):
    launch, ports = tempserver._launch, []

    def first_loses_its_port(port: int, settings: bool = True, quiet: bool = False):
        ports.append(port)
        return _exits(tempserver._PORT_TAKEN) if len(ports) == 1 else launch(port, settings)

    monkeypatch.setattr(tempserver, "_launch", first_loses_its_port)
    server = tempserver.TemporaryServer()
    try:
        assert server.ready(timeout_s=120)
        assert len(ports) == 2 and server.port == ports[1]
    finally:
        server.stop()


@outside_the_harness
def test_a_server_that_never_answers_is_stopped_and_prefect_decides(no_server_url, monkeypatch):
    monkeypatch.setattr(tempserver, "_launch", lambda port, settings=True, quiet=False: _exits(1))
    thread = tempserver.boot()
    thread.join()
    tempserver.use()
    assert tempserver._server is None and "PREFECT_API_URL" not in os.environ
    assert not PREFECT_API_URL.value()


def test_a_callers_own_settings_context_leaves_the_server_to_prefect(no_server_url):
    """A changed global setting would not reach a caller inside ``temporary_settings``."""
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert tempserver.boot() is None


EARLY_RUN = """
import sys, httpx
from nightshift.pipelines import tempserver
tempserver.launch_early()
early = tempserver._early
assert early is not None and "prefect" not in sys.modules, "no early launch"
thread = tempserver.boot()
thread.join()
tempserver.use()
assert tempserver._server is early and tempserver._early is None
assert httpx.get(tempserver._server.api_url + "/health").status_code == 200
print("early", early.process.pid)
"""


def test_a_run_launches_the_server_before_it_imports_prefect_and_boot_takes_it_up():
    """The server's boot then overlaps Prefect's import: what a resume's start waits on."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the session's home
    run = subprocess.run(
        [sys.executable, "-c", EARLY_RUN], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.startswith("early "), run.stdout + run.stderr


@outside_the_harness
def test_an_early_server_the_settings_do_not_allow_is_stopped(no_server_url):
    early = tempserver._early = tempserver.TemporaryServer(settings=False)
    with temporary_settings(updates={PREFECT_API_URL: None}):  # Prefect decides: not ours
        assert tempserver.boot() is None
    assert early.process.poll() is not None and tempserver._early is None
    assert tempserver._server is None


@pytest.mark.parametrize(
    ("file", "text", "named"),
    [
        (None, "", False),
        (
            "home/profiles.toml",
            '[profiles.ephemeral]\nPREFECT_SERVER_ALLOW_EPHEMERAL_MODE = "true"',
            False,
        ),
        ("home/profiles.toml", '[profiles.x]\nPREFECT_API_URL = "http://h:4200/api"', True),
        ("home/profiles.toml", "[profiles.x]\nPREFECT_SERVER_ALLOW_EPHEMERAL_MODE = 'false'", True),
        (".env", "PREFECT_API_URL=http://h:4200/api", True),
        ("prefect.toml", "", True),
        ("pyproject.toml", '[tool.prefect.api]\nurl = "http://h"', True),
        ("pyproject.toml", '[project]\nname = "x"', False),
        (".env", "PREFECT_SERVER_EPHEMERAL_ENABLED=off", True),  # the alias, and "off"
        ("home/profiles.toml", "[profiles.x]\nPREFECT_SERVER_ALLOW_EPHEMERAL_MODE = no", True),
    ],
)
def test_no_early_launch_where_a_settings_file_may_name_a_server(
    tmp_path, monkeypatch, file, text, named
):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILES_PATH", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    if file:
        (tmp_path / file).parent.mkdir(exist_ok=True)
        (tmp_path / file).write_text(text)
    assert tempserver._named_elsewhere() is named
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_ENABLED", "false")
    assert tempserver._named_elsewhere()
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_ENABLED")
    monkeypatch.setenv("PREFECT_API_URL", "http://h:4200/api")
    assert tempserver._named_elsewhere()


CONSOLE_SCRIPT = """
import os, sys
from nightshift.pipelines import tempserver
def launch_early(quiet):  # what the console script had imported and set by then
    early = ("typer" in sys.modules, "prefect" in sys.modules, quiet)
    console = os.environ.get("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL")
    print("launched", *early, os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED"), console,
          flush=True)
tempserver.launch_early = launch_early
sys.argv = ["nightshift", *sys.argv[1:]]
from nightshift.command import main
main()
"""


QUIET = "launched False False True false CRITICAL"  # its output nowhere, Prefect's quiet
VERBOSE = "launched False False False false None"  # -v: its output on the screen


@pytest.mark.parametrize(
    ("args", "launched"),
    [
        (["jobs", "run", "missing.yaml"], QUIET),
        (["jobs", "run", "missing.yaml", "-v"], VERBOSE),
        (["batch", "run", "missing.jsonl", "out.jsonl", "--model", "m"], QUIET),
        (["jobs", "run", "missing.yaml", "--help"], None),
        (["jobs", "plan", "missing.yaml"], None),
    ],
)
def test_the_console_script_launches_the_server_first_for_a_command_that_runs_a_job(
    args, launched, tmp_path
):
    """Before the CLI's own imports (typer, Prefect), with nightshift's server settings;
    no other command starts one."""
    ours = ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    run = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT, *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in run.stdout.splitlines() if line.startswith("launched")]
    assert lines == ([launched] if launched else []), run.stdout + run.stderr
    # the CLI ran after it: its help, or no such spec or file
    assert (run.returncode == 0) == ("--help" in args), run.stderr


QUIET_RUN = """
from nightshift.pipelines import tempserver
server = tempserver.TemporaryServer(settings=False, quiet=True)
assert server.ready(120), "no answer"
server.stop()
"""


def test_a_quiet_server_prints_nothing_however_much_it_logs():
    """An early launch comes before the run's engine log is open: without -v, what the
    server prints (here every INFO line) must not reach the screen."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_SERVER_LOGGING_LEVEL="INFO", PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL="INFO")
    run = subprocess.run(
        [sys.executable, "-c", QUIET_RUN], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout == run.stderr == "", run.stdout + run.stderr
    loud = subprocess.run(
        [sys.executable, "-c", QUIET_RUN.replace("quiet=True", "quiet=False")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert loud.returncode == 0 and "uvicorn" in loud.stdout + loud.stderr  # the check can fail
