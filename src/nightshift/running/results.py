"""Turn engine results into output rows: parsed answers and failures.

Each table's schema is fixed up front (input columns keep their input types), so every
part file of a run has the same schema and the parts read as one dataset.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pyarrow as pa

from nightshift.engines.base import EngineResult, TokenLogprob
from nightshift.errors import RecordError
from nightshift.jobs.columns import DETAIL_COLUMN, kept_name, written_fields
from nightshift.jobs.tasks import TaskHandler


class ResultTables:
    """Schemas and row builders for the results and failed rows of one job."""

    def __init__(
        self,
        input_schema: pa.Schema,
        id_column: str,
        keep: list[str],
        task: TaskHandler,
        detail: bool = False,
        reasoning: bool = False,
    ):
        self.task, self.detail, self.reasoning = task, detail, reasoning
        keep = [c for c in keep if c != id_column]  # the id is always the first column
        # a kept column named like an output column is input_<name> (jobs.columns.kept_name)
        kept = [input_schema.field(c).with_name(kept_name(c)) for c in keep]
        head = [input_schema.field(id_column), *kept]
        # nightshift's own columns: the spec refuses input columns of these names
        # (jobs.columns.OUTPUT_COLUMNS is made from the same list)
        id_type = input_schema.field(id_column).type
        results, failed = written_fields(id_type, task.columns, detail, reasoning)
        self.results = pa.schema(head + results)
        self.failed = pa.schema(head + failed)
        self._id_column = id_column

    def row(
        self, record_id: Any, kept: dict[str, Any], result: EngineResult, adapter: str | None = None
    ) -> tuple[dict, bool]:
        """The output row for one record answered under LoRA ``adapter`` (None: the base
        model), and whether it is ok (else it is failed)."""
        row = {
            self._id_column: record_id,
            **kept,
            "text": result.text,
            "finish_reason": result.finish_reason,
            "prompt_tokens": result.prompt_tokens,
            "output_tokens": result.output_tokens,
            "cached_tokens": result.cached_tokens,
        }
        if self.detail:
            row[DETAIL_COLUMN] = detail_json(result) if not result.error else None
        if self.reasoning:  # model.reasoning: the thinking apart, never in the answer
            row["reasoning"], row["reasoning_tokens"] = result.reasoning, result.reasoning_tokens
        try:
            if result.error:
                raise RecordError(f"engine: {result.error}")
            row.update(self.task.under(adapter).answer_columns(result))
            return row, True
        except RecordError as exc:
            row["error"] = str(exc)
            return row, False

    def results_table(self, rows: list[dict]) -> pa.Table:
        self.task.finish_rows(rows)  # what each row left to its chunk (jobs.labelling)
        return pa.Table.from_pylist(rows, schema=self.results)

    def failed_table(self, rows: list[dict]) -> pa.Table:
        return pa.Table.from_pylist(rows, schema=self.failed)


def detail_json(result: EngineResult) -> str:
    """Every choice of ``result`` as the ``detail`` column's JSON: ``{"choices": [{text,
    finish_reason, stop_sequence, output_tokens, logprobs}]}``, choice 0 the row's own."""
    choices = [
        {
            "text": c.text,
            "finish_reason": c.finish_reason,
            "stop_sequence": c.stop_sequence,
            "output_tokens": c.output_tokens,
            "logprobs": None if c.logprobs is None else [_logprob(t) for t in c.logprobs],
            # a reasoning model's thinking (model.reasoning), apart from the text
            **({} if c.reasoning is None else {"reasoning": c.reasoning}),
            **({"reasoning_tokens": c.reasoning_tokens} if c.reasoning is not None else {}),
        }
        for c in result.all_choices()
    ]
    return json.dumps({"choices": choices}, ensure_ascii=False, separators=(",", ":"))


def _logprob(token: TokenLogprob, top: bool = True) -> dict[str, Any]:
    # JSON has no -inf (a token the sampler ruled out): -9999.0, as OpenAI writes it
    logprob = token.logprob if math.isfinite(token.logprob) else -9999.0
    entry = {"token": token.token, "logprob": logprob, "bytes": list(token.bytes)}
    if top:
        entry["top_logprobs"] = [_logprob(t, top=False) for t in token.top_logprobs]
    return entry
