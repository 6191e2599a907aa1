"""The spec's ``capacity`` section: GPUs beyond the table, efficiency factors, output length."""

from __future__ import annotations

from pydantic import Field

from nightshift.capacity.gpus import GpuSpec, _Section

# Calibrated once against the published figures in capacity/published.py (see
# docs/capacity.md): the same two factors for every GPU, model and engine.
BANDWIDTH_EFFICIENCY = 0.64
COMPUTE_EFFICIENCY = 0.54
# The engine's own time per pass, on top of the roofline: vLLM's scheduler, input
# preparation, launches and sampling. An assumption (a few ms with CUDA graphs), not yet
# measured on a GPU with vLLM; it sets the floor for small models and tiny batches.
STEP_OVERHEAD_S = 0.003


class CapacitySpec(_Section):
    gpus: dict[str, GpuSpec] = Field(
        default_factory=dict,
        description="GPUs to add to the planner's table or to replace in it, by name "
        "(memory_gib, bandwidth_gbs, bf16_tflops, fp8_tflops).",
    )
    bandwidth_efficiency: float = Field(
        default=BANDWIDTH_EFFICIENCY,
        gt=0,
        le=1,
        description="Share of the data-sheet memory bandwidth a pass reaches.",
    )
    compute_efficiency: float = Field(
        default=COMPUTE_EFFICIENCY,
        gt=0,
        le=1,
        description="Share of the data-sheet dense tensor FLOP/s a pass reaches.",
    )
    step_overhead_s: float = Field(
        default=STEP_OVERHEAD_S,
        ge=0,
        description="The engine's own seconds per pass (scheduling, launches, sampling), "
        "added to each prefill and decode pass: the floor under a small model's step.",
    )
    output_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Expected output tokens per record for the prediction; unset: "
        "sampling.max_tokens (an upper bound), or the label length for classify.",
    )
