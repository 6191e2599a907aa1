"""Plan a job: read every record, render and measure its prompt, set aside what cannot run.

The plan holds each runnable record's token ids, so the engine runs exactly the tokens
that were counted here. Records that cannot run are kept as rejects with their reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
from tqdm.auto import tqdm

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import RecordError
from nightshift.io.inputs import check_columns, check_id_type, open_input, read_batches
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget
from nightshift.scheduling.budget import over_length_reason
from nightshift.scheduling.prompts import Messages, PromptTemplate

_READ_BATCH = 2048


@dataclass(frozen=True)
class PlannedRecord:
    key: int  # position in the plan; the engine hands it back with the result
    record_id: Any
    kept: dict[str, Any]
    token_ids: list[int]


@dataclass(frozen=True)
class Reject:
    record_id: Any
    row: dict[str, Any]  # the input columns the job used, so a reject can be fixed and rerun
    reason: str
    kind: str


@dataclass
class Plan:
    input_schema: pa.Schema  # the id, kept and template columns, as the input types them
    input_records: int = 0
    records: list[PlannedRecord] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(r.token_ids) for r in self.records)


def job_columns(spec: JobSpec) -> dict[str, str]:
    """Input column -> the spec key that needs it (the first key wins)."""
    needed = {spec.input.id_column: "input.id_column"}
    for col in spec.input.keep_columns:
        needed.setdefault(col, "input.keep_columns")
    for col in spec.template_columns():
        needed.setdefault(col, "prompt.template")
    return needed


def build_plan(spec: JobSpec, encoder: PromptEncoder, progress: bool = True) -> Plan:
    dataset = open_input(spec.input.path, exclude=Path(spec.output.path))
    needed = job_columns(spec)
    check_columns(dataset, needed)
    check_id_type(dataset, spec.input.id_column)
    columns = list(needed)
    plan = Plan(input_schema=pa.schema([dataset.schema.field(c) for c in columns]))
    template = PromptTemplate(spec.prompt.template, spec.prompt.system)
    seen: set[Any] = set()
    bar = tqdm(total=dataset.count_rows(), desc="plan", unit="rec", disable=not progress)
    for batch in read_batches(dataset, columns, _READ_BATCH):
        rows = batch.to_pylist()
        plan.input_records += len(rows)
        runnable = list(_render(rows, spec, template, seen, plan.rejects))
        _measure(runnable, spec, encoder, plan)
        bar.update(len(rows))
    bar.close()
    return plan


def _render(
    rows: list[dict], spec: JobSpec, template: PromptTemplate, seen: set, rejects: list[Reject]
) -> Iterator[tuple[dict, Messages]]:
    id_column = spec.input.id_column
    for row in rows:
        record_id = row[id_column]
        try:
            if record_id is None:
                raise RecordError(f"{id_column} is null", "null_id")
            if record_id in seen:
                raise RecordError(
                    f"duplicate {id_column}: an earlier record has it", "duplicate_id"
                )
            seen.add(record_id)
            yield row, template.render(row)
        except RecordError as exc:
            rejects.append(Reject(record_id, row, str(exc), exc.kind))


def _measure(runnable: list[tuple[dict, Messages]], spec: JobSpec, encoder, plan: Plan) -> None:
    if not runnable:
        return
    id_column, keep = spec.input.id_column, spec.input.keep_columns
    budget = answer_budget(spec)
    all_ids = encoder.encode([messages for _, messages in runnable])
    for (row, _), token_ids in zip(runnable, all_ids, strict=True):
        reason = over_length_reason(len(token_ids), budget, spec.model.max_model_len)
        if reason:
            plan.rejects.append(Reject(row[id_column], row, reason, "over_length"))
            continue
        kept = {col: row[col] for col in keep}
        plan.records.append(PlannedRecord(len(plan.records), row[id_column], kept, token_ids))
