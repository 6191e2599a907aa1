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
    monkeypatch.setattr(tempserver, "_server", None)
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
def test_a_server_that_lost_its_port_starts_again_on_another(no_server_url, monkeypatch):
    launch, ports = tempserver._launch, []

    def first_loses_its_port(port: int) -> subprocess.Popen:
        ports.append(port)
        return _exits(tempserver._PORT_TAKEN) if len(ports) == 1 else launch(port)

    monkeypatch.setattr(tempserver, "_launch", first_loses_its_port)
    server = tempserver.TemporaryServer()
    try:
        assert server.ready(timeout_s=120)
        assert len(ports) == 2 and server.port == ports[1]
    finally:
        server.stop()


@outside_the_harness
def test_a_server_that_never_answers_is_stopped_and_prefect_decides(no_server_url, monkeypatch):
    monkeypatch.setattr(tempserver, "_launch", lambda port: _exits(1))
    thread = tempserver.boot()
    thread.join()
    tempserver.use()
    assert tempserver._server is None and "PREFECT_API_URL" not in os.environ
    assert not PREFECT_API_URL.value()


def test_a_callers_own_settings_context_leaves_the_server_to_prefect(no_server_url):
    """A changed global setting would not reach a caller inside ``temporary_settings``."""
    with temporary_settings(updates={PREFECT_API_URL: None}):
        assert tempserver.boot() is None
