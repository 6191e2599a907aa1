"""What a vLLM start needs beyond ``vllm.LLM(**args)``: the platform's own choices, the
start-up timeout, telling an FP8 KV failure from any other, what the engine chose, and
(before any of it) that ``engine.extra`` names only vLLM's own arguments.

- **Platform choices** (``cpu_choices``): on a CPU, float32 weights where it
  has no bf16 units and eager mode, unless the spec sets them; on a GPU nothing (vLLM
  picks bf16, CUDA graphs and its batch limits for the card).
- **Start-up timeout**: vLLM's front end waits ``VLLM_ENGINE_READY_TIMEOUT_S`` (600 s)
  for the engine core's READY, which comes after weight loading, memory profiling,
  torch.compile and CUDA-graph capture (vllm 0.33.0 v1/engine/core_client.py:760-772).
  ``run.startup_timeout_s`` sets it; vLLM reads it once, at import, into
  ``core_client``'s own name, so that name is set too.
- **FP8 failures**: a start that fails with an FP8 KV cache is retried without one only
  when vLLM's error says FP8 is the cause (``FP8_FAILURE``). An engine core that fails
  on a GPU reports only "Engine core initialization failed" to the front end (the cause
  is in the engine's log), so there a failed start is an error that says where to look,
  not a second start of minutes that would fail alike.
"""

from __future__ import annotations

import difflib
import os
import re
from typing import Any

from nightshift.errors import EngineError, SpecError

READY_TIMEOUT = "VLLM_ENGINE_READY_TIMEOUT_S"


class EngineStartupTimeout(EngineError):
    """The engine was not ready within ``run.startup_timeout_s``."""


# vLLM 0.33's own words when a KV cache dtype is what fails (attention backend
# selection, vllm/v1/attention/backend.py:307, platforms/cpu.py:160-194,
# v1/attention/backends/cpu_attn.py:539-551 and the FP8 kernels' own checks).
FP8_FAILURE = re.compile(
    r"kv_cache_dtype not supported"
    r"|kv-cache-dtype fp8\S* is not supported"
    r"|FP8 KV cache (on CPU )?requires"
    r"|fp8 kv is not supported"
    r"|Unsupported FP8 dtype|Unrecognized FP8 dtype"
    r"|FP8 FlashAttention MLA not yet supported",
    re.IGNORECASE,
)


def is_fp8_failure(exc: BaseException) -> bool:
    """Whether a failed start's error (with its causes) names the FP8 KV cache."""
    seen: BaseException | None = exc
    for _ in range(8):  # the chain vLLM and nightshift wrap it in
        if seen is None:
            return False
        if FP8_FAILURE.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def platform_choices(args: dict[str, Any]) -> dict[str, str]:
    """Set in ``args`` what this platform needs that the spec left unset; the choices
    with their reasons (none on a GPU)."""
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return {}
    bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return cpu_choices(args, has_bf16=bool(bf16))


def set_startup_timeout(seconds: float) -> None:
    """vLLM's engine-ready wait, in whole seconds, for this start and its processes."""
    os.environ[READY_TIMEOUT] = str(max(1, round(seconds)))
    try:
        from vllm.v1.engine import core_client
    except ImportError:
        return
    if hasattr(core_client, "VLLM_ENGINE_READY_TIMEOUT_S"):  # bound at vLLM's import
        core_client.VLLM_ENGINE_READY_TIMEOUT_S = max(1, round(seconds))


def one_line(exc: BaseException) -> str:
    """An error's first line (vLLM's messages run to tracebacks and hints)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def engine_chose(llm: Any) -> dict[str, Any]:
    """What the engine runs with, as it reports it: dtype, eager mode, batch limits,
    block size and KV cache dtype (its defaults for the hardware included)."""
    config = llm.llm_engine.vllm_config
    model = getattr(config, "model_config", None)
    scheduler = getattr(config, "scheduler_config", None)
    cache = config.cache_config
    return {
        "dtype": str(getattr(model, "dtype", "")).removeprefix("torch.") or None,
        "enforce_eager": getattr(model, "enforce_eager", None),
        "max_num_seqs": getattr(scheduler, "max_num_seqs", None),
        "max_num_batched_tokens": getattr(scheduler, "max_num_batched_tokens", None),
        "block_size": cache.block_size,
        "kv_cache_dtype": str(cache.cache_dtype),
    }


def cpu_choices(args: dict[str, Any], has_bf16: bool) -> dict[str, str]:
    """On a CPU: what nightshift sets in ``args`` (vllm.LLM's) that the spec left to the
    platform, each with the reason the report gives."""
    chosen = {}
    if args.get("dtype", "auto") == "auto" and not has_bf16:
        args["dtype"] = "float32"
        chosen["dtype"] = "float32: this CPU has no bf16 units (AVX512-BF16 or AMX)"
    if "enforce_eager" not in args:
        args["enforce_eager"] = True
        chosen["enforce_eager"] = "true: on a CPU compiling costs more start-up than it saves"
    return chosen


def check_engine_extra(extra: dict[str, Any]) -> None:
    """Refuse an ``engine.extra`` key vLLM does not know, before any planning or start-up."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for name in extra:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}?" if close else "see vLLM's engine arguments"
            raise SpecError(f"engine.extra.{name}", "is not a vLLM engine argument", hint)
