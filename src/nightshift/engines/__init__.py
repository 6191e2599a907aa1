"""Generation engines behind one small protocol. Only this package imports vLLM, lazily."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.engines.base import Engine
    from nightshift.jobs.spec import JobSpec


def _vllm(spec: JobSpec) -> Engine:
    from nightshift.engines.vllm_engine import VllmEngine

    return VllmEngine.from_spec(spec)


def _fake(spec: JobSpec) -> Engine:
    from nightshift.engines.fake import FakeEngine

    return FakeEngine()


ENGINES: dict[str, Callable[[JobSpec], Engine]] = {"vllm": _vllm, "fake": _fake}


def build_engine(spec: JobSpec) -> Engine:
    return ENGINES[spec.run.engine](spec)
