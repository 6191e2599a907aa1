"""The engine kept warm between runs of one process (``nightshift batch serve`` runs
batch after batch), and the loans of it.

A run whose engine settings match the warm engine's borrows it (``_Lent``) instead of
starting one, and hands it back when it ends normally; a loan that was discarded,
interrupted or killed closes the engine instead, so a later run never gets a broken one.
Which settings match, and how an engine starts, are ``running.engines``' to say: the
pool only compares the key it is given and calls the start it is given.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from nightshift.engines.base import Engine, EngineStats


class WarmEngines:
    """One engine kept up between runs in this process (``nightshift batch serve`` runs
    batch after batch): a run whose spec asks for the same engine borrows it instead of
    starting one. A run that ends normally hands it back; one that discards, interrupts
    or kills it (a crash, a stop) closes it, so a later run never gets a broken engine."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def lend(self, key: str, start: Callable[[], Engine]) -> Engine:
        """The warm engine if it was started under ``key``, else a new one from ``start``
        (the warm one of other settings is closed first)."""
        with self._lock:
            engine, self._engine = (self._engine, None) if self._key == key else (None, None)
            if engine is None:
                self.close()
                engine = start()
            self._key = key
            return _Lent(engine, self)

    def give_back(self, engine: Engine) -> None:
        with self._lock:
            if self._engine is not None:  # a second run borrowed meanwhile: keep one
                engine.close()
            else:
                self._engine = engine

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.close()


@contextlib.contextmanager
def warm_engines() -> Iterator[WarmEngines]:
    """Within the block, runs of this process share a warm engine (``WarmEngines``)."""
    global _warm
    _warm = WarmEngines()
    try:
        yield _warm
    finally:
        warm, _warm = _warm, None
        warm.close()


_warm: WarmEngines | None = None


def warm_pool() -> WarmEngines | None:
    """The pool runs of this process borrow from now (``warm_engines``), if any."""
    return _warm


class _Lent:
    """A borrowed engine: ``stats`` count from the loan, ``close`` hands it back."""

    def __init__(self, engine: Engine, owner: WarmEngines) -> None:
        self._engine, self._owner, self._broken = engine, owner, False
        self.info = engine.info
        reset = getattr(engine, "reset_peaks", None)  # engines that keep peaks: this loan's own
        if reset:
            reset()
        self._base = engine.stats()

    def run(self, requests, sampling):
        return self._engine.run(requests, sampling)

    def stats(self) -> EngineStats:
        return self._engine.stats().since(self._base)

    def discard(self) -> None:
        self._broken = True

    def interrupt(self) -> None:
        self._broken = True
        getattr(self._engine, "interrupt", lambda: None)()

    def kill(self) -> None:
        self._broken = True
        getattr(self._engine, "kill", lambda: None)()

    def close(self) -> None:
        if self._broken:
            self._engine.close()
        else:
            self._owner.give_back(self._engine)

    def __getattr__(self, name: str) -> Any:  # engine-specific extras (``_llm``...)
        return getattr(self._engine, name)
