"""Where nightshift's own lines go: the terminal, while the engine's output goes to a log.

vLLM and the libraries under it print from the engine's child processes and from C code
(Triton's backend notice, ``FutureWarning`` tracebacks, NUMA binding warnings), so
Python-level filters cannot catch it all. ``engine_output_to`` therefore points the
process's file descriptors 1 and 2 at a log file, which child processes inherit, and
keeps a stream to the real terminal for nightshift's progress bars and warnings
(``screen()``). Everything else that was printed is in the log, whose path the summary
names.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

_screen: TextIO | None = None


def screen() -> TextIO:
    """The stream for nightshift's own lines: the terminal's stderr."""
    return _screen if _screen is not None else sys.stderr


@contextlib.contextmanager
def engine_output_to(log_path: Path) -> Iterator[Path]:
    """Send everything written to fd 1 and 2 (this process and the engine processes it
    starts) to ``log_path`` until the block ends; ``screen()`` still reaches the terminal."""
    global _screen
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    previous = _screen
    _screen = os.fdopen(os.dup(saved[2]), "w", buffering=1)
    streams = sys.stdout, sys.stderr
    try:
        with open(log_path, "ab") as log:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
        # Python-level writers too, in case sys.stdout/stderr were not fds 1 and 2.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        yield log_path
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = streams
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        with contextlib.suppress(Exception):
            _screen.close()
        _screen = previous


class ScreenHandler(logging.StreamHandler):
    """A log handler that writes to ``screen()`` as it is at each record."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = screen()  # not setStream: it would flush a stream already closed
        super().emit(record)


def kept_log(log_path: Path) -> Path | None:
    """``log_path`` when anything was written to it; else None, the empty file (and its
    folder, when that is empty too) removed: a run whose engine printed nothing (the fake
    engine) names no log and leaves none behind."""
    with contextlib.suppress(OSError):
        if log_path.stat().st_size:
            return log_path
        log_path.unlink()
        log_path.parent.rmdir()  # only if nothing else is in it
    return None
