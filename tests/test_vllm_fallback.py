"""FP8 KV fallback logic of the vLLM adapter, without starting an engine."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from nightshift.engines import vllm_engine
from nightshift.engines.vllm_start import cpu_choices
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


# vLLM 0.33's words when no attention backend takes the KV dtype (platforms/cuda.py:473)
NO_FP8_BACKEND = (
    "No valid attention backend found for cuda with AttentionSelectorConfig(...). "
    "Reasons: {FLASH_ATTN: [kv_cache_dtype not supported], TRITON_ATTN: [compute capability]}."
)


def test_an_fp8_start_failure_retries_without_fp8_and_records_why(spec, monkeypatch):
    started = []

    def start(args):
        started.append(args["kv_cache_dtype"])
        if args["kv_cache_dtype"] == "fp8":
            raise EngineError(f"vLLM could not start: {NO_FP8_BACKEND}")
        return fake_llm(args["kv_cache_dtype"])

    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    engine = start_vllm(spec)
    assert started == ["fp8", "auto"]
    assert engine.info.kv_cache_dtype == "auto"
    assert "kv_cache_dtype not supported" in engine.info.settings["kv_cache_fallback"]


@pytest.mark.parametrize(
    "error",
    [
        "Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        "CUDA error: no kernel image is available for execution on the device",
        "Free memory on device cuda:0 (3.1/79.2 GiB) on startup is less than desired",
    ],
)
def test_a_start_failure_that_is_not_fp8s_is_not_retried_as_a_fallback(spec, monkeypatch, error):
    """On CUDA a failed engine core says nothing of FP8 (a busy GPU, an old driver):
    a second start would fail alike, and the report would blame FP8 for it."""
    started = []

    def start(args):
        started.append(args["kv_cache_dtype"])
        raise EngineError(f"vLLM could not start: {error}")

    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    with pytest.raises(EngineError, match="could not start"):
        start_vllm(spec)
    assert started == ["fp8"]


def test_startup_timeout_sets_vllms_ready_wait_and_fails_in_one_line(spec, monkeypatch):
    from vllm.v1.engine import core_client

    seen = {}

    class LLM:
        def __init__(self, **args):
            seen["env"] = os.environ["VLLM_ENGINE_READY_TIMEOUT_S"]
            seen["module"] = core_client.VLLM_ENGINE_READY_TIMEOUT_S
            raise TimeoutError("Timed out waiting for engine core processes to start.")

    monkeypatch.setattr("vllm.LLM", LLM)
    monkeypatch.setattr(vllm_engine, "engine_cores_die_with_this_process", lambda: None)
    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    monkeypatch.setattr(core_client, "VLLM_ENGINE_READY_TIMEOUT_S", 600)
    monkeypatch.delenv("VLLM_ENGINE_READY_TIMEOUT_S", raising=False)
    timed = validate_spec({**spec.model_dump(by_alias=True), "run": {"startup_timeout_s": 42}})
    with pytest.raises(EngineError) as failed:
        start_vllm(timed)
    assert seen == {"env": "42", "module": 42}
    assert "not ready within 42 s" in str(failed.value) and "run.startup_timeout_s" in str(
        failed.value
    )
    assert "\n" not in str(failed.value)


def test_cpu_gets_float32_and_eager_unless_the_spec_says(spec):
    args = {"dtype": "auto"}
    chosen = cpu_choices(args, has_bf16=False)
    assert args == {"dtype": "float32", "enforce_eager": True}
    assert set(chosen) == {"dtype", "enforce_eager"}
    args = {"dtype": "auto", "enforce_eager": False}
    assert cpu_choices(args, has_bf16=True) == {}  # bf16 units; eager set by the spec
    assert args == {"dtype": "auto", "enforce_eager": False}
    args = {"dtype": "bfloat16"}
    assert "dtype" not in cpu_choices(args, has_bf16=False) and args["dtype"] == "bfloat16"


def test_the_report_says_what_the_engine_chose(spec, monkeypatch):
    monkeypatch.setattr(vllm_engine, "fp8_kv_unsupported_reason", lambda: None)
    given = {}

    def start(args):
        given.update(args)
        return fake_llm(args["kv_cache_dtype"])

    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    data = spec.model_dump(by_alias=True)
    data["model"]["dtype"], data["engine"] = "auto", {"kv_cache_dtype": "fp8"}
    auto = validate_spec(data)
    engine = start_vllm(auto)
    assert "max_num_seqs" not in given and "max_num_batched_tokens" not in given  # vLLM's
    chose = engine.info.settings["chosen"]
    assert chose["max_num_seqs"] == 8 and chose["block_size"] == 128
    assert chose["kv_cache_dtype"] == "fp8"
    # this CPU host: eager always, float32 where it has no bf16 units, each with its reason
    assert given["enforce_eager"] is True
    assert "enforce_eager" in engine.info.settings["platform_choices"]


def test_a_failure_without_fp8_is_not_retried(spec, monkeypatch):
    def start(args):
        raise EngineError("vLLM could not start: out of memory")

    monkeypatch.setattr(vllm_engine, "_start_llm", start)
    auto = validate_spec({**spec.model_dump(by_alias=True), "engine": {"kv_cache_dtype": "auto"}})
    with pytest.raises(EngineError, match="out of memory"):
        start_vllm(auto)
