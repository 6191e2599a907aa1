"""The model's leaning toward some labels, measured once per job, before any answer.

A small model asked to pick one of four labels gives one of them a large share of its
probability whatever the record says (SmolLM2-135M on the demo tickets: payment 0.56,
defect 0.39, login 0.05, general 0.006). Taking that leaning out ("calibrate before use",
Zhao et al. 2021; from the records themselves, Zhou et al. 2023) lifted the demo's
accuracy from 0.317 (guided choice) to 0.569 (benchmarks/classify_quality.py). It is each
label's mean probability over a sample of the job's own records (no labels needed), so
it is measured on the engine, by the run, before its first answer, and kept beside the
plan (``plan/calibration.json``): a resumed run, another worker or a later increment
labels by the same measure. The sample's records are scored again in the run (their
prompts are then in the prefix cache); nothing of theirs is kept from here.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from nightshift.engines.base import Engine, EngineRequest, Sampling
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import RecordError
from nightshift.io.inputs import rows_at
from nightshift.io.planstore import PlanStore
from nightshift.jobs.sampling import sampling_column
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import (
    LabelScoring,
    TaskHandler,
    embedding_dimension,
    handler_for,
    label_encoder,
    sampling_for,
)
from nightshift.scheduling.render import renderer_for, rows

SAMPLE_SHARDS = 8  # the sample is spread over at most this many shards of the plan
# ... per adapter of a job with input.adapter_column (the plan walks one adapter's records,
# then the next's, so an adapter's records lie in a run of shards), up to this many in all
MAX_SAMPLE_SHARDS = 64


def sample_requests(
    spec: JobSpec,
    plans: PlanStore,
    manifest: dict[str, Any],
    encoder: PromptEncoder,
    keys: Iterator[int],
    sampling: Sampling,
) -> list[EngineRequest]:
    """About ``task.calibration_records`` of the plan's records as requests (that many per
    adapter with ``input.adapter_column``), each under its own adapter and with its own
    sampling (``input.sampling_column``) over ``sampling``, as the run sends it: evenly
    spaced within shards evenly spaced over the plan (a plan's order groups records by
    adapter, prefix and length, so neither its head nor one shard is a fair sample)."""
    count = spec.task.calibration_records
    shards = [s for s in manifest["shards"]["each"] if s["records"]]
    if not shards:
        return []
    column = spec.input.adapter_column
    if column is None:
        chosen = _evenly(shards, SAMPLE_SHARDS)
    else:
        chosen = _per_adapter(plans, shards, column)
    each = math.ceil(count / len(chosen))
    picked: list[pl.DataFrame] = []
    for shard in chosen:
        if column is None:  # a few records of a shard: read a batch at a time
            picked.append(_read_spread(plans, shard["index"], shard["records"], each))
            continue
        records = _read_shard(plans, shard["index"], shard["records"])
        picked += [_spread(group, count) for group in _by_adapter(records, column)]
    if not picked:
        return []
    records = pl.concat(picked, how="vertical_relaxed")
    if column is None:
        return _requests(spec, encoder, records.head(count), keys, sampling)
    groups = [_spread(g, count) for g in _by_adapter(records, column)]  # each its own count
    return _requests(spec, encoder, pl.concat(groups, how="vertical_relaxed"), keys, sampling)


def _evenly(shards: list[dict], count: int) -> list[dict]:
    """``count`` of ``shards`` (all, if fewer), evenly spaced over them."""
    return [shards[i] for i in _spread_rows(len(shards), count)]


def _per_adapter(plans: PlanStore, shards: list[dict], column: str) -> list[dict]:
    """Up to ``SAMPLE_SHARDS`` shards of each adapter's, evenly spaced over the shards
    holding its records (``MAX_SAMPLE_SHARDS`` in all, at least one each), in plan order.
    The plan walks one adapter's records, then the next's, so one spacing over all
    shards would miss an adapter whose few records fill a shard or two of many."""
    holding: dict[str | None, list[dict]] = {}
    for shard in shards:
        names = shard.get("adapters")  # plan.json lists them (``scheduling.plan``)
        if names is None:  # a plan from before it did: the shard's adapter column alone
            batches = plans.shard_batches(shard["index"], rows=SAMPLE_READ_ROWS, columns=[column])
            names = pa.Table.from_batches(list(batches)).column(0).unique().to_pylist()
        for name in names:
            holding.setdefault(name, []).append(shard)
    each = max(1, min(SAMPLE_SHARDS, MAX_SAMPLE_SHARDS // max(1, len(holding))))
    chosen = {s["index"]: s for held in holding.values() for s in _evenly(held, each)}
    return [chosen[index] for index in sorted(chosen)]


def _requests(
    spec: JobSpec,
    encoder: PromptEncoder,
    records: pl.DataFrame,
    keys: Iterator[int],
    sampling: Sampling,
) -> list[EngineRequest]:
    renderer = renderer_for(spec, encoder)
    tokens = encoder.encode_pieces(rows(renderer.pieces(records)))
    none = [None] * records.height
    column = spec.input.adapter_column
    adapters = records[column].to_list() if column else none
    own = sampling_column(spec, sampling)  # each record's own, as the run sends it
    samplings = [own.sampling(v) for v in records[own.column].to_list()] if own else none
    return [
        EngineRequest(next(keys), t, s, a)
        for t, s, a in zip(tokens, samplings, adapters, strict=True)
    ]


def _read_shard(plans: PlanStore, shard: int, planned: int) -> pl.DataFrame:
    batches = list(plans.shard_batches(shard, rows=max(planned, 1)))
    return pl.from_arrow(pa.Table.from_batches(batches))


def _by_adapter(records: pl.DataFrame, column: str | None) -> list[pl.DataFrame]:
    """The records of each adapter (null: the base model), in their plan order."""
    if column is None or records.height == 0:
        return [records]
    return records.partition_by(column, maintain_order=True)


def _spread(records: pl.DataFrame, count: int) -> pl.DataFrame:
    """``count`` of ``records``, evenly spaced through them."""
    return records[_spread_rows(records.height, count)]


def _spread_rows(height: int, count: int) -> list[int]:
    """Where ``count`` rows evenly spaced through ``height`` rows are (all, if fewer)."""
    if height <= count:
        return list(range(height))
    return [int(i * height / count) for i in range(count)]


SAMPLE_READ_ROWS = 8192


def _read_spread(plans: PlanStore, shard: int, planned: int, count: int) -> pl.DataFrame:
    """``count`` of a shard's ``planned`` records, evenly spaced (as ``_spread`` picks),
    read a batch at a time: a whole shard at once (100,000 records or more at a million)
    was 0.3 GiB of a run's peak, for the four records it gives the sample."""
    wanted = np.array(_spread_rows(planned, count), dtype=np.int64)
    batches = plans.shard_batches(shard, rows=SAMPLE_READ_ROWS)
    taken = [picked for picked, _, _ in rows_at(batches, wanted)]
    return pl.from_arrow(pa.concat_tables(taken)) if taken else pl.DataFrame()


