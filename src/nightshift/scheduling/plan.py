"""Plan a job: measure every record, set aside what cannot run, order the rest, cut shards.

The input is streamed in batches (``scheduling.firstpass``) and only small per-record
keys are kept (where the record is, its id, prompt tokens and keys of its text's byte
chunks), never its text, so memory grows by a few hundred bytes per record. A second
pass reads the records that share a chunk with another, to encode each shared start
once (``scheduling.prefixes``). Ordering and shard cutting are in ``scheduling.order``;
writing the plan next to the output is in ``io.planstore``.
"""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds

from nightshift.engines.tokenizer import PromptEncoder, model_source
from nightshift.engines.tokenizerid import TokenizerIdentity
from nightshift.errors import SpecError
from nightshift.io.inputs import (
    check_columns,
    check_id_type,
    open_input,
)
from nightshift.io.planstore import POSITION, PlanFiles
from nightshift.jobs.columns import check_column_types
from nightshift.jobs.modelcheck import check_model_source
from nightshift.jobs.platform import batch_limits
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.tasks import answer_budget, labels_by
from nightshift.memory import give_back_freed
from nightshift.scheduling import tokenizermemo
from nightshift.scheduling.adapters import ADAPTER
from nightshift.scheduling.chunkkeys import ChunkKeys
from nightshift.scheduling.dedup import (
    ANSWERED_FROM,
    dedup_applies,
    place_copies,
    repeats_summary,
    split_copies,
)
from nightshift.scheduling.firstpass import measure_input
from nightshift.scheduling.frames import take_rows
from nightshift.scheduling.helpers import Helpers
from nightshift.scheduling.known import KnownIds
from nightshift.scheduling.kvcache import block_size, kv_cache_tokens
from nightshift.scheduling.measure import RecordMeasurer
from nightshift.scheduling.order import cut_shards, order_records, prefix_levels
from nightshift.scheduling.prefixes import shared_blocks
from nightshift.scheduling.reuse import predicted_cached, reuse_share

RECORD_KEYS = ["position", "shard", "record_id", "_file", "_row", "tokens", "exact", ANSWERED_FROM]


@dataclass
class Plan(PlanFiles):
    """Everything the run needs to know before it starts, and nothing per-record but keys."""

    dataset: ds.FileSystemDataset  # the input files, in the order _file numbers them
    columns: list[str]  # the input columns the job uses (id, kept, template)
    input_records: int
    records: pl.DataFrame  # runnable records in run order: RECORD_KEYS + predicted_cached
    rejects: pl.DataFrame  # _file, _row, record_id, reject_kind, reason
    prefix_reuse: dict[str, Any]
    exact_records: int  # records whose tokens were counted, not estimated
    shard_adapters: dict[int, list[str | None]] | None = None  # with input.adapter_column

    def shard_summaries(self) -> list[dict[str, Any]]:
        summary = self.records.group_by("shard").agg(
            pl.len().alias("records"),
            pl.col("tokens").sum().alias("prompt_tokens"),
            pl.col("predicted_cached").sum().alias("predicted_cached"),
        )
        shards = summary.sort("shard").rename({"shard": "index"}).to_dicts()
        for shard in shards:  # a job with input.adapter_column: its shards' adapters
            if self.shard_adapters is not None and shard["index"] in self.shard_adapters:
                shard["adapters"] = self.shard_adapters[shard["index"]]
        return shards


def job_columns(spec: JobSpec) -> dict[str, str]:
    """Input column -> the spec key that needs it (the first key wins)."""
    needed = {spec.input.id_column: "input.id_column"}
    for col in spec.input.keep_columns:
        needed.setdefault(col, "input.keep_columns")
    for col in spec.template_columns():
        needed.setdefault(col, spec.prompt.source_key())
    if spec.input.sampling_column is not None:
        needed.setdefault(spec.input.sampling_column, "input.sampling_column")
    if spec.input.adapter_column is not None:
        needed.setdefault(spec.input.adapter_column, "input.adapter_column")
    if spec.eval is not None:  # kept in the results for the report's eval, never prompted
        needed.setdefault(spec.eval.column, spec.eval.key)
    return needed


def open_job_input(spec: JobSpec) -> tuple[ds.FileSystemDataset, list[str]]:
    dataset = open_input(spec.input.path, exclude=spec.output.path)
    needed = job_columns(spec)
    check_columns(dataset, needed)
    if POSITION in needed:
        raise SpecError(
            needed[POSITION],
            f"column {POSITION!r} has the one name nightshift reserves for itself",
            "rename it in the input or leave it out of the job",
        )
    check_id_type(dataset, spec.input.id_column)
    check_column_types(dataset.schema, needed)
    if spec.prompt.messages_column is not None:
        check_messages_type(dataset, spec.prompt.messages_column)
    if spec.input.sampling_column is not None:
        check_sampling_type(dataset, spec.input.sampling_column)
    if spec.input.adapter_column is not None:
        check_text_type(dataset, spec.input.adapter_column, "input.adapter_column")
    return dataset, list(needed)


