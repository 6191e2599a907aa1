"""Prefect's temporary server for a run without ``PREFECT_API_URL``, started by nightshift.

Prefect starts the same server (``prefect.server.api.server.SubprocessASGIServer``: its
API app under uvicorn, in a process of its own) the first time a client needs one, but
only after importing its whole server package in this process: 1.8-2.4 s on the main
thread before the server's own boot (3-4 s) even begins, on the start-up path of every
run. Here the process starts straight away, with the command and environment Prefect
gives it (``prefect<3.7.8`` is pinned), and where nothing in sight names a server of the
user's, before this process even imports Prefect (``launch_early``: the console script
calls it first of all for a command that runs a job, ``nightshift.command``); once it answers,
``PREFECT_API_URL`` points at it, so every Prefect client of this process (the flow's,
its log and event workers') uses it and none starts another.

The server neither dies before nightshift nor outlives it: it runs in a session of its
own (a terminal's Ctrl-C goes to nightshift's process group, and the graceful stop still
has the server to end the flow run with), and with ``PR_SET_PDEATHSIG`` from a thread as
long-lived as this process (``engines.processes``), so it dies with nightshift however
that ends, ``kill -9`` included. Should it not answer, it is stopped and Prefect starts
its own, as it would have.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from nightshift.engines import processes

# Applied before Prefect is imported (its settings are read then).
_QUIET_PREFECT = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "CRITICAL",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    # Two busy cores can take longer than Prefect's 20 s default to start the server.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
    # Prefect's usage telemetry (and its first-run notice): off unless the user opts in.
    "DO_NOT_TRACK": "1",
}


_TEMPORARY_URL = "NIGHTSHIFT_TEMPORARY_PREFECT_API_URL"  # the server a run of ours started
_PORT_TAKEN = 3  # uvicorn's exit status when it cannot bind its port
_STOP_GRACE_S = 1.0
_server: TemporaryServer | None = None
_early: TemporaryServer | None = None  # launched before Prefect was imported; ``boot`` decides


class TemporaryServer:
    """One temporary server process; ``ready`` waits until it answers."""

    def __init__(self, settings: bool = True, quiet: bool = False) -> None:
        self._how = settings, quiet  # for a launch again on another port
        self.port = _free_port()
        self.process = _launch(self.port, *self._how)
        self.answered = False
        atexit.register(self.stop)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def ready(self, timeout_s: float) -> bool:
        """Wait for the server's health check; False if it did not answer in time."""
        import httpx

        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() == _PORT_TAKEN:  # lost its port to another process
                    self.port = _free_port()
                    self.process = _launch(self.port, *self._how)
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.api_url}/health").status_code == 200:
                        self.answered = True
                        return True
                if self.process.poll() is not None:
                    return False
                time.sleep(0.1)
        return False

    def stop(self) -> None:
        """End the server with ``_STOP_GRACE_S`` of grace. Prefect's own stop waits 5 s:
        a SIGTERMed uvicorn waits for open connections, and this process's Prefect
        clients hold theirs open to the end, so the wait ran out after every run."""
        process = self.process
        if process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def prefect_defaults(quiet: bool) -> None:
    """Set nightshift's Prefect defaults where the user has not set them; call before
    Prefect is imported."""
    for key, value in _QUIET_PREFECT.items():
        if quiet or key != "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL":
            os.environ.setdefault(key, value)


def launch_early(quiet: bool = False) -> None:
    """Launch the server before this process imports Prefect (0.7 s on 2 cores, and the
    server's boot is what a resume's start waits on), where nothing in sight names a
    server of the user's (``_named_elsewhere``). ``boot`` then reads Prefect's settings,
    and takes this server up or stops it. ``quiet``: what the server prints goes nowhere
    (a launch before the run's engine log is open: never onto the screen)."""
    global _early
    prefect_unread = "prefect" not in sys.modules
    if _early is None and _server is None and prefect_unread and not _named_elsewhere():
        _early = TemporaryServer(settings=False, quiet=quiet)


def boot() -> threading.Thread | None:
    """Start the temporary server (or take up ``launch_early``'s) and, in a thread, wait
    for it to answer; None when this run reports to a server of the user's, or Prefect
    is to decide (see ``_ours``). Call ``use`` after joining the thread."""
    global _server, _early
    early, _early = _early, None
    if not _ours():
        if early is not None:
            early.stop()
        return None
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    timeout_s = float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
    _server = server = early or TemporaryServer()
    thread = threading.Thread(
        target=server.ready, args=(timeout_s,), name="nightshift-prefect-boot", daemon=True
    )
    thread.start()
    return thread