def measure(
    engine: Engine, requests: list[EngineRequest], sampling: Sampling, scoring: LabelScoring
) -> dict[str, Any]:
    """Each label's mean probability over ``requests`` (each record's label scores made
    to add up to 1), as plan/calibration.json keeps it; where the requests run under
    LoRA adapters, also each adapter's own (``adapters``: one entry per adapter, null for
    the base model), as each adapter's records are labelled by it."""
    adapter_of = {r.key: r.adapter for r in requests}
    chances: dict[str | None, list[list[float]]] = {}
    with contextlib.closing(engine.run(iter(requests), sampling)) as results:
        for result in results:
            if result.error or result.aborted or result.scores is None:
                continue  # a record the run will fail on its own; the sample goes on
            with contextlib.suppress(RecordError):  # every score -inf: says nothing
                probabilities = scoring.probabilities(result.scores)
                chances.setdefault(adapter_of.get(result.key), []).append(probabilities)
    stored = calibration_of(scoring, [c for group in chances.values() for c in group])
    if any(a is not None for a in adapter_of.values()):
        stored["adapters"] = [
            {"adapter": name, **_measure_only(calibration_of(scoring, chances.get(name, [])))}
            for name in sorted({*adapter_of.values()}, key=lambda a: (a is None, a or ""))
        ]
    return stored


def _measure_only(stored: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stored.items() if k != "labels"}


