"""Embeddings as a batch's output lines carry them, made a slice of rows at a time.

Writing a vector's floats one by one through ``json.dumps`` cost about 350 µs a line for
576 dimensions (each float32 widened to a double and printed with 17 digits), far more
than embedding it. Here a slice of vectors becomes JSON text in one polars cast: each
float32 in its shortest form that reads back as the same float32 (as OpenAI writes
them), joined as ``json.dumps`` joins a list. An output line holds a placeholder where
the vector goes (``placeholder``) and takes the text in after it is dumped (``spliced``).
"""

from __future__ import annotations

import base64
import json
import re
from typing import NamedTuple

import numpy as np
import polars as pl
import pyarrow as pa


class Vector(NamedTuple):
    """One embedding: its JSON array text, and its values (for base64)."""

    text: str
    values: np.ndarray


def read_vectors(column: pa.Array | pa.ChunkedArray) -> list[Vector | None]:
    """The vectors of an Arrow list (or fixed-size list) column; None where null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    texts = pl.Series(values=column).cast(pl.List(pl.String)).list.join(", ").to_list()
    values = column.to_numpy(zero_copy_only=False)
    # A null inside a vector (never an engine's): polars' join would drop it silently.
    holes = hasattr(column, "flatten") and column.flatten().null_count  # not a null type
    rows = column.to_pylist() if holes else [None] * len(texts)
    return [
        None if text is None else Vector(_json_text(text, vector, row), vector)
        for text, vector, row in zip(texts, values, rows, strict=True)
    ]


def _json_text(text: str, vector: np.ndarray, row: list | None) -> str:
    """A vector's array text as ``json.dumps`` would read it: NaN and infinities as it
    writes them (NaN, Infinity: what Python's and the SDK's readers take, not polars'
    "inf"), a null element as null."""
    if row is not None and None in row:
        return json.dumps(row)
    if "n" in text or "N" in text:  # only "NaN" and "inf" hold an n: rare, checked here
        return json.dumps(np.asarray(vector, dtype=np.float64).tolist())
    return f"[{text}]"


def as_base64(vector: Vector | list[float]) -> str:
    """OpenAI's ``encoding_format: base64``: the little-endian float32 bytes, base64."""
    values = vector.values if isinstance(vector, Vector) else vector
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


def placeholder(index: int) -> str:
    """What an output line holds where its ``index``-th vector goes. A NUL is never in a
    served model name nor (refused on input) an embeddings line's custom_id, so nothing
    from the request can hold it."""
    return f"\x00nightshift-vector-{index}\x00"


_PLACEHOLDER = re.compile(r'"\\u0000nightshift-vector-(\d+)\\u0000"')  # as dumped


def spliced(line: str, vectors: list) -> str:
    """``line`` (dumped JSON) with each ``Vector``'s text in place of the placeholder of
    its index in ``vectors``, in one pass (a line of 2,048 vectors is some 14 MB)."""

    def text(match: re.Match) -> str:
        vector = vectors[int(match.group(1))]
        return vector.text if isinstance(vector, Vector) else match.group(0)

    return _PLACEHOLDER.sub(text, line)
