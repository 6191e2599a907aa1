"""Published throughput measurements the planner is calibrated and validated against.

Each figure is a model, GPUs, fixed input and output lengths and the output tokens per
second measured, with its source. The model shapes are the fields of the models'
config.json that the planner reads. ``benchmarks/capacity_validation.py`` writes the
table in docs/capacity.md from this list; tests/test_capacity.py checks the error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightshift.capacity.gpus import GPUS
from nightshift.capacity.predict import EngineSettings, Prediction, fixed_length_workload, predict
from nightshift.capacity.roofline import hardware
from nightshift.capacity.settings import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY
from nightshift.capacity.shape import model_shape

_LLAMA = {"model_type": "llama", "tie_word_embeddings": False}
LLAMA_2_7B = {
    **_LLAMA,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "torch_dtype": "float16",
}
LLAMA_3_8B = {
    **_LLAMA,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}
LLAMA_3_70B = {
    **_LLAMA,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}
MODELS: dict[str, dict[str, Any]] = {
    "Llama-2-7B": LLAMA_2_7B,
    "Llama-3.1-8B": LLAMA_3_8B,
    "Llama-3.3-70B": LLAMA_3_70B,
}

TRTLLM_2025 = (
    "https://github.com/NVIDIA/TensorRT-LLM/blob/00f37686aa854010d68bcbd0f4ab000221541ca6/"
    "docs/source/performance/perf-overview.md"
)
TRTLLM_2023 = (
    "https://github.com/NVIDIA/TensorRT-LLM/blob/138f96d45f90b9667426f7c47297d8c06bafac73/"
    "docs/source/performance.md"
)
# The 2025 table does not publish batch limits: in-flight batching up to these, and
# memory decides the batch wherever it binds first.
DEFAULT_SEQS, DEFAULT_TOKENS = 1024, 8192


@dataclass(frozen=True)
class Published:
    model: str  # a key of MODELS
    weights: str  # fp8 or float16/bfloat16
    kv_cache: str  # fp8 or auto
    gpu: str
    gpus: int
    input_tokens: int
    output_tokens: int
    output_tokens_per_s: float  # measured, all GPUs together
    requests: int
    engine: str
    source: str
    max_num_seqs: int = DEFAULT_SEQS
    extra: dict[str, Any] = field(default_factory=dict)


def _trt_2025(model: str, gpu: str, gpus: int, isl: int, osl: int, tps: float, n: int):
    engine = "TensorRT-LLM 1.0, in-flight batching"
    return Published(model, "fp8", "fp8", gpu, gpus, isl, osl, tps, n, engine, TRTLLM_2025)


def _trt_2023(gpu: str, fp8: bool, batch: int, isl: int, osl: int, tps: float, version: str):
    weights, kv = ("fp8", "fp8") if fp8 else ("float16", "auto")
    engine = f"TensorRT-LLM {version}, static batch of {batch}"
    return Published(
        "Llama-2-7B", weights, kv, gpu, 1, isl, osl, tps, batch * 10, engine, TRTLLM_2023, batch
    )


FIGURES: list[Published] = [
    _trt_2025("Llama-3.1-8B", "h100", 1, 128, 128, 28312, 30000),
    _trt_2025("Llama-3.1-8B", "h100", 1, 128, 2048, 22714, 3000),
    _trt_2025("Llama-3.1-8B", "h100", 1, 2048, 128, 3450, 3000),
    _trt_2025("Llama-3.1-8B", "h100", 1, 1000, 1000, 15220, 3000),
    _trt_2025("Llama-3.1-8B", "h100", 1, 5000, 500, 3459, 1500),
    _trt_2025("Llama-3.1-8B", "h200", 1, 2048, 2048, 12194, 1500),
    _trt_2025("Llama-3.1-8B", "h200", 1, 500, 2000, 20770, 3000),
    _trt_2025("Llama-3.3-70B", "h200", 1, 1000, 1000, 2909, 3000),
    _trt_2025("Llama-3.3-70B", "h200", 1, 2048, 128, 442, 3000),
    _trt_2025("Llama-3.3-70B", "h100", 2, 1000, 1000, 4205, 3000),
    _trt_2025("Llama-3.3-70B", "h100", 2, 128, 2048, 6651, 3000),
    _trt_2023("a100", False, 384, 128, 128, 5586, "0.6.1"),
    _trt_2023("a100", False, 60, 128, 2048, 1928, "0.6.1"),
    _trt_2023("a100", False, 52, 2048, 128, 591, "0.6.1"),
    _trt_2023("h100", True, 768, 128, 128, 19694, "0.6.1"),
    _trt_2023("l40s", True, 64, 128, 128, 3240, "0.5"),
    _trt_2023("l40s", True, 64, 128, 2048, 1622, "0.5"),
    _trt_2023("l40s", True, 32, 2048, 128, 581, "0.5"),
]


def predict_figure(
    row: Published,
    bandwidth_eff: float = BANDWIDTH_EFFICIENCY,
    compute_eff: float = COMPUTE_EFFICIENCY,
) -> Prediction:
    """The planner's prediction for one published run, with the given efficiencies."""
    config = MODELS[row.model]
    shape = model_shape(config, "fp8" if row.weights == "fp8" else row.weights)
    hw = hardware(row.gpu, GPUS[row.gpu], row.gpus, shape.weight_bytes, bandwidth_eff, compute_eff)
    work = fixed_length_workload(row.requests, row.input_tokens, row.output_tokens)
    settings = EngineSettings(row.kv_cache, row.max_num_seqs, DEFAULT_TOKENS, 0.9)
    kv = 1 if row.kv_cache == "fp8" else 2
    return predict(shape, hw, work, settings, kv)


def error(row: Published, prediction: Prediction) -> float:
    """Predicted over measured output tokens/s, less one (+0.10: 10% too optimistic)."""
    return prediction.output_tokens_per_s / row.output_tokens_per_s - 1
