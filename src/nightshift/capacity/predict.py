"""A whole job's time from its token counts: the batch that fits, then prefill and decode.

The job is taken as two kinds of passes that do not overlap: prefill passes of
``max_num_batched_tokens`` prompt tokens over every token the prefix cache cannot serve,
and decode passes of the batch that fits, one per output token of each record. Start-up,
the ramp at the start and the tail at the end of a job are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from nightshift.capacity.roofline import (
    ARITHMETIC,
    BANDWIDTH,
    CAPACITY,
    Hardware,
    PassTime,
    decode_pass,
    prefill_pass,
)
from nightshift.capacity.shape import ModelShape

RUNTIME_RESERVE_GIB = 2.0  # per GPU: activations, CUDA graphs and the like, outside the cache


class DoesNotFit(ValueError):
    """The weights leave no room for a KV cache on these GPUs."""

    def __init__(self, weights_gib: float, usable_gib: float, gpus_needed: int) -> None:
        self.gpus_needed = gpus_needed
        super().__init__(
            f"the weights take {weights_gib:,.1f} GiB of the {usable_gib:,.1f} GiB usable; "
            f"at least {gpus_needed} GPUs are needed"
        )


@dataclass(frozen=True)
class Workload:
    """The job in tokens, as the plan measured it."""

    records: int
    prompt_tokens: int
    cached_tokens: int  # prompt tokens the prefix cache serves
    attended: float  # sum over records of the positions computed prompt tokens attend to
    output_per_record: float

    @property
    def output_tokens(self) -> float:
        return self.records * self.output_per_record

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def mean(self, tokens: float) -> float:
        return tokens / self.records if self.records else 0.0

    def share(self, workers: int) -> Workload:
        """One of ``workers`` data-parallel engines' even share of the job."""
        if workers <= 1:
            return self
        n = workers
        return Workload(
            math.ceil(self.records / n),
            math.ceil(self.prompt_tokens / n),
            self.cached_tokens // n,
            self.attended / n,
            self.output_per_record,
        )


@dataclass(frozen=True)
class EngineSettings:
    kv_cache_dtype: str
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float


@dataclass(frozen=True)
class Batch:
    size: int
    fits: int  # records whose whole KV cache (prompt and answer) fits at once
    limited_by: str
    kv_cache_bytes: float
    kv_bytes_per_token: int
    tokens_per_record: float  # KV tokens a record holds at its end, shared prefixes apart


def kv_cache_bytes(shape: ModelShape, hw: Hardware, utilization: float) -> float:
    """Memory left for the KV cache: the engine's share, less weights and a reserve."""
    usable = hw.memory_bytes * utilization - RUNTIME_RESERVE_GIB * 2**30 * hw.gpus
    left = usable - shape.weights_bytes
    if left <= 0:
        per_gpu = usable / hw.gpus
        needed = math.ceil(shape.weights_bytes / per_gpu * 1.1) if per_gpu > 0 else hw.gpus + 1
        raise DoesNotFit(shape.weights_bytes / 2**30, usable / 2**30, max(needed, hw.gpus + 1))
    return left


def batch_that_fits(work: Workload, settings: EngineSettings, cache: float, kv_bytes: int) -> Batch:
    """The most records in one pass: the least of max_num_seqs, what the cache holds
    (each record at its full length; a prefix served from cache is shared, so not
    counted again), the records there are, and max_num_batched_tokens."""
    per_record = max(work.mean(work.computed_tokens) + work.output_per_record, 1.0)
    fits = int(cache // (per_record * kv_bytes))
    limits = {
        "engine.max_num_seqs": settings.max_num_seqs,
        "memory": fits,
        "records": work.records,
        "engine.max_num_batched_tokens": settings.max_num_batched_tokens,
    }
    limited_by = min(limits, key=lambda k: limits[k])
    size = max(1, limits[limited_by])
    return Batch(size, fits, limited_by, cache, kv_bytes, per_record)


@dataclass(frozen=True)
class Prediction:
    batch: Batch
    prefill: PassTime  # one full prefill pass
    decode: PassTime  # one decode pass of the batch that fits
    prefill_s: float
    decode_s: float
    work: Workload  # the whole job
    workers: int = 1  # data-parallel engines sharing it; ``seconds`` is one share's time

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tokens_per_s(self) -> float:
        total = self.work.prompt_tokens + self.work.output_tokens
        return total / self.seconds if self.seconds else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        return self.work.output_tokens / self.seconds if self.seconds else 0.0

    @property
    def binding(self) -> str:
        """The limit the job waits on longest; memory capacity when that is bandwidth and
        the batch is as small as it is because the cache is full."""
        by_limit = {ARITHMETIC: 0.0, BANDWIDTH: 0.0}
        by_limit[self.prefill.limit] += self.prefill_s
        by_limit[self.decode.limit] += self.decode_s
        limit = max(by_limit, key=lambda k: by_limit[k])
        if limit == BANDWIDTH and self.batch.limited_by == "memory":
            return CAPACITY
        return limit


def predict(
    shape: ModelShape,
    hw: Hardware,
    whole: Workload,
    settings: EngineSettings,
    kv_width: float,
    workers: int = 1,
) -> Prediction:
    """Predict a job run by ``workers`` engines on ``hw`` each (data parallel: an even
    share each, all at once); raises ``DoesNotFit`` when the weights leave no room."""
    work = whole.share(workers)
    kv_bytes = shape.kv_bytes_per_token(kv_width)
    cache = kv_cache_bytes(shape, hw, settings.gpu_memory_utilization)
    batch = batch_that_fits(work, settings, cache, kv_bytes)
    computed = work.computed_tokens
    chunk = max(1, min(settings.max_num_batched_tokens, computed))
    passes = computed / chunk
    prefill = prefill_pass(shape, hw, chunk, work.attended / passes if passes else 0.0, kv_bytes)
    context = work.mean(work.prompt_tokens) + work.output_per_record / 2
    decode = decode_pass(shape, hw, batch.size, context, kv_bytes)
    decode_s = work.output_tokens / batch.size * decode.seconds
    return Prediction(batch, prefill, decode, passes * prefill.seconds, decode_s, whole, workers)


def fixed_length_workload(records: int, prompt: int, output: int, cached: int = 0) -> Workload:
    """``records`` prompts of ``prompt`` tokens (``cached`` of them from the cache) and
    answers of ``output`` tokens, as in published benchmarks."""
    attended = records * (prompt * prompt - cached * cached) / 2
    return Workload(records, records * prompt, records * cached, attended, output)