def check_text_type(dataset: ds.FileSystemDataset, column: str, key: str) -> None:
    """A column of names must hold text (or only nulls)."""
    kind = dataset.schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise SpecError(key, f"column {column!r} is {kind}, not text", "give adapter names")


def check_sampling_type(dataset: ds.FileSystemDataset, column: str) -> None:
    """The sampling column must hold text: one JSON object per record (or all null)."""
    kind = dataset.schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_null(kind)):
        raise SpecError(
            "input.sampling_column",
            f"column {column!r} is {kind}, not text",
            "give a column of JSON strings such as '{\"max_tokens\": 64}', one per record",
        )


def check_messages_type(dataset: ds.FileSystemDataset, column: str) -> None:
    """The messages column must hold lists of {role, content} structs with text roles."""
    kind = dataset.schema.field(column).type
    listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    turn = kind.value_type if listed else None
    names = [turn.field(i).name for i in range(turn.num_fields)] if _is_struct(turn) else []
    role = turn.field("role").type if "role" in names else None
    if (
        "content" in names
        and role is not None
        and (pa.types.is_string(role) or pa.types.is_large_string(role))
    ):
        return
    raise SpecError(
        "prompt.messages_column",
        f"column {column!r} is {kind}, not a list of {{role, content}} turns",
        "give a column of lists of structs with a text role and a text content "
        "(the Hugging Face / OpenAI messages shape), or use prompt.template",
    )


def build_plan(
    spec: JobSpec,
    encoder: PromptEncoder,
    progress: bool = True,
    skip_ids: KnownIds | None = None,
    first_shard: int = 0,
    helpers: Helpers | None = None,
) -> Plan:
    """Plan every input record, except those whose id is in ``skip_ids`` (already
    planned in this output); shards are numbered from ``first_shard``. ``helpers``
    (processes the run lends) measure input beside this one: the plan is the same."""
    with collector_paused():
        return _build_plan(spec, encoder, progress, skip_ids, first_shard, helpers)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while planning. A plan holds a batch's pieces and a
    node's ids as Python objects, and makes no cycles: on a job of 1,000,000 records the
    collector made 17 full passes over them, 0.3-0.5 s each, and collected nothing."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _build_plan(
    spec: JobSpec,
    encoder: PromptEncoder,
    progress: bool,
    skip_ids: KnownIds | None,
    first_shard: int,
    helpers: Helpers | None = None,
) -> Plan:
    dataset, columns = open_job_input(spec)
    block = block_size(spec)
    measurer = RecordMeasurer(spec, encoder, block)
    with ChunkKeys() as chunks:  # each record's chunk keys, in a file until shared_blocks
        digests = dedup_applies(spec)
        keys = measure_input(
            dataset, columns, measurer, progress, skip_ids, chunks, digests, helpers
        )
        keys = _reject_duplicate_ids(keys, spec.input.id_column)
        input_records, rejects, runnable = _set_rejects_apart(keys)
        del keys  # memory is tight: from here the frames are copies of the runnable records
        # Exact repeats (scheduling.dedup): order and cut the originals, copies follow them.
        runnable, copies = split_copies(runnable)
        copies = copies.drop("_seq")  # only originals' chunks count
        give_back_freed()
        runnable, leaves = shared_blocks(dataset, measurer, runnable, chunks, helpers)
    give_back_freed()
    runnable = prefix_levels(runnable, block, leaves)  # the levels hold the order's keys
    del leaves
    window = _cache_window(spec, runnable)
    input_order = reuse_share(predicted_cached(runnable, block, window), runnable["tokens"])
    ordered = order_records(runnable, block)
    del runnable  # the order is a copy of it
    give_back_freed()
    ordered = cut_shards(ordered, spec.plan.shard_records, spec.plan.shard_tokens)
    ordered = ordered.with_columns(pl.col("shard") + first_shard)
    ordered = ordered.with_columns(predicted_cached(ordered, block, window, by="shard"))
    # Over the prompts sent, as vLLM measures it: copies send nothing.
    predicted = reuse_share(ordered["predicted_cached"], ordered["tokens"])
    adapters = _adapters_by_shard(ordered)  # copies run under their original's adapter
    ordered = ordered.select([*RECORD_KEYS, "predicted_cached"])  # the order's keys are done
    ordered = place_copies(ordered, copies)  # dedup: copies right after their original
    reuse = {
        "predicted": predicted,
        "input_order": input_order,
        "block_size": block,
        "cache_window_records": window,
        "shared_start_tokens": measurer.shared_start_tokens,  # reuse.reuse_note: why none
    }
    return Plan(
        dataset=dataset,
        columns=columns,
        input_records=input_records,
        records=ordered,
        rejects=rejects,
        prefix_reuse=reuse,
        exact_records=measurer.exact_records,
        shard_adapters=adapters,
    )


