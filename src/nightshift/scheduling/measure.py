"""Measure records for the plan: which can run, how long their prompts are, what they share.

For each input batch this yields one key row per record and never keeps its text:

* ``_file``, ``_row``: where the record is, so the plan can fetch it again;
* ``record_id``, and ``reject_kind`` / ``reason`` for a record that cannot run;
* ``h1..hL``, ``p0..pL``, ``tokens``: its prefix levels and prompt tokens
  (see ``scheduling.order``); ``exact`` says whether ``tokens`` was counted or estimated.

Tokens are counted exactly where it matters and cheaply elsewhere: the static frame
once; each distinct leading segment (a document, a few-shot block) once, however many
records repeat it; the record's own last segment is estimated from its bytes unless the
record could come near the context limit, where it is counted exactly.
"""

from __future__ import annotations

import polars as pl

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget
from nightshift.scheduling.budget import TailEstimate, over_length_reason
from nightshift.scheduling.prompts import PromptTemplate

CALIBRATION_RECORDS = 2000


class RecordMeasurer:
    """Turns batches of input records into plan keys (see the module docstring)."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder) -> None:
        self.template = PromptTemplate(spec.prompt.template, spec.prompt.system)
        self.encoder = encoder
        self.id_column = spec.input.id_column
        self.levels = len(self.template.segments) - 1
        self.before, self.after = encoder.prompt_overhead(spec.prompt.system, self.template.head)
        self.answer = answer_budget(spec)
        self.limit = spec.model.max_model_len
        self.tail: TailEstimate | None = None
        self.exact_records = 0

    def measure(self, batch: pl.DataFrame, where: pl.DataFrame) -> pl.DataFrame:
        """Key rows for the input records ``batch``; ``where`` holds their ``_file`` and
        ``_row``, row for row. The two stay apart so no input column name can meet a key's."""
        checks = pl.DataFrame(
            {"no_id": batch[self.id_column].is_null(), "missing": self.template.null_fields(batch)}
        )
        verdict = checks.select(
            pl.when(pl.col("no_id"))
            .then(pl.lit("null_id"))
            .when(pl.col("missing").is_not_null())
            .then(pl.lit("null_field"))
            .alias("reject_kind"),
            pl.when(pl.col("no_id"))
            .then(pl.lit(f"{self.id_column} is null"))
            .otherwise(pl.format("field '{}' is null", "missing"))
            .alias("reason"),
        )
        held = verdict["reject_kind"].is_not_null()
        keys = self._keys(batch.filter(~held), where.filter(~held)) if not held.all() else None
        set_aside = where.with_columns(batch[self.id_column].alias("record_id"), *verdict)
        set_aside = set_aside.filter(held)
        return pl.concat([k for k in (keys, set_aside) if k is not None], how="diagonal_relaxed")

    def _keys(self, records: pl.DataFrame, where: pl.DataFrame) -> pl.DataFrame:
        segments = self.template.segment_texts(records)
        keys = where.with_columns(records[self.id_column].alias("record_id"))
        prefix = pl.Series("p0", [self.before] * records.height, dtype=pl.Int64)
        levels, chain = [prefix], None
        for j, texts in enumerate(segments[:-1], start=1):
            counts = [len(ids) for ids in self.encoder.encode_shared(texts.to_list())]
            prefix = (prefix + pl.Series(counts, dtype=pl.Int64)).alias(f"p{j}")
            chain = texts.hash(seed=7) if chain is None else _chain(chain, texts)
            levels += [chain.alias(f"h{j}"), prefix]
        keys = keys.with_columns(levels)
        tail_bytes = segments[-1].str.len_bytes()
        return self._tokens(keys.with_columns(tail_bytes.alias("_tail_bytes")), records)

    def _tokens(self, keys: pl.DataFrame, records: pl.DataFrame) -> pl.DataFrame:
        """``tokens``: estimated, or exact for records whose bound could break the limit."""
        last = pl.col(f"p{self.levels}")
        if self.tail is None:
            self.tail = self._calibrate(keys, records)
        tail_bytes = pl.col("_tail_bytes")
        upper = last + self.tail.upper(tail_bytes) + self.after + self.answer
        near = (upper > self.limit) | pl.lit(not self.tail.bound_holds)
        keys = keys.with_columns(
            (last + self.tail.estimate(tail_bytes) + self.after).alias("tokens"),
            near.alias("exact"),
        ).drop("_tail_bytes")
        rows = keys["exact"].arg_true()
        if rows.len():
            exact = self._exact(records[rows])
            keys = keys.with_columns(keys["tokens"].scatter(rows, exact))
            self.exact_records += rows.len()
        return self._over_length(keys)

    def _calibrate(self, keys: pl.DataFrame, records: pl.DataFrame) -> TailEstimate:
        sample = min(CALIBRATION_RECORDS, records.height)
        exact = self._exact(records.head(sample))
        fixed = (keys[f"p{self.levels}"].head(sample) + self.after).to_list()
        tail_tokens = [e - f for e, f in zip(exact, fixed, strict=True)]
        return TailEstimate(keys["_tail_bytes"].head(sample).to_list(), tail_tokens)

    def _exact(self, records: pl.DataFrame) -> list[int]:
        """Exact prompt tokens, encoded exactly as the run will encode them."""
        rows = zip(*(s.to_list() for s in self.template.segment_texts(records)), strict=True)
        encoded = self.encoder.encode_records(self.template.system, self.template.head, list(rows))
        return [len(ids) for ids in encoded]

    def _over_length(self, keys: pl.DataFrame) -> pl.DataFrame:
        """Mark exactly measured records whose prompt and answer exceed the context."""
        over = ((keys["tokens"] + self.answer) > self.limit) & keys["exact"]
        rows = over.arg_true()
        kind = pl.Series("reject_kind", [None] * keys.height, dtype=pl.String)
        reason = pl.Series("reason", [None] * keys.height, dtype=pl.String)
        if rows.len():
            tokens = keys["tokens"].gather(rows).to_list()
            kind = kind.scatter(rows, "over_length")
            reason = reason.scatter(
                rows, [over_length_reason(t, self.answer, self.limit) for t in tokens]
            )
        return keys.with_columns(kind, reason)


def _chain(previous: pl.Series, texts: pl.Series) -> pl.Series:
    """A hash of (previous level's hash, this segment's text): equal only for records
    whose first j segments are all equal."""
    return pl.DataFrame({"h": previous, "t": texts}).hash_rows(seed=7)
