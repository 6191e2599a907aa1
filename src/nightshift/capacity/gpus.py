"""The GPUs the planner knows, from their makers' data sheets, and the spec section that
overrides them.

Figures are dense (no sparsity): data sheets quote tensor FLOP/s "with sparsity", which
is twice what a dense matrix multiply can reach. Memory is what ``nvidia-smi`` reports as
total, in GiB; bandwidth is the data sheet's, in GB/s (1e9 bytes).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from nightshift.errors import SpecError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class GpuSpec(_Section):
    memory_gib: float = Field(gt=0, description="Memory of one GPU in GiB, as nvidia-smi reports.")
    bandwidth_gbs: float = Field(gt=0, description="Memory bandwidth of one GPU in GB/s.")
    bf16_tflops: float = Field(gt=0, description="Dense BF16/FP16 tensor TFLOP/s of one GPU.")
    fp8_tflops: float | None = Field(
        default=None, gt=0, description="Dense FP8 tensor TFLOP/s; none where FP8 has no units."
    )
    source: str = Field(default="spec", description="Where the figures come from.")


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        memory_gib=79.6,
        bandwidth_gbs=3350,
        bf16_tflops=989,
        fp8_tflops=1979,
        source="H100 SXM 80GB: https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200": GpuSpec(
        memory_gib=139.8,
        bandwidth_gbs=4800,
        bf16_tflops=989,
        fp8_tflops=1979,
        source="H200 SXM 141GB: https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "a100": GpuSpec(
        memory_gib=80.0,
        bandwidth_gbs=2039,
        bf16_tflops=312,
        source="A100 SXM 80GB: https://www.nvidia.com/en-us/data-center/a100/",
    ),
    "l40s": GpuSpec(
        memory_gib=45.0,
        bandwidth_gbs=864,
        bf16_tflops=362,
        fp8_tflops=733,
        source="L40S 48GB: https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    "l4": GpuSpec(
        memory_gib=22.5,
        bandwidth_gbs=300,
        bf16_tflops=121,
        fp8_tflops=242,
        source="L4 24GB: https://www.nvidia.com/en-us/data-center/l4/",
    ),
}


def find_gpu(name: str, overrides: dict[str, GpuSpec] | None = None) -> GpuSpec:
    """The GPU called ``name`` (any case), from the spec's ``capacity.gpus`` or the table."""
    table = {**GPUS, **{k.lower(): v for k, v in (overrides or {}).items()}}
    gpu = table.get(name.lower())
    if gpu is None:
        raise SpecError(
            "--gpu",
            f"{name!r} is not a GPU the planner knows ({', '.join(sorted(table))})",
            "pick one, or describe it under capacity.gpus in the spec",
        )
    return gpu
