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
    return [
        None if text is None else Vector(_json_text(text, vector), vector)
        for text, vector in zip(texts, values, strict=True)
    ]


def _json_text(text: str, vector: np.ndarray) -> str:
    """A vector's array text; one holding NaN or an infinity as ``json.dumps`` writes
    them (NaN, Infinity: what Python's and the SDK's readers take), not polars' "inf"."""
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


def spliced(line: str, vectors: list[Vector]) -> str:
    """``line`` (dumped JSON) with each vector's text in place of its placeholder."""
    for index, vector in enumerate(vectors):
        line = line.replace(json.dumps(placeholder(index)), vector.text, 1)
    return line
