"""Measure records for the plan: which can run, how long their prompts are, what they share.

For each input batch this yields one key row per record and never keeps its text:

* ``_file``, ``_row``: where the record is, so the plan can fetch it again;
* ``record_id``, and ``reject_kind`` / ``reason`` for a record that cannot run;
* ``tokens``: its prompt tokens; ``exact`` says whether they were counted or estimated;
* ``_chunks``: keys of its text's leading byte chunks (``scheduling.sharing``), from
  which the plan finds, over all records, the part of each prompt that others share.

Tokens are counted exactly where it matters and cheaply elsewhere: the chat frame's
pieces once each; each distinct leading record text (a document, a few-shot turn) once,
however many records repeat it; the record's last text is estimated from its bytes
unless the record could come near the context limit, where it is counted exactly.

With ``input.sampling_column`` each record's value is checked here (a bad one rejects
the record, ``bad_sampling``) and its own max_tokens is its answer budget.
"""

from __future__ import annotations

import polars as pl

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import RecordError
from nightshift.jobs.sampling import sampling_column
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget
from nightshift.scheduling.adapters import ADAPTER, adapter_problems, salted
from nightshift.scheduling.budget import TailEstimate, over_length_reason
from nightshift.scheduling.render import prompt_text, renderer_for, rows
from nightshift.scheduling.sharing import chunk_bytes, chunk_keys, common_length, cut_pieces

CALIBRATION_RECORDS = 2000


