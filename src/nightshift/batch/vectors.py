"""Embeddings as a batch's output lines carry them, made a slice of rows at a time.

Writing a vector's floats one by one through ``json.dumps`` cost about 350 µs a line for
576 dimensions (each float32 widened to a double and printed with 17 digits), far more
than embedding it. Here each vector becomes JSON text in one orjson call (20 µs for 384
dimensions; a polars cast of the slice to text took 40): each float32 in its shortest
form that reads back as the same float32 (as OpenAI writes them), joined as
``json.dumps`` joins a list. An output line holds a placeholder where
the vector goes (``placeholder``) and takes the text in after it is dumped (``spliced``).
"""

from __future__ import annotations

import base64
import json
import re
from typing import NamedTuple

import numpy as np
import orjson
import pyarrow as pa


class Vector(NamedTuple):
    """One embedding: its JSON array text, and its values (for base64)."""

    text: str
    values: np.ndarray


def read_vectors(column: pa.Array | pa.ChunkedArray) -> list[Vector | None]:
    """The vectors of an Arrow list (or fixed-size list) column; None where null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    values = column.to_numpy(zero_copy_only=False)
    # A null inside a vector (never an engine's): numpy would read it as NaN.
    holes = hasattr(column, "flatten") and column.flatten().null_count  # not a null type
    rows = column.to_pylist() if holes else [None] * len(values)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [
        Vector(_json_text(vector, row), vector) if ok else None
        for vector, row, ok in zip(values, rows, valid, strict=True)
    ]


def _json_text(vector: np.ndarray, row: list | None) -> str:
    """A vector's array text as ``json.dumps`` would read it: NaN and infinities as it
    writes them (NaN, Infinity: what Python's and the SDK's readers take; orjson would
    write null), a null element as null."""
    if row is not None and None in row:
        return json.dumps(row)
    text = orjson.dumps(np.ascontiguousarray(vector), option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" in text:  # NaN or an infinity: rare, checked here
        return json.dumps(np.asarray(vector, dtype=np.float64).tolist())
    return text.decode().replace(",", ", ")


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
