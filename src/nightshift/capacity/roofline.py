"""The time of one engine pass: the larger of its bytes over memory bandwidth and its
FLOPs over arithmetic throughput, each at a stated share of the data sheet's figure.

A decode pass reads every weight once for the whole batch plus each record's KV cache,
and does two FLOPs per weight per record: it waits on memory until the batch is large.
A prefill pass computes many prompt tokens against one read of the weights: it waits on
arithmetic. Tensor-parallel GPUs are counted as one GPU with their sum of memory,
bandwidth and FLOP/s (the exchanges between them are not modelled). Each pass also
costs the engine a fixed time of its own (``capacity.step_overhead_s``): scheduling,
input preparation, kernel launches and sampling, which dominate a small model's pass.
"""

from __future__ import annotations

from dataclasses import dataclass

from nightshift.capacity.gpus import GpuSpec
from nightshift.capacity.shape import ModelShape

ARITHMETIC = "arithmetic"
BANDWIDTH = "memory bandwidth"
CAPACITY = "memory capacity"


@dataclass(frozen=True)
class Hardware:
    """What the job's GPUs together reach: memory, bandwidth and FLOP/s after efficiency."""

    name: str
    gpus: int
    memory_bytes: float
    bandwidth: float  # bytes/s reached
    flops: float  # FLOP/s reached
    compute_dtype: str  # fp8 when the weights are 8-bit and the GPU has FP8 units
    step_s: float = 0.0  # the engine's own time per pass (scheduling, launch, sampling)


def hardware(
    name: str,
    gpu: GpuSpec,
    gpus: int,
    weight_bytes: float,
    bandwidth_eff: float,
    compute_eff: float,
    step_s: float = 0.0,
) -> Hardware:
    """One engine's GPUs (``gpus``: its tensor-parallel group). Float32 weights run on the
    FP32 units (a fifteenth of an H100's BF16 tensor rate), 8-bit ones on FP8's."""
    if weight_bytes >= 4:
        dtype, tflops = "fp32", gpu.fp32_tflops or gpu.bf16_tflops / 16
    elif weight_bytes <= 1 and gpu.fp8_tflops is not None:
        dtype, tflops = "fp8", gpu.fp8_tflops
    else:
        dtype, tflops = "bf16", gpu.bf16_tflops
    return Hardware(
        name=name,
        gpus=gpus,
        memory_bytes=gpus * gpu.memory_gib * 2**30,
        bandwidth=gpus * gpu.bandwidth_gbs * 1e9 * bandwidth_eff,
        flops=gpus * tflops * 1e12 * compute_eff,
        compute_dtype=dtype,
        step_s=step_s,
    )


@dataclass(frozen=True)
class PassTime:
    bytes: float
    flops: float
    memory_s: float  # bytes over bandwidth
    compute_s: float  # FLOPs over throughput
    step_s: float = 0.0  # the engine's fixed cost per pass, on top

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s) + self.step_s

    @property
    def limit(self) -> str:
        return ARITHMETIC if self.compute_s > self.memory_s else BANDWIDTH

    def as_dict(self) -> dict[str, float | str]:
        return {
            "seconds": self.seconds,
            "limit": self.limit,
            "bytes": self.bytes,
            "flops": self.flops,
            "memory_s": self.memory_s,
            "compute_s": self.compute_s,
            "step_s": self.step_s,
        }


def roofline(bytes_moved: float, flops: float, hw: Hardware) -> PassTime:
    return PassTime(bytes_moved, flops, bytes_moved / hw.bandwidth, flops / hw.flops, hw.step_s)


def decode_pass(
    shape: ModelShape, hw: Hardware, batch: int, context: float, kv_bytes: int
) -> PassTime:
    """One decode pass: ``batch`` records each write one token after ``context`` tokens."""
    moved = shape.weights_read_per_pass(batch) + batch * context * kv_bytes
    per_record = 2 * shape.matmul_parameters + shape.attention_flops_per_position * context
    return roofline(moved, batch * per_record, hw)


def prefill_pass(
    shape: ModelShape, hw: Hardware, tokens: int, attended: float, kv_bytes: int
) -> PassTime:
    """One prefill pass over ``tokens`` prompt tokens that attend to ``attended`` cached
    positions in all (a whole prompt of n tokens: about n * n / 2)."""
    moved = shape.weights_read_per_pass(tokens) + tokens * kv_bytes
    flops = 2 * shape.matmul_parameters * tokens + shape.attention_flops_per_position * attended
    return roofline(moved, flops, hw)
