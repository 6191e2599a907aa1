"""Ordering, shard cuts and the reuse predictor, on small hand-made key tables.

Block size 4 throughout, so block arithmetic can be checked by hand. Every record has
``p0 = 2`` shared tokens (the chat frame); ``p1`` ends the record's document.
"""

from __future__ import annotations

import polars as pl
import pytest

from nightshift.scheduling.order import cut_shards, order_records
from nightshift.scheduling.reuse import predicted_cached, reuse_share

BLOCK = 4


def keys(rows: list[tuple[str, str, int, int]]) -> pl.DataFrame:
    """(record_id, document, p1, tokens) -> a one-level key table."""
    ids, docs, p1, tokens = zip(*rows, strict=True)
    return pl.DataFrame(
        {
            "record_id": list(ids),
            "tokens": list(tokens),
            "h1": pl.Series(list(docs)).hash(seed=1),
            "p0": [2] * len(rows),
            "p1": list(p1),
        }
    )


# Documents A (9 tokens to its end: two whole blocks) and B (12: three blocks) are each
# asked several questions; C's document ends at 3 tokens, inside the first block, so
# grouping C's records gains nothing and they are ordered by length alone.
INTERLEAVED = [
    ("a1", "A", 9, 14),
    ("b1", "B", 12, 15),
    ("c1", "C", 3, 30),
    ("a2", "A", 9, 20),
    ("b2", "B", 12, 17),
    ("c2", "C2", 3, 5),
    ("a3", "A", 9, 11),
    ("b3", "B", 12, 16),
]


def test_golden_order_groups_shared_prefixes_longest_group_and_record_first():
    ordered = order_records(keys(INTERLEAVED), levels=1, block_size=BLOCK)
    # The group whose longest record is longest goes first: c1 (30, shares no block) alone,
    # then A (longest 20), then B (longest 17), then c2; longest first within a group.
    assert ordered["record_id"].to_list() == ["c1", "a2", "a1", "a3", "b2", "b3", "b1", "c2"]
    assert ordered["position"].to_list() == list(range(8))


def test_order_is_deterministic_whatever_the_input_order():
    base = order_records(keys(INTERLEAVED), 1, BLOCK)["record_id"].to_list()
    for seed in range(5):
        shuffled = keys(INTERLEAVED).sample(fraction=1.0, shuffle=True, seed=seed)
        assert order_records(shuffled, 1, BLOCK)["record_id"].to_list() == base


def test_ties_are_broken_by_id():
    rows = [("r3", "D", 9, 10), ("r1", "D", 9, 10), ("r2", "D", 9, 10)]
    assert order_records(keys(rows), 1, BLOCK)["record_id"].to_list() == ["r1", "r2", "r3"]


def test_a_level_that_adds_no_whole_block_is_not_a_group():
    # Same short document for x1 and x3, a different one for x2: all end inside block 0,
    # so the order is by length alone, not by document.
    rows = [("x1", "S", 3, 10), ("x2", "T", 3, 12), ("x3", "S", 3, 8)]
    assert order_records(keys(rows), 1, BLOCK)["record_id"].to_list() == ["x2", "x1", "x3"]


def test_with_no_leading_level_records_run_longest_first():
    frame = keys(INTERLEAVED).drop("h1", "p1")
    ordered = order_records(frame, levels=0, block_size=BLOCK)
    assert ordered["tokens"].to_list() == sorted(frame["tokens"].to_list(), reverse=True)


def test_two_levels_nest_groups_inside_groups():
    # Level 1: a few-shot block (8 tokens: two blocks). Level 2: a document (4 more).
    frame = pl.DataFrame(
        {
            "record_id": ["q1", "q2", "q3", "q4"],
            "tokens": [20, 21, 22, 23],
            "h1": pl.Series(["F", "F", "F", "G"]).hash(seed=1),
            "h2": pl.Series(["F/d1", "F/d2", "F/d1", "G/d1"]).hash(seed=1),
            "p0": [2] * 4,
            "p1": [10] * 4,
            "p2": [14] * 4,
        }
    )
    ordered = order_records(frame, levels=2, block_size=BLOCK)["record_id"].to_list()
    assert ordered[0] == "q4"  # group G holds the longest record
    assert ordered[1:] in (["q3", "q1", "q2"], ["q2", "q3", "q1"])  # d1's pair stays adjacent