def use() -> None:
    """Point this process's Prefect clients at the booted server, once it answers;
    otherwise stop it, and Prefect starts its own when a client first needs one."""
    global _server
    server = _server
    if server is None or not server.answered:
        if server is not None:
            server.stop()
        _server = None
        return
    from prefect.context import refresh_global_settings_context

    os.environ["PREFECT_API_URL"] = server.api_url  # also for `batch serve`'s next job
    os.environ[_TEMPORARY_URL] = server.api_url  # for `--workers`' processes
    refresh_global_settings_context()
    _without_heartbeats()


def for_a_worker() -> None:
    """In a worker process of a run (``--workers``) that reports to that run's
    temporary server: no heartbeats either (see ``_without_heartbeats``)."""
    url = os.environ.get("PREFECT_API_URL", "").rstrip("/")  # httpx's base_url ends in /
    if url and url == os.environ.get(_TEMPORARY_URL, "").rstrip("/"):
        _without_heartbeats()


def _without_heartbeats() -> None:
    """No flow-run heartbeats to this server. They let a lasting server mark a flow run
    whose process died as crashed; this one dies with the process. And a flow's end
    waits for its heartbeat thread to wake (it sleeps a second at a time): half a
    second, on average, at the end of every run. Set in the global settings, as
    ``refresh_global_settings_context`` sets them (an environment variable cannot
    say "none")."""
    import prefect.context as context
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    known = context.GLOBAL_SETTINGS_CONTEXT
    settings = known.settings.copy_with_update(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})
    context.GLOBAL_SETTINGS_CONTEXT = context.SettingsContext(
        profile=known.profile, settings=settings
    )


def gone() -> bool | None:
    """Whether the temporary server this process started has exited; None if none was."""
    if _server is not None:
        return _server.process.poll() is not None
    module = sys.modules.get("prefect.server.api.server")  # one Prefect started itself
    server = getattr(module, "SubprocessASGIServer", None)
    process = getattr((getattr(server, "_instances", None) or {}).get(None), "server_process", None)
    return None if process is None else process.poll() is not None


def _ours() -> bool:
    """Whether nightshift starts the server: no ``PREFECT_API_URL``, Prefect allowed to
    start one, and no settings context of the caller's (``temporary_settings``) that a
    changed global setting would not reach."""
    from prefect.context import SettingsContext
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    if PREFECT_API_URL.value() or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value():
        return False
    return _server is None and SettingsContext.__var__.get(None) is None


def _named_elsewhere() -> bool:
    """Whether the environment or a settings file Prefect reads may name the API server
    or forbid a temporary one, read without importing Prefect: if so, no early launch.
    Cautious by design: any profile, not only the active one, counts."""
    if os.environ.get("PREFECT_API_URL") or any(k in os.environ for k in _EPHEMERAL_SWITCHES):
        return True
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml")
    return (
        Path("prefect.toml").exists()
        or _mentions(profiles, _SERVER_NAMED)
        or _mentions(Path(".env"), _SERVER_NAMED)
        or _mentions(Path("pyproject.toml"), re.compile(r"\[tool\.prefect"))
    )


# Prefect's switch for a temporary server, by its name and its alias
_EPHEMERAL_SWITCHES = ("PREFECT_SERVER_ALLOW_EPHEMERAL_MODE", "PREFECT_SERVER_EPHEMERAL_ENABLED")
_SERVER_NAMED = re.compile(
    r"PREFECT_API_URL|(ALLOW_EPHEMERAL_MODE|EPHEMERAL_ENABLED)\s*=\s*[\"']?(false|0|off|no|f|n)\b",
    re.I,
)


def _mentions(path: Path, pattern: re.Pattern) -> bool:
    try:
        return pattern.search(path.expanduser().read_text()) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(port: int, settings: bool = True, quiet: bool = False) -> subprocess.Popen:
    """The server process, as ``SubprocessASGIServer._run_uvicorn_command`` starts it.
    ``settings``: pass this process's Prefect settings on, as Prefect does (they come
    from this environment and files the server reads too, unless set in this process,
    which an early launch comes before). ``quiet``: its output goes nowhere (else where
    this process's goes: the screen, or the run's engine log)."""
    output = subprocess.DEVNULL if quiet else None
    env = {
        **os.environ,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT__SERVER_EPHEMERAL": "1",
        "PREFECT__SERVER_FINAL": "1",
        **(_settings_environment() if settings else {}),
    }
    package = Path(importlib.util.find_spec("prefect").origin).parent  # not imported
    command = [
        *(sys.executable, "-m", "uvicorn", "--app-dir", str(package.parent)),
        *("--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"),
        *("--port", str(port), "--log-level", "error", "--lifespan", "on"),
    ]
    return processes.lasting_thread_call(
        lambda: subprocess.Popen(
            command,
            env=env,
            start_new_session=True,
            stdout=output,
            stderr=output,
            preexec_fn=processes.die_with_this_process(),  # one prctl call: safe after fork
        )
    )


def _settings_environment() -> dict[str, str]:
    from prefect.settings import get_current_settings

    return get_current_settings().to_environment_variables(exclude_unset=True)
