"""Settings the hardware chooses when a spec leaves them unset (DESIGN invariant 13).

A shipped config names no setting that is right on one platform only: the weights'
dtype (``model.dtype: auto``), eager mode and the batch limits are left to the engine,
which picks them for the hardware it starts on, and the report states what it picked
(``engine.settings.chosen``). On a CPU nightshift picks two of them itself, before
vLLM starts (``engines.vllm_start.cpu_choices``): float32 weights where the CPU has no
bf16 units (a bf16 model's first step took over 5 minutes on such a CPU) and eager mode
(compiling cost a 135M model 447 s of start-up against 44 s eager). Planning, tuning
and the reuse window need numbers for the batch limits before any engine runs:
``batch_limits`` gives the spec's, else vLLM's own default for the device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nightshift.jobs.spec import EngineSpec

# vLLM 0.33's batch limits for the offline LLM class, (max_num_seqs,
# max_num_batched_tokens) (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults):
# GPUs of 70 GiB or more other than the A100 (H100, H200, B200), other GPUs, CPUs.
ENGINE_BATCH_DEFAULTS = {"large-gpu": (1024, 16384), "gpu": (256, 8192), "cpu": (256, 4096)}


def device_class(memory_gib: float | None = None, name: str = "") -> str:
    """The row of ``ENGINE_BATCH_DEFAULTS`` for a GPU of ``memory_gib`` (None: the
    devices this host gives, or the CPU when it gives none; an unknown GPU: large)."""
    if memory_gib is None:
        from nightshift.engines.devices import given_devices

        return "large-gpu" if given_devices() is not None else "cpu"
    return "large-gpu" if memory_gib >= 70 and "a100" not in name.lower() else "gpu"


def batch_limits(engine: EngineSpec, device: str | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) an engine runs with: the spec's, else the
    engine's default on ``device`` (a ``device_class``; None: this host's)."""
    seqs, tokens = ENGINE_BATCH_DEFAULTS[device or device_class()]
    return engine.max_num_seqs or seqs, engine.max_num_batched_tokens or tokens
