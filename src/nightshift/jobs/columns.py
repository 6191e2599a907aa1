"""Which input column types a job can read.

The planner and the result writer read the job's columns through polars, which panics
or refuses on a few Arrow types Parquet can hold. Checking the input's schema up front
turns that into one clear error naming the column and the spec key that asked for it.
"""

from __future__ import annotations

import pyarrow as pa

from nightshift.errors import SpecError


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
