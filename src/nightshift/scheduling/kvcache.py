"""What the planner assumes about the engine's KV cache: block size and capacity.

Both feed the reuse prediction only; the run reports what the engine really had.
"""

from __future__ import annotations

from nightshift.capacity.shape import kv_width, local_config, model_shape
from nightshift.engines.tokenizer import model_source
from nightshift.jobs.spec import JobSpec

CPU_BLOCK_SIZE = 128  # vLLM's CPU backend
GPU_BLOCK_SIZE = 16  # vLLM's default on GPUs
FAKE_BLOCK_SIZE = 16  # the fake engine's default


def has_gpu() -> bool:
    """Whether this host gives its engines a GPU: the one answer placement gives too
    (an inherited CUDA_VISIBLE_DEVICES, else nvidia-smi's list; empty or -1: none)."""
    from nightshift.engines.devices import given_devices

    return given_devices() is not None


def block_size(spec: JobSpec) -> int:
    """The KV block size the engine will use (``plan.block_size``: the one the machine
    that runs the plan will use, when it is not this one)."""
    if spec.engine.block_size is not None:
        return spec.engine.block_size
    if spec.plan.block_size is not None:
        return spec.plan.block_size
    if spec.run.engine == "fake":
        return FAKE_BLOCK_SIZE
    return GPU_BLOCK_SIZE if has_gpu() else CPU_BLOCK_SIZE


def kv_cache_tokens(spec: JobSpec) -> int | None:
    """Tokens the KV cache holds, when the spec and the model's config say; else None."""
    blocks = spec.engine.extra.get("num_gpu_blocks_override")
    if isinstance(blocks, int) and blocks > 0:
        return blocks * block_size(spec)
    if has_gpu():
        return None  # depends on the GPU's free memory, known only once the engine starts
    per_token = kv_bytes_per_token(spec)
    return spec.engine.cpu_kv_cache_gib * 2**30 // per_token if per_token else None


def kv_bytes_per_token(spec: JobSpec) -> int | None:
    """Key and value bytes one token takes across all layers, from the model's config."""
    config = local_config(model_source(spec.model.path))
    try:
        shape = model_shape(config, spec.model.dtype) if config else None
    except ValueError:
        return None
    width = kv_width(spec.engine.kv_cache_dtype, config or {}, spec.model.dtype)
    return shape.kv_bytes_per_token(width) if shape else None
