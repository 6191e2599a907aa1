"""Generation engines behind one small protocol. Only this package imports vLLM, lazily."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.engines.base import Engine
    from nightshift.jobs.spec import JobSpec


def check_engine_spec(spec: JobSpec) -> None:
    """Checks that need the engine's own package, run before planning so mistakes show early."""
    if spec.run.engine == "vllm":
        from nightshift.engines.vllm_engine import check_engine_extra

        check_engine_extra(spec)


def _vllm(spec: JobSpec) -> Engine:
    from nightshift.engines.vllm_engine import VllmEngine

    return VllmEngine.from_spec(spec)


def _fake(spec: JobSpec) -> Engine:
    from nightshift.engines.fake import FakeEngine

    return FakeEngine.from_environment(block_size=spec.engine.block_size or 16)


ENGINES: dict[str, Callable[[JobSpec], Engine]] = {"vllm": _vllm, "fake": _fake}


def build_engine(spec: JobSpec) -> Engine:
    return ENGINES[spec.run.engine](spec)
