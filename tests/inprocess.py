"""vLLM engines that run in the test's own process: for a reference to compare with
(vLLM's own ``LLM.generate`` or ``LLM.embed``) and for the module-wide engines that
answer many small tests. A nightshift run never starts its engine this way.

On a CPU, vLLM starts each engine as three processes, each importing vLLM (about 12 s
each here): the front end, the engine core and a worker (its CPU backend forces the
multiprocess executor, vllm/platforms/cpu.py). With ``VLLM_ENABLE_V1_MULTIPROCESSING=0``
the core and the worker run in the caller's process, which has vLLM imported already:
a start of about 3 s, not 25. What the tests here compare (answers, vectors, log
probabilities, cache counts) is the engine's, the same in either form; how nightshift
starts, watches, kills and replaces engine processes is what every other real-engine
test exercises, through the run path users run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_KEY = "VLLM_ENABLE_V1_MULTIPROCESSING"


@contextlib.contextmanager
def vllm_in_this_process() -> Iterator[None]:
    """Engines started inside the block run in this process. vLLM caches its
    environment once an engine core starts (``envs.enable_envs_cache``); that cache is
    dropped on the way out, so an engine started after the block is a separate process
    again, as nightshift starts them."""
    from vllm import envs

    before = os.environ.get(_KEY)
    os.environ[_KEY] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_KEY, None)
        else:
            os.environ[_KEY] = before
        getattr(envs, "disable_envs_cache", lambda: None)()