def _adapters_by_shard(ordered: pl.DataFrame) -> dict[int, list[str | None]] | None:
    """Each shard's adapters (``input.adapter_column``; None: the base model), in run
    order, for plan.json: calibration samples each adapter's own shards without reading
    every shard for them. None for a job without adapters."""
    if ADAPTER not in ordered.columns:
        return None
    each = ordered.group_by("shard").agg(pl.col(ADAPTER).unique(maintain_order=True))
    return {int(shard): names for shard, names in each.iter_rows()}


def _set_rejects_apart(keys: pl.DataFrame) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    """(input records, rejects, runnable records). Takes ``keys``: the runnable records
    are moved out of it (``scheduling.frames``), or are ``keys``' own columns where none
    is rejected (the common case)."""
    rejected = keys["reject_kind"].is_not_null()
    rejects = keys.filter(rejected).select("_file", "_row", "record_id", "reject_kind", "reason")
    input_records = keys.height
    runnable = take_rows(keys, ~rejected) if rejects.height else keys
    return input_records, rejects, runnable.drop("reject_kind", "reason")  # null in all


def _is_struct(kind: pa.DataType | None) -> bool:
    return kind is not None and pa.types.is_struct(kind)


def _reject_duplicate_ids(keys: pl.DataFrame, id_column: str) -> pl.DataFrame:
    """A repeated id is rejected on every record after its first (in input order)."""
    repeated = pl.col("record_id").is_not_null() & ~pl.col("record_id").is_first_distinct()
    reason = f"duplicate {id_column}: an earlier record has it"
    return keys.with_columns(
        pl.when(repeated)
        .then(pl.lit("duplicate_id"))
        .otherwise("reject_kind")
        .alias("reject_kind"),
        pl.when(repeated).then(pl.lit(reason)).otherwise("reason").alias("reason"),
    )


def _cache_window(spec: JobSpec, runnable: pl.DataFrame) -> int:
    """How many recent prompts the KV cache holds: its tokens over the mean prompt."""
    capacity = kv_cache_tokens(spec)
    mean = runnable["tokens"].mean() if runnable.height else None
    if capacity is None or not mean:
        # at least the running batch stays resident (no CPU figure: a GPU host's batch)
        return batch_limits(spec.engine, "large-gpu")[0]
    return max(1, int(capacity // mean))


def describe(plan: Plan, spec: JobSpec) -> dict[str, Any]:
    """The plan in numbers, as `jobs plan` prints it and plan.json stores it."""
    kinds = dict(Counter(plan.rejects["reject_kind"].to_list()).most_common())
    tokens = plan.records["tokens"]
    shards = plan.shard_summaries()
    return {
        "job": spec.name,
        "records": {
            "input": plan.input_records,
            "runnable": plan.records.height,
            "rejected": plan.rejects.height,
            "over_length": kinds.get("over_length", 0),
        },
        "rejects_by_kind": kinds,
        "tokens": {
            "prompt": int(tokens.sum()),
            "prompt_max": int(tokens.max() or 0),
            "output_at_most": plan.records.height * answer_budget(spec),
            "counted_exactly_records": plan.exact_records,
            "note": "prompt tokens are counted exactly for shared prefixes and records near "
            "the context limit, and estimated from bytes for the rest",
        },
        "shards": {
            "count": len(shards),
            "records_max": max((s["records"] for s in shards), default=0),
            "prompt_tokens_max": max((s["prompt_tokens"] for s in shards), default=0),
            "each": shards,
        },
        "prefix_reuse": plan.prefix_reuse,
        "repeats": repeats_summary(plan.records),  # dedup: answered from another record
        **labels_by(spec),  # classify: scored or generated labels, fixed for the output
    }


def prepare_reasoning(encoder: PromptEncoder, parser: str, budget: int | None) -> None:
    """A reasoning model's markers must be tokens of its tokenizer (SpecError, one line,
    if not); a budget of 0 renders prompts with thinking off where the template can."""
    from nightshift.engines.reasoning import markers_for, thinking_off

    markers_for(parser, encoder.hf_tokenizer)
    if budget == 0:
        encoder.template_kwargs = thinking_off(encoder.hf_tokenizer)


def load_encoder(spec: JobSpec, like: TokenizerIdentity | None = None) -> PromptEncoder:
    """The job's prompt encoder; ``like``: the tokenizer as the run loaded it (an
    encoding process's load, ``engines.tokenizerid.TokenizerIdentity``)."""
    key = "model.tokenizer" if spec.model.tokenizer else "model.path"
    source = spec.model.tokenizer or spec.model.path
    check_model_source(source, key)  # a name that is no folder and cannot be fetched: at once
    trust, folder = spec.model.trust_remote_code, model_source(source)
    known = like or tokenizermemo.recall(folder, trust)  # AutoTokenizer's pick, remembered
    encoder = PromptEncoder.load(source, trust, key, known)
    if like is None and encoder.identity() != known:
        tokenizermemo.remember(folder, trust, encoder.identity())
    if spec.model.reasoning:  # its markers checked before any prompt is rendered
        prepare_reasoning(encoder, spec.model.reasoning, spec.sampling.reasoning_budget)
    return encoder
