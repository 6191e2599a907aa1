"""The spec's ``capacity`` section: GPUs beyond the table, efficiency factors, output length."""

from __future__ import annotations

from pydantic import Field

from nightshift.capacity.gpus import GpuSpec, _Section

# Calibrated once against the published figures in capacity/published.py (see
# docs/capacity.md): the same two factors for every GPU, model and engine.
BANDWIDTH_EFFICIENCY = 0.64
COMPUTE_EFFICIENCY = 0.54


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
    output_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Expected output tokens per record for the prediction; unset: "
        "sampling.max_tokens (an upper bound), or the label length for classify.",
    )
