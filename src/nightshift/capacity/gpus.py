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
    # vLLM runs float32 models with float32_matmul_precision "highest" (vllm 0.33.0
    # v1/worker/gpu_worker.py:218-220): no tensor cores, no TF32, the plain FP32 units.
    fp32_tflops: float | None = Field(
        default=None, gt=0, description="FP32 (non-tensor) TFLOP/s, for float32 weights."
    )
    source: str = Field(default="spec", description="Where the figures come from.")


GPUS: dict[str, GpuSpec] = {
    "h100": GpuSpec(
        memory_gib=79.6,
        bandwidth_gbs=3350,
        bf16_tflops=989,
        fp8_tflops=1979,
        fp32_tflops=67,
        source="H100 SXM 80GB: https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200": GpuSpec(
        memory_gib=139.8,
        bandwidth_gbs=4800,
        bf16_tflops=989,
        fp8_tflops=1979,
        fp32_tflops=67,
        source="H200 SXM 141GB: https://www.nvidia.com/en-us/data-center/h200/",
    ),
    # The H100's other forms: matched by name, never taken for the SXM (local_gpu).
    "h100-pcie": GpuSpec(
        memory_gib=79.6,
        bandwidth_gbs=2000,
        bf16_tflops=756,
        fp8_tflops=1513,
        fp32_tflops=51,
        source="H100 PCIe 80GB: https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h100-nvl": GpuSpec(
        memory_gib=93.6,
        bandwidth_gbs=3900,
        bf16_tflops=835,
        fp8_tflops=1671,
        fp32_tflops=60,
        source="H100 NVL 94GB: https://www.nvidia.com/en-us/data-center/h100/",
    ),
    "h200-nvl": GpuSpec(
        memory_gib=139.8,
        bandwidth_gbs=4800,
        bf16_tflops=835,
        fp8_tflops=1671,
        fp32_tflops=60,
        source="H200 NVL 141GB: https://www.nvidia.com/en-us/data-center/h200/",
    ),
    "a100": GpuSpec(
        memory_gib=80.0,
        bandwidth_gbs=2039,
        bf16_tflops=312,
        fp32_tflops=19.5,
        source="A100 SXM 80GB: https://www.nvidia.com/en-us/data-center/a100/",
    ),
    "l40s": GpuSpec(
        memory_gib=45.0,
        bandwidth_gbs=864,
        bf16_tflops=362,
        fp8_tflops=733,
        fp32_tflops=91.6,
        source="L40S 48GB: https://www.nvidia.com/en-us/data-center/l40s/",
    ),
    "l4": GpuSpec(
        memory_gib=22.5,
        bandwidth_gbs=300,
        bf16_tflops=121,
        fp8_tflops=242,
        fp32_tflops=30.3,
        source="L4 24GB: https://www.nvidia.com/en-us/data-center/l4/",
    ),
}


# nvidia-smi's name of each GPU the table holds, the longest pattern first; an H100 or
# H200 whose form this list does not name is no row (rather than taken for the SXM).
DEVICE_NAMES = (
    ("h100 nvl", "h100-nvl"),
    ("h100 pcie", "h100-pcie"),
    ("h100 80gb hbm3", "h100"),
    ("h100 sxm", "h100"),
    ("h200 nvl", "h200-nvl"),
    ("h200", "h200"),
    ("a100", "a100"),
    ("l40s", "l40s"),
    ("l4", "l4"),
)


def gpu_for_device(device: str) -> str | None:
    """The table's name for a device as nvidia-smi or torch names it, matched explicitly:
    "NVIDIA H100 PCIe" is h100-pcie, "NVIDIA H100 80GB HBM3" the SXM; None if unknown."""
    device = device.lower()
    if "gh200" in device or "gb200" in device:  # Grace Hopper/Blackwell: not in the table
        return None
    if "h200" in device and "nvl" not in device:
        return "h200"
    return next((gpu for pattern, gpu in DEVICE_NAMES if pattern in device), None)


def local_gpu() -> str | None:
    """The table's name for this host's first GPU (None: no GPU, or none in the table)."""
    names = local_gpu_names()
    return gpu_for_device(names[0]) if names else None


def local_gpu_names() -> list[str]:
    """nvidia-smi's name of each of this host's GPUs ("NVIDIA H100 80GB HBM3"); empty
    without nvidia-smi. Not torch.cuda: CUDA initialised in nightshift's own process
    makes vLLM spawn every later engine."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    query = [smi, "--query-gpu=name", "--format=csv,noheader"]
    try:
        names = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in names.strip().splitlines() if line.strip()]


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
