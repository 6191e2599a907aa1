"""A model's shape from its config.json: parameters, layers, KV heads, head size, dtype.

Only the config is read, never the weights, so a 70B job can be planned on a laptop.
The parameter count is computed from the dimensions: attention (grouped KV heads), the
MLP (gated, as in Llama, or plain), embeddings and output head, norms, and simple
mixtures of experts (routed experts, optional shared experts). Biases are left out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "bfloat16": 2, "half": 2, "fp8": 1}
# Model families whose MLP is up-projection, activation, down-projection (two matrices);
# every other family is taken to be gated (gate and up projections, three matrices).
PLAIN_MLP = {"gpt2", "gptj", "gpt_neox", "opt", "falcon", "bloom", "phi", "gpt_bigcode", "mpt"}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width, or each routed expert's width for MoE
    vocab: int
    tied_embeddings: bool
    gated_mlp: bool
    weight_bytes: float  # bytes per parameter as stored for inference
    experts: int = 0  # routed experts per layer; 0 for a dense model
    experts_per_token: int = 0
    shared_intermediate: int = 0  # width of the always-on shared expert(s), MoE only

    @property
    def attention_parameters(self) -> int:
        """Q, K, V and output projections of one layer."""
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * (
            self.kv_heads * self.head_dim
        )

    def mlp_parameters(self, width: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * width

    @property
    def expert_parameters(self) -> int:
        """All routed experts of all layers (0 for a dense model)."""
        return self.layers * self.experts * self.mlp_parameters(self.intermediate)

    @property
    def _layer_fixed_parameters(self) -> int:
        """One layer's parameters that every token uses: attention, norms, dense or shared MLP."""
        if self.experts:
            mlp = self.mlp_parameters(self.shared_intermediate) + self.hidden * self.experts
        else:
            mlp = self.mlp_parameters(self.intermediate)
        return self.attention_parameters + mlp + 2 * self.hidden

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        head = 0 if self.tied_embeddings else self.embedding_parameters
        body = self.layers * self._layer_fixed_parameters + self.expert_parameters
        return self.embedding_parameters + head + body + self.hidden

    @property
    def active_parameters(self) -> int:
        """Parameters one token passes through (routed experts: only its own)."""
        if not self.experts:
            return self.parameters
        unused = self.expert_parameters * (1 - self.experts_per_token / self.experts)
        return self.parameters - int(unused)

    @property
    def matmul_parameters(self) -> int:
        """Weights one token multiplies with: its active parameters bar the input lookup,
        plus the output head (which is the embedding itself when the two are tied)."""
        head = self.embedding_parameters if self.tied_embeddings else 0
        return self.active_parameters - self.embedding_parameters + head

    def weights_read_per_pass(self, batch: int) -> float:
        """Bytes of weights one pass reads: every matrix but the input embedding; of the
        routed experts, the share that ``batch`` tokens are expected to touch."""
        head = self.embedding_parameters if self.tied_embeddings else 0
        fixed = self.parameters - self.embedding_parameters + head - self.expert_parameters
        touched = 0.0
        if self.experts:
            touched = 1 - (1 - self.experts_per_token / self.experts) ** max(batch, 1)
        return (fixed + touched * self.expert_parameters) * self.weight_bytes

    @property
    def weights_bytes(self) -> float:
        return self.parameters * self.weight_bytes

    def kv_bytes_per_token(self, width: float) -> int:
        """Key and value bytes one token keeps in the cache, over all layers."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * width)

    @property
    def attention_flops_per_position(self) -> int:
        """FLOPs one query token spends per cached position it attends to (QK and PV)."""
        return 4 * self.layers * self.heads * self.head_dim


def _first(config: dict[str, Any], *names: str) -> Any:
    for name in names:
        if config.get(name) is not None:
            return config[name]
    raise ValueError(f"config.json has none of {', '.join(names)}")


def _experts(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(routed experts, experts per token, expert width, shared expert width)."""
    experts = config.get("num_local_experts") or config.get("num_experts")
    experts = experts or config.get("n_routed_experts") or 0
    if not experts:
        return 0, 0, 0, 0
    width = config.get("moe_intermediate_size") or config["intermediate_size"]
    shared = config.get("shared_expert_intermediate_size") or 0
    shared = shared or (config.get("n_shared_experts") or 0) * width
    return int(experts), int(config["num_experts_per_tok"]), int(width), int(shared)


def weight_bytes(config: dict[str, Any], dtype: str = "auto") -> float:
    """Bytes per stored parameter: the checkpoint's quantization, else the dtype."""
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") == "fp8":
        return 1.0
    if quant.get("bits"):
        return quant["bits"] / 8
    for group in (quant.get("config_groups") or {}).values():
        bits = (group.get("weights") or {}).get("num_bits")
        if bits:
            return bits / 8
    name = dtype if dtype != "auto" else config.get("torch_dtype") or config.get("dtype")
    return DTYPE_BYTES.get(str(name), 2)


def gpu_dtype(config: dict[str, Any], dtype: str = "auto") -> str:
    """The dtype vLLM runs a model in on a GPU: ``auto`` downcasts a float32 checkpoint
    to the platform's first dtype, bfloat16 (vllm 0.33.0 config/model.py:2440-2442)."""
    name = config.get("torch_dtype") or config.get("dtype")
    return "bfloat16" if dtype == "auto" and str(name) == "float32" else dtype


def kv_width(kv_cache_dtype: str, config: dict[str, Any], dtype: str = "auto") -> int:
    """Bytes per cached key or value element: 1 for an FP8 cache, else the model's dtype."""
    if kv_cache_dtype.startswith("fp8"):
        return 1
    name = dtype if dtype != "auto" else config.get("torch_dtype") or config.get("dtype")
    return int(DTYPE_BYTES.get(str(name), 2))


def model_shape(config: dict[str, Any], dtype: str = "auto") -> ModelShape:
    """The shape of the model a config.json describes; ``ValueError`` naming a missing key."""
    config = {**config, **(config.get("text_config") or {})}
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(config, "num_attention_heads", "n_head"))
    experts, per_token, width, shared = _experts(config)
    try:
        return ModelShape(
            layers=int(_first(config, "num_hidden_layers", "n_layer")),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=width or int(config.get("intermediate_size") or 4 * hidden),
            vocab=int(_first(config, "vocab_size")),
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            gated_mlp=config.get("model_type") not in PLAIN_MLP,
            weight_bytes=weight_bytes(config, dtype),
            experts=experts,
            experts_per_token=per_token,
            shared_intermediate=shared,
        )
    except (TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"config.json has an unusable dimension: {exc}") from None


def local_config(model_dir: str | Path) -> dict[str, Any] | None:
    """The config.json in a local model folder, or None when there is none."""
    path = Path(model_dir) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None