# The golden order is c1(30) | a2(20) a1(14) a3(11) | b2(17) b3(16) b1(15) | c2(5).
@pytest.mark.parametrize(
    ("max_records", "max_tokens", "shards"),
    [
        (4, 10**6, [0, 0, 0, 0, 1, 1, 1, 1]),  # c1 + A fill 4; B + c2 fill 4
        (3, 10**6, [0, 1, 1, 1, 2, 2, 2, 3]),  # A would not fit beside c1: it opens a shard
        (10, 50, [0, 1, 1, 1, 2, 2, 2, 3]),  # tokens: 30 | 45 | 48 | 5 (48 + 5 > 50)
        (2, 10**6, [0, 0, 1, 1, 2, 2, 3, 3]),  # groups of 3 cannot fit: they fill in order
    ],
)
def test_shard_cuts_keep_groups_together_where_they_fit(max_records, max_tokens, shards):
    ordered = order_records(keys(INTERLEAVED), 1, BLOCK)
    cut = cut_shards(ordered, 1, max_records, max_tokens)
    assert cut["shard"].to_list() == shards


def test_an_empty_plan_has_no_shards():
    ordered = order_records(keys(INTERLEAVED).head(0), 1, BLOCK)
    assert cut_shards(ordered, 1, 10, 100)["shard"].to_list() == []


def test_reuse_prediction_by_hand():
    # In the golden order, with a window of one record:
    #   c1: first record, nothing cached                                   -> 0
    #   a2: only p0 = 2 is hot, less than a block                          -> 0
    #   a1: a2 has A: min(p1 = 9, 14 - 1) = 9 -> whole blocks -> 8
    #   a3: 8;  b2: p0 only -> 0;  b3: min(12, 15) -> 12;  b1: 12;  c2: p0 -> 0
    ordered = order_records(keys(INTERLEAVED), 1, BLOCK)
    cached = predicted_cached(ordered, 1, BLOCK, window=1)
    assert cached.to_list() == [0, 0, 8, 8, 0, 12, 12, 0]
    assert reuse_share(cached, ordered["tokens"]) == pytest.approx(40 / 128)


def test_reuse_prediction_never_counts_a_prompts_last_token():
    # The whole prompt is the shared document: vLLM still computes the last token, so
    # the 8-token prompt reuses one block, not two.
    frame = keys([("d1", "D", 8, 8), ("d2", "D", 8, 8)])
    assert predicted_cached(frame, 1, BLOCK, window=1).to_list() == [0, 4]


def test_input_order_reuse_depends_on_how_many_prompts_the_cache_holds():
    frame = keys(INTERLEAVED)  # A at rows 0, 3, 6; B at rows 1, 4, 7
    assert predicted_cached(frame, 1, BLOCK, window=2).sum() == 0
    assert predicted_cached(frame, 1, BLOCK, window=3).to_list() == [0, 0, 0, 8, 12, 0, 8, 12]


def test_shards_share_nothing_in_the_prediction():
    ordered = cut_shards(order_records(keys(INTERLEAVED), 1, BLOCK), 1, 2, 10**6)
    cached = predicted_cached(ordered, 1, BLOCK, window=1, by="shard")
    # a1 opens shard 1 after a2 closed shard 0, so A's prefix is cold there.
    assert cached.to_list() == [0, 0, 0, 8, 0, 12, 0, 0]


def test_a_short_leading_field_does_not_split_the_groups_below_it():
    # Level 1 is a 1-token tag (no block); level 2 a long document: records group by
    # document even though level 1 is skipped.
    frame = pl.DataFrame(
        {
            "record_id": ["d1a", "d2a", "d1b", "d2b"],
            "tokens": [30, 25, 10, 28],
            "h1": pl.Series(["t", "t", "t", "t"]).hash(seed=1),
            "h2": pl.Series(["t/D1", "t/D2", "t/D1", "t/D2"]).hash(seed=1),
            "p0": [2] * 4,
            "p1": [3] * 4,
            "p2": [12] * 4,
        }
    )
    ordered = order_records(frame, levels=2, block_size=BLOCK)["record_id"].to_list()
    assert ordered == ["d1a", "d1b", "d2b", "d2a"]
