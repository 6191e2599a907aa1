"""Small random-weight LoRA adapters for a local Llama model folder.

Tests of multi-adapter runs need real adapters that vLLM's LoRA loader accepts, built locally
in well under a second (there is no hub to download from). This writes one in the standard PEFT
layout -- ``adapter_config.json`` plus ``adapter_model.safetensors`` -- with random A and
non-zero random B matrices, so that each adapter (one per seed) visibly changes greedy answers.
"""

from __future__ import annotations

import json
from pathlib import Path

# Attention and MLP projections of every decoder layer; vLLM packs q/k/v and gate/up itself.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _shapes(config: dict) -> dict[str, tuple[str, int, int]]:
    """Each target module's (submodule, in_features, out_features), from a Llama config."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    return {
        "q_proj": ("self_attn", hidden, heads * head_dim),
        "k_proj": ("self_attn", hidden, kv_heads * head_dim),
        "v_proj": ("self_attn", hidden, kv_heads * head_dim),
        "o_proj": ("self_attn", heads * head_dim, hidden),
        "gate_proj": ("mlp", hidden, inter),
        "up_proj": ("mlp", hidden, inter),
        "down_proj": ("mlp", inter, hidden),
    }


def build_lora_adapter(
    base: Path, directory: Path, seed: int = 0, rank: int = 8, scale: float = 1.0
) -> Path:
    """Write a rank-``rank`` LoRA for the Llama in ``base`` to ``directory``; returns it.

    Deterministic in ``seed``. ``scale`` multiplies B: at 1.0 each adapted projection's update
    is about as large as its input, enough to change a random model's greedy answers; at 0.0
    the adapter is a no-op. vLLM accepts ranks up to its ``max_lora_rank`` (1, 8, 16, 32, ...).
    """
    import torch
    from safetensors.torch import save_file

    config = json.loads((Path(base) / "config.json").read_text())
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for name, (sub, fan_in, fan_out) in _shapes(config).items():
            key = f"base_model.model.model.layers.{layer}.{sub}.{name}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank) * scale / rank**0.5
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, directory / "adapter_model.safetensors"
    )
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": rank,  # scaling alpha / r = 1; the size lives in B
        "target_modules": list(TARGET_MODULES),
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
    }
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")
    return directory
