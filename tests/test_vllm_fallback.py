"""FP8 KV fallback logic of the vLLM adapter, without starting an engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nightshift.engines import vllm_engine
from nightshift.errors import EngineError
from nightshift.jobs.loading import validate_spec
from nightshift.running.engines import start_vllm

from .conftest import spec_dict


def fake_llm(kv_cache_dtype: str) -> SimpleNamespace:
    cache = SimpleNamespace(
        cache_dtype=kv_cache_dtype, num_gpu_blocks=10, block_size=128, enable_prefix_caching=True
    )
    config = SimpleNamespace(cache_config=cache, scheduler_config=SimpleNamespace(max_num_seqs=8))
    return SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=config))


@pytest.fixture
def spec(tmp_path):
    return validate_spec(spec_dict("model", "in", tmp_path / "out"))


def test_capable_hardware_gets_fp8(spec, monkeypatch):
    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    monkeypatch.setattr(vllm_engine, "_start_llm", lambda args: fake_llm(args["kv_cache_dtype"]))
    engine = start_vllm(spec)
    assert engine.info.kv_cache_dtype == "fp8" and "kv_cache_fallback" not in engine.info.settings


def test_an_fp8_start_failure_retries_without_fp8_and_records_why(spec, monkeypatch):
    started = []

    def start(args):
        started.append(args["kv_cache_dtype"])
        if args["kv_cache_dtype"] == "fp8":
            raise EngineError("vLLM could not start: kernel missing")
        return fake_llm(args["kv_cache_dtype"])

    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    engine = start_vllm(spec)
    assert started == ["fp8", "auto"]
    assert engine.info.kv_cache_dtype == "auto"
    assert "kernel missing" in engine.info.settings["kv_cache_fallback"]


def test_a_failure_without_fp8_is_not_retried(spec, monkeypatch):
    def start(args):
        raise EngineError("vLLM could not start: out of memory")

    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    auto = validate_spec({**spec.model_dump(by_alias=True), "engine": {"kv_cache_dtype": "auto"}})
    with pytest.raises(EngineError, match="out of memory"):
        start_vllm(auto)