def calibration_of(scoring: LabelScoring, chances: list[list[float]]) -> dict[str, Any]:
    """The stored form: labels, records measured, mean probabilities and their logs
    (0 everywhere, no correction, when nothing could be measured)."""
    n = len(chances)
    mean = [sum(c[i] for c in chances) / n for i in range(len(scoring.labels))] if n else []
    uniform = 1 / len(scoring.labels)
    prior = mean or [uniform] * len(scoring.labels)
    return {
        "labels": list(scoring.labels),
        "records": n,
        "mean_probability": [round(p, 6) for p in prior],
        # log(p / uniform): 0 for a label the model does not lean toward
        "log_prior": [round(math.log(max(p, 1e-9) / uniform), 6) for p in prior],
    }


def calibration_for(stored: dict[str, Any] | None, scoring: LabelScoring) -> list[float] | None:
    """The stored measure's correction when it is of these labels, else None."""
    if stored is None or stored.get("labels") != list(scoring.labels):
        return None
    return [float(x) for x in stored["log_prior"]]


def adapter_corrections(stored: dict[str, Any]) -> dict[str | None, list[float]]:
    """Each adapter's own correction (None: the base model's), where its records were
    measured; an adapter left out is corrected by the whole sample's measure (a measure
    kept before adapters were measured apart holds none: one for all, as it ran)."""
    return {
        each["adapter"]: [float(x) for x in each["log_prior"]]
        for each in stored.get("adapters", [])
        if each.get("records")
    }


class LabelCalibration:
    """One runner's view of the job's calibration: the handler to label by, measured on
    the first engine the runner gets when no run measured it before."""

    def __init__(
        self,
        spec: JobSpec,
        plans: PlanStore,
        manifest: dict[str, Any],
        encoder: PromptEncoder,
        handler: TaskHandler,
    ) -> None:
        self.spec, self.plans, self.manifest, self.encoder = spec, plans, manifest, encoder
        self.handler, self.stored = handler, None
        self.scoring: LabelScoring | None = getattr(handler, "scoring", None)
        if self.scoring is not None:
            self._take(plans.calibration())

    @classmethod
    def for_run(
        cls, spec: JobSpec, plans: PlanStore, manifest: dict[str, Any], encoder: PromptEncoder
    ) -> LabelCalibration:
        """The task handler a run answers with: a classify job scores its labels only
        where its first plan says so (``labels_by``), so one output never mixes ways."""
        scored = manifest.get("labels_by") == "score"
        dimension = embedding_dimension(spec) if spec.task.kind == "embed" else None
        handler = handler_for(
            spec.task, label_encoder(spec, encoder) if scored else None, dimension
        )
        return cls(spec, plans, manifest, encoder, handler)

    @property
    def due(self) -> bool:
        """Labels are scored and no measure is held yet."""
        return self.scoring is not None and self.stored is None

    def measure_on(self, engine: Engine, keys: Iterator[int]) -> TaskHandler:
        """Measure on ``engine``, keep the measure (another worker's, if it kept one
        first) and return the handler that labels by it."""
        sampling = sampling_for(self.spec, self.handler)
        requests = sample_requests(
            self.spec, self.plans, self.manifest, self.encoder, keys, sampling
        )
        kept = self.plans.keep_calibration(measure(engine, requests, sampling, self.scoring))
        self._take(kept)
        return self.handler

    def section(self) -> dict[str, Any] | None:
        """report.json's ``calibration``: what the labels were corrected by."""
        if self.scoring is None:
            return None
        stored = self.stored or {}
        section = {"labels": list(self.scoring.labels), **self._shares(stored)}
        if "adapters" in stored:  # measured per adapter: each one's own leaning
            section["adapters"] = [
                {"adapter": each["adapter"], **self._shares(each)} for each in stored["adapters"]
            ]
        return section

    def _shares(self, measure: dict[str, Any]) -> dict[str, Any]:
        shares = zip(self.scoring.labels, measure.get("mean_probability", []), strict=False)
        return {"records": measure.get("records", 0), "mean_probability": dict(shares)}

    def _take(self, stored: dict[str, Any] | None) -> None:
        log_prior = calibration_for(stored, self.scoring)
        if log_prior is not None:
            self.stored = stored
            self.handler = self.handler.calibrated(log_prior, adapter_corrections(stored))
