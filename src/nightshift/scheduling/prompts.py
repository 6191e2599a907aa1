"""Turn a record into the text of its prompt.

Record values are data, never templates: a ticket body containing ``{subject}`` or
``{{ bos_token }}`` reaches the model exactly as written. That is why the template is
parsed once and filled by concatenation, never by ``str.format`` on user data or Jinja.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from nightshift.errors import RecordError


@dataclass(frozen=True)
class Messages:
    """The prompt as chat messages: an optional shared system text and the user text."""

    system: str | None
    user: str


class PromptTemplate:
    """A parsed ``prompt.template``: literal pieces and the columns between them."""

    def __init__(self, template: str, system: str | None = None) -> None:
        self.system = system
        self._pieces: list[tuple[str, str | None]] = [
            (literal, name) for literal, name, _, _ in string.Formatter().parse(template)
        ]
        self.columns: list[str] = list(
            dict.fromkeys(name for _, name in self._pieces if name is not None)
        )
        self.head, self.segments = _split_segments(self._pieces)

    def segment_texts(self, records: pl.DataFrame) -> list[pl.Series]:
        """Each segment's text for every record (see ``_split_segments``), vectorised.

        Values must be non-null here; ``null_fields`` finds the records that are not.
        """
        texts = []
        for column, literal in self.segments:
            value = column_text(records.get_column(column))
            texts.append(value + literal if literal else value)
        return texts

    def null_fields(self, records: pl.DataFrame) -> pl.Series:
        """Per record, the first template column that is null in it, else null."""
        reason = pl.lit(None, dtype=pl.String)
        for column in reversed(self.columns):
            reason = pl.when(pl.col(column).is_null()).then(pl.lit(column)).otherwise(reason)
        return records.select(reason.alias("null_field")).to_series()

    def render(self, record: Mapping[str, Any]) -> Messages:
        """Fill the template from ``record``; a missing or null column is a RecordError."""
        out: list[str] = []
        for literal, name in self._pieces:
            out.append(literal)
            if name is None:
                continue
            if name not in record:
                raise RecordError(f"missing field {name!r}", "missing_field")
            value = record[name]
            if value is None:
                raise RecordError(f"field {name!r} is null", "null_field")
            out.append(as_text(value))
        return Messages(self.system, "".join(out))


def _split_segments(
    pieces: list[tuple[str, str | None]],
) -> tuple[str, list[tuple[str, str]]]:
    """The template as a static head and one (column, literal after it) per placeholder.

    Segments are where prompts can start to differ, so they are the units of prefix
    sharing: records with the same first k segment texts share that prompt prefix. The
    head is the same in every prompt, so it is measured once.
    """
    head, segments = "", []
    for literal, name in pieces:
        if segments:
            column, after = segments[-1]
            segments[-1] = (column, after + literal)
        else:
            head += literal
        if name is not None:
            segments.append((name, ""))
    return head, segments


def column_text(values: pl.Series) -> pl.Series:
    """A column's values as prompt text, exactly as ``as_text`` writes one value."""
    if values.dtype in (pl.String, pl.Categorical, pl.Enum) or values.dtype.is_integer():
        return values.cast(pl.String)
    # Rare types (floats, nested, bytes) go through Python so they read exactly as as_text.
    texts = [None if v is None else as_text(v) for v in values.to_list()]
    return pl.Series(values.name, texts, dtype=pl.String)


def as_text(value: Any) -> str:
    """A column value as prompt text: nested values as JSON, bytes as UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)
