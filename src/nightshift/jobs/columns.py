"""The columns of a job's output: those nightshift writes, and the input types it reads.

The results and failed tables (``running.results``) take their own columns from
``written_fields`` below, and the spec refuses an id or kept column of any name it gives
(``OUTPUT_COLUMNS``): one list, so a new output column is refused as input at once.
rejects.parquet renames its own two columns around the input's instead
(``io.planstore.reject_column_names``).

The planner and the result writer read the job's columns through polars, which panics
or refuses on a few Arrow types Parquet can hold. Checking the input's schema up front
turns that into one clear error naming the column and the spec key that asked for it.
"""

from __future__ import annotations

import pyarrow as pa

from nightshift.errors import SpecError

TEXT_COLUMN = "text"
ERROR_COLUMN = "error"  # failed rows: why
# dedup: the id of the record whose answer a row repeats, null when its own
ANSWERED_FROM = "answered_from"
# The results column a job with input.sampling_column adds (see running.results).
DETAIL_COLUMN = "detail"
# What each task kind parses out of an answer (jobs.tasks)
TASK_COLUMNS: dict[str, dict[str, pa.DataType]] = {
    "generate": {},
    "classify": {"label": pa.string()},
    "extract": {"json": pa.string()},
}
_COUNTS = [
    pa.field("finish_reason", pa.string()),
    pa.field("prompt_tokens", pa.int32()),
    pa.field("output_tokens", pa.int32()),
    pa.field("cached_tokens", pa.int32()),
]


def written_fields(
    id_type: pa.DataType, task_columns: dict[str, pa.DataType], detail: bool
) -> tuple[list[pa.Field], list[pa.Field]]:
    """nightshift's own columns of (results, failed), after the id and kept columns."""
    counts = _COUNTS + [pa.field(ANSWERED_FROM, id_type)]
    if detail:  # input.sampling_column: every choice, as JSON (running.results.detail_json)
        counts.append(pa.field(DETAIL_COLUMN, pa.string()))
    task = [pa.field(name, kind) for name, kind in task_columns.items()]
    results = [pa.field(TEXT_COLUMN, pa.string()), *task, *counts]
    failed = [pa.field(ERROR_COLUMN, pa.string()), pa.field(TEXT_COLUMN, pa.string()), *counts]
    return results, failed


def _names_written(detail: bool) -> frozenset[str]:
    """Every column name ``written_fields`` gives any task kind."""
    names = set()
    for columns in TASK_COLUMNS.values():
        for fields in written_fields(pa.string(), columns, detail):
            names.update(f.name for f in fields)
    return frozenset(names)


# An id or kept input column may take none of these names: its value would be lost under
# nightshift's (every task's, so changing the task never makes a spec invalid).
OUTPUT_COLUMNS = _names_written(detail=False)
# ... and with input.sampling_column, none of these either.
DETAIL_COLUMNS = _names_written(detail=True) - OUTPUT_COLUMNS


def check_column_types(schema: pa.Schema, needed: dict[str, str]) -> None:
    """``needed`` maps column -> the spec key that asked for it, as ``check_columns``."""
    for column, key in needed.items():
        if column not in schema.names:
            continue  # check_columns names a missing column
        kind = schema.field(column).type
        problem = unsupported(kind)
        if problem:
            raise SpecError(
                key,
                f"column {column!r} holds {kind}, {problem}",
                "cast it in the input (to a string, a float or decimal128 with precision "
                "up to 38) or leave the column out",
            )


def unsupported(kind: pa.DataType) -> str | None:
    """Why polars cannot take ``kind`` (nested types included), or None."""
    if isinstance(kind, pa.Decimal256Type):
        return "a 256-bit decimal, which polars cannot read"
    if pa.types.is_union(kind):
        return "a union type, which polars cannot read"
    if pa.types.is_interval(kind):
        return "an interval type, which polars cannot read"
    if kind.id in _UNREADABLE_IDS:
        return f"a {kind} type, which polars cannot read"
    if isinstance(kind, pa.ExtensionType):
        return unsupported(kind.storage_type)
    if pa.types.is_dictionary(kind):
        return unsupported(kind.value_type)
    for i in range(kind.num_fields):  # lists, structs, maps: check what they hold
        reason = unsupported(kind.field(i).type)
        if reason:
            return reason
    return None


def _type_ids(*names: str) -> frozenset[int]:
    """Arrow type ids of ``names``, for the types this pyarrow has."""
    makers = {
        "run_end_encoded": lambda: pa.run_end_encoded(pa.int32(), pa.string()),
        "list_view": lambda: pa.list_view(pa.int32()),
        "large_list_view": lambda: pa.large_list_view(pa.int32()),
    }
    return frozenset(makers[n]().id for n in names if hasattr(pa, n))


_UNREADABLE_IDS = _type_ids("run_end_encoded", "list_view", "large_list_view")
