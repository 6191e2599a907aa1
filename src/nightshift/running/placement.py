"""An engine on devices it holds (``engines.devices``), whichever engine the spec names.

Before an engine starts, it takes ``engine.tensor_parallel_size`` of the devices the host
gives (waiting while other jobs' engines hold them) and starts with
``CUDA_VISIBLE_DEVICES`` set to them; it lets them go only once it is closed and its
processes are gone. The fake engine goes through the same steps, so placement is tested
on a simulated GPU host (a ``CUDA_VISIBLE_DEVICES`` given, a stub ``nvidia-smi``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

from nightshift.engines.base import Engine
from nightshift.engines.devices import Placement, given_devices, hold_devices, visible_devices
from nightshift.engines.processes import start_was_killed
from nightshift.errors import EngineFatalError

NO_GPU = "none: no GPU given (no CUDA_VISIBLE_DEVICES, no nvidia-smi): the engine ran on the CPU"


class PlacedEngine:
    """An engine and the devices it holds: ``placement`` is the ``CUDA_VISIBLE_DEVICES``
    it was started with; ``close`` lets the devices go after the
    engine is shut down. Everything else is the engine's own."""

    def __init__(self, engine: Engine, placement: Placement) -> None:
        self._engine = engine
        self._placement = placement
        self.placement = placement.visible

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    @property
    def info(self):  # noqa: ANN201 (the engine's EngineInfo)
        return self._engine.info

    def run(self, requests, sampling):  # noqa: ANN001, ANN201 (the Engine protocol's)
        return self._engine.run(requests, sampling)

    def stats(self):  # noqa: ANN201
        return self._engine.stats()

    def close(self) -> None:
        # vLLM's waits until its processes are gone; if one outlives the wait it raises,
        # and the devices stay held (by this process) rather than go to a new engine.
        self._engine.close()
        self._placement.release()


def start_placed(count: int, start: Callable[[], Engine]) -> Engine:
    """``start()`` on ``count`` devices this process holds, if the host gives any (else
    the engine as ``start`` makes it). A start abandoned while it waits for devices (a
    stop: ``engines.processes.start_was_killed``) raises ``EngineFatalError``."""
    given = given_devices()
    if given is None:
        return start()
    try:
        placement = hold_devices(count, given, start_was_killed)
    except InterruptedError as exc:
        raise EngineFatalError(str(exc)) from exc
    try:
        with visible_devices(placement):
            return PlacedEngine(start(), placement)
    except BaseException:
        placement.release()
        raise


def placement_entry(engine: Engine, worker: str = "job") -> dict[str, Any]:
    """One engine's line of report.json's ``placement``."""
    return {
        "worker": worker,
        "host": socket.gethostname(),
        "cuda_visible_devices": getattr(engine, "placement", None),
    }


def placement_section(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """report.json's ``placement``: the devices each engine (worker) ran on, as the
    ``CUDA_VISIBLE_DEVICES`` it was given; a note when no GPU was given."""
    section: dict[str, Any] = {"engines": entries}
    if not entries:
        section["note"] = "no engine started in this run"
    elif all(e["cuda_visible_devices"] is None for e in entries):
        section["note"] = NO_GPU
    return section
