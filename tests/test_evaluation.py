"""Eval metrics and the eval spec: hand-computed figures, and the keys users get wrong."""

from __future__ import annotations

import copy

import polars as pl
import pytest

from nightshift.errors import SpecErrors
from nightshift.evaluation import metrics
from nightshift.evaluation.score import score, with_cost, with_intervals
from nightshift.jobs.fingerprint import result_inputs
from nightshift.jobs.kept import kept_columns
from nightshift.jobs.loading import validate_spec

from .conftest import spec_dict

BASE = spec_dict("model-dir", "data/*.parquet", "out/x")


def test_classification_by_hand():
    truth = ["a", "a", "a", "b", "b", "c"]
    predicted = ["a", "a", "b", "b", "c", "c"]
    m = metrics.classification(truth, predicted, ["a", "b", "c", "d"])
    assert m["accuracy"] == pytest.approx(4 / 6) and m["correct"] == 4
    assert m["confusion"] == {
        "labels": ["a", "b", "c", "d"],
        "matrix": [[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]],
    }
    a, b, c = (m["per_label"][k] for k in "abc")
    assert (a["precision"], a["recall"], a["f1"], a["support"]) == pytest.approx((1, 2 / 3, 0.8, 3))
    assert (b["precision"], b["recall"], b["f1"]) == pytest.approx((0.5, 0.5, 0.5))
    assert (c["precision"], c["recall"], c["f1"]) == pytest.approx((0.5, 1.0, 2 / 3))
    # d never occurs (true or predicted): in the matrix, not in the macro average
    assert m["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)


def test_a_true_label_outside_the_label_set_gets_a_row():
    m = metrics.classification(["a", "other"], ["a", "b"], ["a", "b"])
    assert m["confusion"]["labels"] == ["a", "b", "other"]
    assert m["confusion"]["matrix"][2] == [0, 1, 0]
    assert m["per_label"]["other"]["recall"] == 0.0
    assert m["per_label"]["b"]["precision"] == 0.0  # predicted once, never right


def test_extraction_by_hand():
    answers = ['{"a": 1, "b": "x"}', '{"a": 2, "b": "x"}', "not json"]
    references = [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 3}]
    m = metrics.extraction(answers, references)
    assert m["valid_json_rate"] == pytest.approx(2 / 3)
    assert m["exact_match_rate"] == pytest.approx(1 / 3) and m["correct"] == 1
    # field b only in the first two references
    a = m["per_field"]["a"]
    assert (a["exact_match_rate"], a["records"], a["matches"]) == (pytest.approx(1 / 3), 3, 1)
    assert m["per_field"]["b"] == {"exact_match_rate": 0.5, "records": 2, "matches": 1}


def test_generation_exact_match_and_chrf():
    from sacrebleu.metrics import CHRF

    answers, references = ["Paris", " hello world ", "abc"], ["Paris", "hello world", "xyz"]
    m = metrics.generation(answers, references)
    assert m["exact_match_rate"] == pytest.approx(2 / 3) and m["correct"] == 2
    assert m["chrf"] == pytest.approx(CHRF().corpus_score(answers, [references]).score)
    assert metrics.generation(["same text"], ["same text"])["chrf"] == pytest.approx(100.0)
    assert metrics.generation([], [])["chrf"] is None


def frames(ok, failed=(), rejected=()):
    return (
        pl.DataFrame(ok, schema=["id", "truth", "answer"], orient="row"),
        pl.DataFrame(list(failed), schema=["id", "truth", "text"], orient="row"),
        pl.DataFrame(list(rejected), schema=["id", "truth"], orient="row"),
    )


def test_failed_rejected_and_unlabelled_records_count_apart():
    ok, failed, rejected = frames(
        [(1, "a", "a"), (2, "b", "a"), (3, None, "a"), (4, "a", "a")],
        failed=[(5, "a", "oops"), (6, None, "")],
        rejected=[(7, "b")],
    )
    q = score("classify", ["a", "b"], ok, failed, rejected)
    assert q["records"] == {
        "labelled": 5,
        "answered": 3,
        "failed": 1,
        "rejected": 1,
        "unlabelled": 2,
    }
    assert q["accuracy"] == pytest.approx(2 / 3)  # of the answered labelled ones
    assert q["coverage"] == pytest.approx(3 / 5)
    assert q["accuracy_of_labelled"] == pytest.approx(2 / 5)  # failed ones counted wrong
    assert with_cost(q, 0.5)["usd_per_1000_correct"] == pytest.approx(0.5 / 2 * 1000)
    assert with_cost(q, None)["usd_per_1000_correct"] is None


@pytest.mark.parametrize("kind", [pl.String, pl.Int64])
def test_classify_is_counted_by_polars_as_the_lists_would_count_it(kind):
    """The report scores a million answers by counting their (true, predicted) pairs in
    the frame: the very figures of the metrics over lists of text, labels that are
    integers in the input included (they score against labels written as text)."""
    import random

    rng = random.Random(7)
    values = ["1", "2", "3", "9"]
    truth = [rng.choice(values) for _ in range(500)]
    answer = [rng.choice(values[:3]) for _ in range(500)]
    ok = pl.DataFrame({"id": range(500), "truth": truth, "answer": answer})
    ok = ok.with_columns(pl.col("truth").cast(kind))
    q = score("classify", ["1", "2", "3"], ok, *frames([])[1:])
    lists = with_intervals(metrics.classification(truth, answer, ["1", "2", "3"]))
    assert {k: q[k] for k in lists} == lists
    assert q["confusion"]["labels"] == ["1", "2", "3", "9"] and q["scored"] == 500


