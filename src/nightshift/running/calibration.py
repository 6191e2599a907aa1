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

import polars as pl
import pyarrow as pa

from nightshift.engines.base import Engine, EngineRequest, Sampling
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import RecordError
from nightshift.io.planstore import PlanStore
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


def sample_requests(
    spec: JobSpec,
    plans: PlanStore,
    manifest: dict[str, Any],
    encoder: PromptEncoder,
    keys: Iterator[int],
) -> list[EngineRequest]:
    """About ``task.calibration_records`` of the plan's records as requests: evenly
    spaced within shards evenly spaced over the plan (a plan's order groups records by
    prefix and length, so neither its head nor one shard is a fair sample)."""
    count = spec.task.calibration_records
    shards = [s for s in manifest["shards"]["each"] if s["records"]]
    if not shards:
        return []
    step = max(1, len(shards) / SAMPLE_SHARDS)
    chosen = [shards[int(i * step)] for i in range(min(len(shards), SAMPLE_SHARDS))]
    each = math.ceil(count / len(chosen))
    renderer = renderer_for(spec, encoder)
    requests: list[EngineRequest] = []
    for shard in chosen:
        records = _spread(plans, shard["index"], shard["records"], each)
        for tokens in encoder.encode_pieces(rows(renderer.pieces(records))):
            requests.append(EngineRequest(next(keys), tokens))
    return requests[:count]


def _spread(plans: PlanStore, shard: int, planned: int, count: int) -> pl.DataFrame:
    """``count`` of a shard's records, evenly spaced through it."""
    batches = list(plans.shard_batches(shard, rows=max(planned, 1)))
    records = pl.from_arrow(pa.Table.from_batches(batches))
    if records.height <= count:
        return records
    picks = [int(i * records.height / count) for i in range(count)]
    return records[picks]


def measure(
    engine: Engine, requests: list[EngineRequest], sampling: Sampling, scoring: LabelScoring
) -> dict[str, Any]:
    """Each label's mean probability over ``requests`` (each record's label scores made
    to add up to 1), as plan/calibration.json keeps it."""
    chances: list[list[float]] = []
    with contextlib.closing(engine.run(iter(requests), sampling)) as results:
        for result in results:
            if result.error or result.aborted or result.scores is None:
                continue  # a record the run will fail on its own; the sample goes on
            with contextlib.suppress(RecordError):  # every score -inf: says nothing
                chances.append(scoring.probabilities(result.scores))
    return calibration_of(scoring, chances)


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
        requests = sample_requests(self.spec, self.plans, self.manifest, self.encoder, keys)
        sampling = sampling_for(self.spec, self.handler)
        kept = self.plans.keep_calibration(measure(engine, requests, sampling, self.scoring))
        self._take(kept)
        return self.handler

    def section(self) -> dict[str, Any] | None:
        """report.json's ``calibration``: what the labels were corrected by."""
        if self.scoring is None:
            return None
        stored = self.stored or {}
        return {
            "labels": list(self.scoring.labels),
            "records": stored.get("records", 0),
            "mean_probability": dict(
                zip(self.scoring.labels, stored.get("mean_probability", []), strict=False)
            ),
        }

    def _take(self, stored: dict[str, Any] | None) -> None:
        log_prior = calibration_for(stored, self.scoring)
        if log_prior is not None:
            self.stored = stored
            self.handler = self.handler.calibrated(log_prior)