class RecordMeasurer:
    """Turns batches of input records into plan keys (see the module docstring)."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder, block_size: int) -> None:
        self.renderer = renderer_for(spec, encoder)
        self.encoder = encoder
        self.id_column = spec.input.id_column
        self.answer = answer_budget(spec)
        self.sampling = sampling_column(spec)  # per-record sampling, or None
        self.spec = spec
        self.limit = spec.model.max_model_len
        self.block_size = block_size
        self.chunk = chunk_bytes(block_size)
        self.tail: TailEstimate | None = None
        self.exact_records = 0
        self.shared_start_tokens = 0  # the longest start prompts share (scheduling.prefixes)
        # What every prompt starts with: the first prompt's pieces, and the smallest and
        # largest leading chunk of all (their common start is everyone's).
        self.first: list[str] | None = None
        self._lowest: bytes | None = None
        self._highest: bytes | None = None

    def common_start(self) -> list[str]:
        """Pieces of the start every measured prompt shares (the system frame, say)."""
        if self.first is None or self._lowest is None or self._highest is None:
            return [""]
        return cut_pieces(self.first, common_length(self._lowest, self._highest))

    def seen_start(self) -> tuple[bytes | None, bytes | None]:
        """The smallest and largest leading chunk measured since the last call (a
        helper process's slice: ``merge_start`` adds them to the plan's measurer)."""
        seen = self._lowest, self._highest
        self._lowest = self._highest = None
        return seen

    def merge_start(self, lowest: bytes | None, highest: bytes | None) -> None:
        """Add leading chunks to those seen: a batch's own, or those another measurer saw
        (``seen_start``). An empty prompt's (b"") is the lowest there is."""
        if lowest is not None:
            self._lowest = lowest if self._lowest is None else min(self._lowest, lowest)
        if highest is not None:
            self._highest = highest if self._highest is None else max(self._highest, highest)

    def measure(self, batch: pl.DataFrame, where: pl.DataFrame) -> pl.DataFrame:
        """Key rows for the input records ``batch``; ``where`` holds their ``_file`` and
        ``_row``, row for row. The two stay apart so no input column name can meet a key's."""
        no_id = batch[self.id_column].is_null()
        problems, answers = self._sampling_problems(batch, self.renderer.problems(batch))
        problems = _first_problem(problems, adapter_problems(self.spec, batch))
        verdict = problems.with_columns(
            pl.when(no_id).then(pl.lit("null_id")).otherwise("reject_kind").alias("reject_kind"),
            pl.when(no_id)
            .then(pl.lit(f"{self.id_column} is null"))
            .otherwise("reason")
            .alias("reason"),
        )
        held = verdict["reject_kind"].is_not_null()
        runnable = where.with_columns(answers.alias("_answer")).filter(~held)
        keys = self._keys(batch.filter(~held), runnable) if not held.all() else None
        set_aside = where.with_columns(batch[self.id_column].alias("record_id"), *verdict)
        set_aside = set_aside.filter(held)
        return pl.concat([k for k in (keys, set_aside) if k is not None], how="diagonal_relaxed")

    def _sampling_problems(
        self, batch: pl.DataFrame, problems: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.Series]:
        """``problems`` with each bad ``input.sampling_column`` value's reject, and each
        record's answer budget: its own max_tokens, else the job's."""
        if self.sampling is None:
            return problems, pl.Series([self.answer] * batch.height, dtype=pl.Int64)
        answers, own = [], []
        for value in batch[self.sampling.column].to_list():
            try:
                answers.append(self.sampling.sampling(value).max_tokens)
                own.append((None, None))
            except RecordError as exc:
                answers.append(self.answer)
                own.append((exc.kind, str(exc)))
        # a prompt's own problem (a null field, say) is named first
        first = zip(problems["reject_kind"].to_list(), problems["reason"].to_list(), strict=True)
        verdicts = [(k, r) if k else o for (k, r), o in zip(first, own, strict=True)]
        problems = pl.DataFrame(
            {"reject_kind": [k for k, _ in verdicts], "reason": [r for _, r in verdicts]},
            schema={"reject_kind": pl.String, "reason": pl.String},
        )
        return problems, pl.Series(answers, dtype=pl.Int64)

    @property
    def prompt_columns(self) -> list[str]:
        """The input columns a prompt is made from (a template names one or more): all a
        pass that only renders prompts reads."""
        return self.renderer.columns

    def pieces(self, records: pl.DataFrame) -> list[pl.Series]:
        """The pieces of records that can run (``scheduling.render``)."""
        return self.renderer.pieces(records)

    def _keys(self, records: pl.DataFrame, where: pl.DataFrame) -> pl.DataFrame:
        pieces = self.renderer.pieces(records)
        text = prompt_text(pieces)
        self._note_start(pieces, text)
        before, after = self._frame_tokens(pieces)
        head = sum((p.str.len_bytes().cast(pl.Int64) for p in pieces[:-2]), pl.Series([0]))
        # The measuring columns are one prompt's bytes and tokens: Int32, 16 bytes a
        # record less for as long as the plan keeps them.
        keys = where.with_columns(
            records[self.id_column].alias("record_id"),
            before.cast(pl.Int32).alias("_before"),
            after.cast(pl.Int32).alias("_after"),
            head.cast(pl.Int32).alias("_head_bytes"),
            pieces[-2].str.len_bytes().cast(pl.Int32).alias("_tail_bytes"),
            chunk_keys(text, self.chunk).alias("_chunks"),
        )
        column = self.spec.input.adapter_column
        if column is not None:  # scheduling.adapters: no prefix is shared across adapters
            adapters = records[column].alias(ADAPTER)
            keys = keys.with_columns(adapters, salted(keys["_chunks"], adapters))
        return self._tokens(keys, pieces)

    def _note_start(self, pieces: list[pl.Series], text: pl.Series) -> None:
        leading = text.cast(pl.Binary).bin.head(self.chunk)
        if self.first is None:
            self.first = [p[0] for p in pieces]
        self.merge_start(leading.min(), leading.max())  # an empty prompt's b"" is lowest

    def _frame_tokens(self, pieces: list[pl.Series]) -> tuple[pl.Series, pl.Series]:
        """Exact tokens before the record's last text and after it: frame pieces by their
        distinct values, leading record texts through the encoder's cache."""
        before = pl.Series([0] * pieces[0].len(), dtype=pl.Int64)
        for k, column in enumerate(pieces[:-2]):
            if k % 2:
                counts = [len(ids) for ids in self.encoder.encode_shared(column.to_list())]
                before += pl.Series(counts, dtype=pl.Int64)
            else:
                before += self._frame_lengths(column, first=k == 0)
        return before, self._frame_lengths(pieces[-1])

    def _frame_lengths(self, column: pl.Series, first: bool = False) -> pl.Series:
        lengths = {t: self.encoder.frame_length(t, first) for t in column.unique()}
        return column.replace_strict(lengths, return_dtype=pl.Int64)

    def _tokens(self, keys: pl.DataFrame, pieces: list[pl.Series]) -> pl.DataFrame:
        """``tokens``: estimated, or exact for records whose bound could break the limit
        (and for the records the estimate was calibrated on)."""
        counted = None
        if self.tail is None:
            self.tail, counted = self._calibrate(keys, pieces)
        fixed, tail_bytes = pl.col("_before") + pl.col("_after"), pl.col("_tail_bytes")
        upper = fixed + self.tail.upper(tail_bytes) + pl.col("_answer")
        near = (upper > self.limit) | pl.lit(not self.tail.bound_holds)
        keys = keys.with_columns(
            (fixed + self.tail.estimate(tail_bytes)).alias("tokens"), near.alias("exact")
        )
        if counted:
            at = pl.Series(range(len(counted)), dtype=pl.UInt32)
            keys = keys.with_columns(
                keys["tokens"].scatter(at, counted), keys["exact"].scatter(at, True)
            )
        at = keys["exact"].arg_true()
        if counted:
            at = at.filter(at >= len(counted))
        if at.len():
            exact = self._exact([p.gather(at) for p in pieces])
            keys = keys.with_columns(keys["tokens"].scatter(at, exact))
        self.exact_records += int(keys["exact"].sum())
        return self._over_length(keys)

    def _calibrate(
        self, keys: pl.DataFrame, pieces: list[pl.Series]
    ) -> tuple[TailEstimate, list[int]]:
        sample = min(CALIBRATION_RECORDS, keys.height)
        exact = self._exact([p.head(sample) for p in pieces])
        fixed = (keys["_before"] + keys["_after"]).head(sample).to_list()
        tail_tokens = [e - f for e, f in zip(exact, fixed, strict=True)]
        return TailEstimate(keys["_tail_bytes"].head(sample).to_list(), tail_tokens), exact

    def refine(self, keys: pl.DataFrame) -> pl.DataFrame:
        """Estimated ``tokens`` made exact for the shared start: ``_shared_bytes`` and
        ``_shared_tokens`` (its exact ids), ``_shared_whole`` (it is the whole prompt).
        Drops the measuring columns."""
        covered = pl.col("_shared_bytes") - pl.col("_head_bytes")
        rest = (pl.col("_tail_bytes") - covered).clip(lower_bound=0)
        estimate = self.tail.estimate(rest) if self.tail else pl.lit(0)  # None: no records
        refined = (
            pl.when(pl.col("exact"))
            .then(pl.col("tokens"))
            .when(pl.col("_shared_whole"))
            .then(pl.col("_shared_tokens"))
            .when(covered > 0)
            .then(pl.col("_shared_tokens") + estimate + pl.col("_after"))
            .otherwise(pl.col("tokens"))
        )
        measuring = ["_before", "_after", "_head_bytes", "_tail_bytes"]
        measuring += ["_shared_bytes", "_shared_tokens", "_shared_whole"]
        return keys.with_columns(refined.alias("tokens")).drop(measuring)

    def _exact(self, pieces: list[pl.Series]) -> list[int]:
        """Exact prompt tokens, encoded exactly as the run will encode them."""
        return [len(ids) for ids in self.encoder.encode_pieces(rows(pieces))]

    def _over_length(self, keys: pl.DataFrame) -> pl.DataFrame:
        """Mark exactly measured records whose prompt and answer (the record's own
        max_tokens, with ``input.sampling_column``) exceed the context."""
        over = ((keys["tokens"] + keys["_answer"]) > self.limit) & keys["exact"]
        at = over.arg_true()
        kind = pl.Series("reject_kind", [None] * keys.height, dtype=pl.String)
        reason = pl.Series("reason", [None] * keys.height, dtype=pl.String)
        if at.len():
            tokens = keys["tokens"].gather(at).to_list()
            answers = keys["_answer"].gather(at).to_list()
            own = "its own max_tokens" if self.sampling is not None else None
            kind = kind.scatter(at, "over_length")
            reason = reason.scatter(
                at,
                [
                    over_length_reason(t, a, self.limit, own)
                    for t, a in zip(tokens, answers, strict=True)
                ],
            )
        return keys.with_columns(kind, reason).drop("_answer")


def _first_problem(problems: pl.DataFrame, more: list[tuple]) -> pl.DataFrame:
    """``problems`` with ``more`` filled in where a record has none yet."""
    if not any(kind for kind, _ in more):
        return problems
    first = zip(problems["reject_kind"].to_list(), problems["reason"].to_list(), strict=True)
    verdicts = [(k, r) if k else m for (k, r), m in zip(first, more, strict=True)]
    return pl.DataFrame(
        {"reject_kind": [k for k, _ in verdicts], "reason": [r for _, r in verdicts]},
        schema={"reject_kind": pl.String, "reason": pl.String},
    )