def test_extract_valid_json_counts_failed_answers_and_bad_references_apart():
    ok, failed, rejected = frames(
        [(1, '{"a": 1}', '{"a":1}'), (2, "not json", '{"a":2}')],
        failed=[(3, '{"a": 1}', "{broken"), (4, '{"a": 5}', '{"a": "wrong type"}')],
    )
    q = score("extract", [], ok, failed, rejected)
    assert q["records"]["unlabelled"] == 1 and q["records"]["reference_not_json"] == 1
    assert q["valid_json_rate"] == pytest.approx(2 / 3)  # ok 1 + failed 2, one of them broken
    assert q["exact_match_rate"] == 1.0 and q["records"]["answered"] == 1


def with_eval(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data["input"]["keep_columns"] = ["subject"]
    for key, value in changes.items():
        section, _, name = key.partition("__")
        data.setdefault(section, {})[name] = value
    return data


def errors_for(data: dict):
    with pytest.raises(SpecErrors) as caught:
        validate_spec(data)
    return caught.value.errors


def test_a_label_in_the_prompt_is_refused_by_name():
    [err] = errors_for(with_eval(eval__label_column="body"))  # body is in prompt.template
    assert err.key == "eval.label_column"
    assert "is in prompt.template" in str(err) and "leak" in str(err)


@pytest.mark.parametrize(
    ("changes", "key", "fragment"),
    [
        ({"eval__label_column": "label"}, "eval.label_column", "clash with the output column"),
        ({"eval__label_column": "ticket_id"}, "eval.label_column", "input.id_column"),
        ({"eval__reference_column": "ref"}, "eval.reference_column", "use eval.label_column"),
        ({"eval__label_column": "x", "eval__reference_column": "y"}, "eval", "give one of"),
    ],
)
def test_eval_keys_users_get_wrong(changes, key, fragment):
    [err] = errors_for(with_eval(**changes))
    assert err.key == key and fragment in str(err)


def test_eval_is_kept_in_results_but_not_fingerprinted():
    plain = validate_spec(with_eval())
    scored = validate_spec(with_eval(eval__label_column="true_label"))
    assert kept_columns(scored) == ["subject", "true_label"]
    assert result_inputs(scored) == result_inputs(plain)  # a resumed run may add eval


def test_the_plan_decides_which_eval_column_is_kept():
    scored = validate_spec(with_eval(eval__label_column="true_label"))
    plain = validate_spec(with_eval())
    planned_without = ["ticket_id", "subject", "body"]
    planned_with = planned_without + ["true_label"]
    assert kept_columns(scored, planned_without) == ["subject"]  # eval added on resume
    assert kept_columns(plain, planned_with) == ["subject", "true_label"]  # eval dropped


def test_every_share_carries_its_wilson_interval_from_the_counts():
    """accuracy, coverage, each label's precision and recall: each interval is the Wilson
    interval of the counts behind the share, and the words people read show it."""
    from nightshift.intervals import wilson
    from nightshift.reports.quality import quality_summary_lines, quality_table_lines

    rows = [(i, "a" if i % 3 else "b", "a" if i % 4 else "b") for i in range(40)]
    ok, failed, rejected = frames(rows, failed=[(99, "a", "x")], rejected=[(98, "b")])
    q = score("classify", ["a", "b"], ok, failed, rejected)
    truth, answer = [t for _, t, _ in rows], [p for _, _, p in rows]
    correct = sum(t == p for t, p in zip(truth, answer, strict=True))
    assert q["accuracy_ci"] == wilson(correct, 40)
    assert q["coverage_ci"] == wilson(40, 42)
    assert q["accuracy_of_labelled_ci"] == wilson(correct, 42)
    a = q["per_label"]["a"]
    hits = sum(t == p == "a" for t, p in zip(truth, answer, strict=True))
    assert a["recall_ci"] == wilson(hits, truth.count("a"))
    assert a["precision_ci"] == wilson(hits, answer.count("a"))
    low, high = q["accuracy_ci"]
    shown = f"95% CI {low * 100:.1f}-{high:.1%}"
    q = {**q, "column": "t", "source": "s"}
    assert shown in quality_summary_lines({"quality": q}, False)[0]
    assert any(shown in line for line in quality_table_lines(q))


def test_extract_fields_and_exact_match_carry_intervals():
    from nightshift.intervals import wilson

    ok, failed, rejected = frames(
        [(1, '{"a": 1, "b": 2}', '{"a": 1, "b": 3}'), (2, '{"a": 2}', '{"a": 2}')]
    )
    q = score("extract", [], ok, failed, rejected)
    assert q["exact_match_rate_ci"] == wilson(1, 2)
    assert q["per_field"]["a"]["exact_match_rate_ci"] == wilson(2, 2)
    assert q["per_field"]["b"]["exact_match_rate_ci"] == wilson(0, 1)
