"""Scored labels a chunk at a time (``jobs.labelling``): a run's rows leave the label and
confidence of a scored answer to their chunk's table, which gives what labelling each
answer alone gives (``ClassifyHandler.parse``), to the last bit."""

from __future__ import annotations

import math
import random
import struct

import pyarrow as pa
import pytest

from nightshift.engines.base import EngineResult
from nightshift.errors import RecordError
from nightshift.jobs.labelling import SCORED, LabelScoring, label_of, label_rows, scored_columns
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.tasks import handler_for
from nightshift.running.results import ResultTables

from .conftest import spec_dict

LABELS = ["payment", "defect", "login", "general"]


def a_score(rng: random.Random) -> float:
    """Log probabilities as engines give them, with the edge cases among them: equal
    scores, impossible labels, and (rarely) a NaN or +inf an engine should never give."""
    roll = rng.random()
    if roll < 0.01:
        return math.nan
    if roll < 0.015:
        return math.inf
    if roll < 0.1:
        return -math.inf
    if roll < 0.2:
        return -1.0  # ties within a record
    return rng.uniform(-30, 0)


@pytest.mark.parametrize("labels", [2, 3, 4, 8, 9, 13])
def test_a_chunk_labels_every_row_as_the_record_alone_would(labels):
    rng = random.Random(labels)
    names = tuple(f"label{i}" for i in range(labels))
    scorings = [
        LabelScoring(names, tuple(range(labels))),  # not calibrated yet
        LabelScoring(names, tuple(range(labels)), tuple(rng.uniform(-4, 2) for _ in names)),
        LabelScoring(names, tuple(range(labels)), tuple(rng.uniform(-4, 2) for _ in names)),
    ]  # the job's and two adapters' leanings, their rows mixed in one chunk
    rows, alone = [], []
    while len(rows) < 2000:
        scores = tuple(a_score(rng) for _ in names)
        if max(scores) == -math.inf:
            continue  # a failed row at once (test below), never left to the chunk
        scoring = rng.choice(scorings)
        rows.append({"id": len(rows), **scored_columns(scoring, scores)})
        alone.append(label_of(scoring, scores))

    label_rows(rows)

    for row, (label, confidence) in zip(rows, alone, strict=True):
        assert SCORED not in row
        assert row["label"] == row["text"] == label
        assert struct.pack("<d", row["confidence"]) == struct.pack("<d", confidence)  # NaNs too
        assert row["finish_reason"] == "stop"


def test_the_weights_are_summed_left_to_right_on_every_python():
    """Python 3.12's sum() compensates; label_rows cannot, so neither may one record:
    1 + 1e-16 + 1e-16 is 1 left to right (and 1.0000000000000002 compensated)."""
    tiny = math.log(1e-16)
    chances = LabelScoring(("a", "b", "c"), (1, 2, 3)).probabilities([0.0, tiny, tiny])
    assert chances[0] == 1.0


def classify_tables(log_prior=None) -> ResultTables:
    data = spec_dict("m", "in", "out", task={"kind": "classify", "labels": LABELS})
    handler = handler_for(validate_spec(data).task, lambda text: [ord(text[0])])
    if log_prior is not None:
        handler = handler.calibrated(log_prior)
    schema = pa.schema([("id", pa.int64()), ("subject", pa.string())])
    return ResultTables(schema, "id", ["subject"], handler)


def answer(key: int, scores) -> EngineResult:
    return EngineResult(key, "pay", "length", 40, 1, 32, scores=scores)


@pytest.mark.parametrize("log_prior", [None, [-0.5, 0.2, -1.0, 0.1]])
def test_the_results_table_is_the_one_labelling_each_answer_alone_gives(log_prior):
    tables = classify_tables(log_prior)
    assert tables.task.scoring is not None  # labels with distinct first tokens: scored
    rng = random.Random(7)
    results = [answer(k, tuple(rng.uniform(-9, 0) for _ in LABELS)) for k in range(300)]
    rows = []
    for r in results:
        row, ok = tables.row(r.key, {"subject": f"s{r.key}"}, r)
        assert ok
        rows.append(row)
    copies = [{**row, "id": row["id"] + 1000} for row in rows[:10]]  # dedup's copies

    table = tables.results_table(rows + copies).to_pylist()

    for row, r in zip(table, results + results[:10], strict=True):
        parsed = tables.task.parse_result(r)
        assert {k: row[k] for k in parsed} == parsed
    assert [row["id"] for row in table[300:]] == list(range(1000, 1010))


def test_an_answer_the_check_refuses_is_a_failed_row_at_once():
    tables = classify_tables([-0.5, 0.2, -1.0, 0.1])
    for scores, error in [
        ((-math.inf,) * 4, "probability of 0"),
        (None, "no score"),
        ((-1.0, -2.0), "no score"),
    ]:
        row, ok = tables.row(1, {"subject": "s"}, answer(1, scores))
        assert not ok and error in row["error"] and SCORED not in row


@pytest.mark.parametrize(
    "log_prior", [[1.7e308] * 4, [-math.inf, 0.0, 0.0, 0.0], [math.nan, 0.0, 0.0, 0.0]]
)
def test_a_leaning_no_calibration_writes_labels_each_answer_alone(log_prior):
    """A calibration file edited to hold a huge number, an infinity or a NaN: each answer
    goes the per-record way, as before (here: a subtraction that overflows fails the
    row, as every label impossible)."""
    tables = classify_tables(log_prior)
    result = answer(1, (-1.7e308,) * 4 if log_prior[0] == 1.7e308 else (-1.0, -2.0, -3.0, -4.0))
    row, ok = tables.row(1, {"subject": "s"}, result)
    assert SCORED not in row
    if not ok:
        assert "probability of 0" in row["error"]
        with pytest.raises(RecordError):
            tables.task.parse_result(result)
    else:
        parsed = tables.task.parse_result(result)
        assert struct.pack("<d", row["confidence"]) == struct.pack("<d", parsed["confidence"])
    assert ok == (log_prior[0] != 1.7e308)


def test_a_leaning_of_the_wrong_length_is_refused_as_before():
    scoring = LabelScoring(("a", "b", "c"), (1, 2, 3), (0.5,))
    assert not scoring.plain_prior
    with pytest.raises(ValueError):
        label_of(scoring, (-1.0, -2.0, -3.0))
