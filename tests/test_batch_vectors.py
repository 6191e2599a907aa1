"""Embeddings as output lines carry them (``batch.vectors``): JSON text made a vector at a
time, read back as the same float32 values, whatever the column's list type."""

from __future__ import annotations

import base64
import json

import numpy as np
import pyarrow as pa

from nightshift.batch.results import dumps
from nightshift.batch.vectors import as_base64, placeholder, read_vectors, spliced


def test_vectors_read_back_as_the_same_float32_from_either_list_type():
    rng = np.random.default_rng(3)
    values = (rng.standard_normal((6, 48)) * 10.0 ** rng.integers(-12, 12, (6, 48))).astype("f4")
    values[0, :4] = [0.0, -0.0, 1.0, 3.4e38]
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 48)
    varied = pa.array([*values.tolist(), None, []], pa.list_(pa.float32()))
    for column in (fixed, pa.chunked_array([varied.slice(0, 3), varied.slice(3)])):
        vectors = read_vectors(column)
        for k, row in enumerate(values):
            parsed = np.asarray(json.loads(vectors[k].text), dtype="f4")
            assert np.array_equal(parsed, row) and str(parsed[1]) != "nan"
            assert np.array_equal(np.signbit(parsed), np.signbit(row))  # -0.0 stays
            assert base64.b64decode(as_base64(vectors[k])) == row.astype("<f4").tobytes()
    null, empty = read_vectors(varied)[6:]
    assert null is None and empty.text == "[]"


def test_each_float32_is_written_in_its_shortest_form():
    """As OpenAI writes them: 0.1, never the double it widens to (0.10000000149011612)."""
    column = pa.array([[0.1, 1e-07, 3.4e38, 123456.0, 1e-45, -2.5]], pa.list_(pa.float32()))
    assert read_vectors(column)[0].text == "[0.1, 1e-7, 3.4e+38, 123456.0, 1e-45, -2.5]"


def test_nan_and_infinity_are_written_as_json_dumps_writes_them():
    [vector] = read_vectors(pa.array([[1.5, float("nan"), float("inf"), -float("inf")]]))
    assert vector.text == "[1.5, NaN, Infinity, -Infinity]"
    assert json.loads(vector.text)[2] == float("inf")


def test_each_placeholder_takes_its_own_vector_once():
    a, b = read_vectors(pa.array([[0.25, 0.5], [1.0]], pa.list_(pa.float32())))
    line = {
        "custom_id": "x",
        "data": [{"embedding": placeholder(0)}, {"embedding": placeholder(1)}],
    }
    text = spliced(dumps(line), [a, b])
    assert json.loads(text)["data"] == [{"embedding": [0.25, 0.5]}, {"embedding": [1.0]}]
    assert text.endswith("\n") and "\\u0000" not in text


def test_placeholders_count_every_vector_of_a_line_null_or_not():
    """A line's vectors keep their places whatever they are; 2,048 go in one pass."""
    import numpy as np

    many = read_vectors(
        pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2048 * 2, dtype="f4")), 2)
    )
    line = {"data": [{"embedding": placeholder(i)} for i in range(2048)]}
    data = json.loads(spliced(dumps(line), many))["data"]
    assert [d["embedding"] for d in data] == [[2.0 * i, 2.0 * i + 1] for i in range(2048)]
    a, b = many[:2]
    line = {
        "data": [{"embedding": placeholder(0)}, {"embedding": None}, {"embedding": placeholder(2)}]
    }
    assert json.loads(spliced(dumps(line), [a, None, b]))["data"][2] == {"embedding": [2.0, 3.0]}


def test_a_null_inside_a_vector_stays_a_null_in_its_place():
    [vector] = read_vectors(pa.array([[0.25, None, 0.5]], pa.list_(pa.float32())))
    assert json.loads(vector.text) == [0.25, None, 0.5]
