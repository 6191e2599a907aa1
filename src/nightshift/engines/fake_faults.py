"""What a fake engine is told to get wrong (``engines.fake``), for the runner's tests of
failure: per request, every n-th taken returned aborted (as vLLM's ``abort``) or failed
with a retryable error (as its ``error`` finish), or the records ``fail_when`` names
failed; per engine, a death (EngineFatalError) once after so many results, as a crashed
engine process's, a hang once after so many, as a frozen engine core's (its stall watch,
vLLM's ``StallWatch``, ends it as EngineStalledError), and a start-up that lasts while a
file exists (NIGHTSHIFT_FAKE_START_HOLD), run by a child process as vLLM's engine core
runs its start-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from nightshift.engines.base import EngineRequest, EngineResult
from nightshift.engines.fake_answers import prompt_digest
from nightshift.errors import EngineFatalError, EngineStalledError


class InjectedFaults:
    def __init__(
        self,
        fail_when: Callable[[Sequence[int]], str | None] | None = None,
        die_after: int | None = None,
        abort_every: int | None = None,
        flaky_every: int | None = None,
        hang_after: int | None = None,
        stall_s: float | None = None,
    ) -> None:
        self._fail_when, self._die_after = fail_when, die_after
        self._abort_every, self._flaky_every = abort_every, flaky_every
        self._hang_after, self.stall_s = hang_after, stall_s
        self.per_request = bool(fail_when or abort_every or flaky_every)
        self.aborted: list[str] = []  # prompt_digest of each request returned aborted
        self.stalls = 0  # hangs its stall watch ended

    def for_request(self, request: EngineRequest, taken: int) -> EngineResult | None:
        """The failure injected for ``request``, the ``taken``-th; None if none is."""
        if self._abort_every and taken % self._abort_every == 0:
            self.aborted.append(prompt_digest(request.token_ids))
            return EngineResult(request.key, finish_reason="abort", aborted=True)
        if self._flaky_every and taken % self._flaky_every == 0:
            error = "request-level internal error (fake, flaky_every)"
            return EngineResult(request.key, finish_reason="error", error=error, retryable=True)
        error = self._fail_when(list(request.token_ids)) if self._fail_when else None
        if error:
            return EngineResult(key=request.key, error=error, prompt_tokens=len(request.token_ids))
        return None

    def maybe_die(self) -> None:
        """Die here (``die_after``), once: the "fresh engine" after it works."""
        if self._die_after is not None:
            if self._die_after == 0:
                self._die_after = None
                raise EngineFatalError("fake engine died (die_after)")
            self._die_after -= 1

    def maybe_hang(self, interrupted: Callable[[], bool], progress: Callable[[], int]) -> bool:
        """Hang here (``hang_after``) until the stall watch trips (EngineStalledError) or
        ``interrupted()`` (True). ``progress()``: the engine's output tokens so far."""
        if self._hang_after is None or self._hang_after > 0:
            if self._hang_after is not None:
                self._hang_after -= 1
            return False
        self._hang_after = None  # once
        from nightshift.engines.stall import StallWatch

        watch = StallWatch(self.stall_s, progress)
        watch.begin_step()  # a step that never returns
        while not interrupted():
            if watch.stalled():
                self.stalls += 1
                raise EngineStalledError(f"fake engine hung for {self.stall_s:g}s (hang_after)")
            time.sleep(0.02)
        return True


def slow_start(hold: str) -> None:
    """A start-up that lasts while the file ``hold`` exists, in a child process the tests
    of stops and cancels kill."""
    import subprocess
    import sys

    from nightshift.engines.processes import register_starting

    wait = f"import os, time\nwhile os.path.exists({hold!r}): time.sleep(0.05)"
    child = subprocess.Popen([sys.executable, "-c", wait])
    register_starting(lambda: [child.pid])
    if child.wait() != 0:
        raise EngineFatalError("the fake engine was killed while it started")
