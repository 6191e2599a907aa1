"""Ordering, shard cuts and the reuse predictor, on small hand-made key tables.

Block size 4 throughout, so block arithmetic can be checked by hand. A record's
``blocks`` are keys of the whole KV blocks of its prompt that others may share; here a
document of ``p1`` tokens (after a 2-token chat frame, which fills no block alone) gives
``p1 // 4`` blocks, each key naming the document and its depth.
"""

from __future__ import annotations

import random

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from nightshift.scheduling.order import (
    cut_shards,
    leaves_of,
    level_count,
    order_records,
    prefix_levels,
)
from nightshift.scheduling.reuse import predicted_cached, reuse_share

BLOCK = 4


def key(*path: str) -> int:
    """A block key: equal paths, equal keys (a key covers every block before it)."""
    return pl.Series(["/".join(path)]).hash(seed=1)[0]


def frame(ids: list[str], tokens: list[int], paths: list[list[str]]) -> pl.DataFrame:
    """Records whose blocks are keys of the given paths' prefixes: ["A", "x"] -> [A, A/x]."""
    blocks = [[key(*path[: k + 1]) for k in range(len(path))] for path in paths]
    return pl.DataFrame(
        {"record_id": ids, "tokens": tokens, "blocks": blocks},
        schema={"record_id": pl.String, "tokens": pl.Int64, "blocks": pl.List(pl.UInt64)},
    )


def keys(rows: list[tuple[str, str, int, int]]) -> pl.DataFrame:
    """(record_id, document, p1, tokens) -> records that share their document's blocks."""
    ids, docs, p1, tokens = zip(*rows, strict=True)
    paths = [[f"{doc}{b}" for b in range(end // BLOCK)] for doc, end in zip(docs, p1, strict=True)]
    return prefix_levels(frame(list(ids), list(tokens), paths), BLOCK)


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
    ordered = order_records(keys(INTERLEAVED), block_size=BLOCK)
    # The group whose longest record is longest goes first: c1 (30, shares no block) alone,
    # then A (longest 20), then B (longest 17), then c2; longest first within a group.
    assert ordered["record_id"].to_list() == ["c1", "a2", "a1", "a3", "b2", "b3", "b1", "c2"]
    assert ordered["position"].to_list() == list(range(8))


def test_order_is_deterministic_whatever_the_input_order():
    base = order_records(keys(INTERLEAVED), BLOCK)["record_id"].to_list()
    for seed in range(5):
        shuffled = keys(INTERLEAVED).sample(fraction=1.0, shuffle=True, seed=seed)
        assert order_records(shuffled, BLOCK)["record_id"].to_list() == base


def test_ties_are_broken_by_id():
    rows = [("r3", "D", 9, 10), ("r1", "D", 9, 10), ("r2", "D", 9, 10)]
    assert order_records(keys(rows), BLOCK)["record_id"].to_list() == ["r1", "r2", "r3"]


def test_a_level_that_adds_no_whole_block_is_not_a_group():
    # Same short document for x1 and x3, a different one for x2: all end inside block 0,
    # so the order is by length alone, not by document.
    rows = [("x1", "S", 3, 10), ("x2", "T", 3, 12), ("x3", "S", 3, 8)]
    assert order_records(keys(rows), BLOCK)["record_id"].to_list() == ["x2", "x1", "x3"]


def test_with_nothing_shared_records_run_longest_first():
    ordered = order_records(keys([(r, f"own{r}", 9, t) for r, _, _, t in INTERLEAVED]), BLOCK)
    assert level_count(ordered) == 0
    assert ordered["tokens"].to_list() == sorted(ordered["tokens"].to_list(), reverse=True)


def test_nested_groups_run_inside_their_parent_group():
    # A few-shot block F (two blocks) holds documents d1 and d2 (one block more each);
    # q4 alone has block G: a group of one is no group.
    records = frame(
        ["q1", "q2", "q3", "q4"],
        [20, 21, 22, 23],
        [["F", "F2", "d1"], ["F", "F2", "d2"], ["F", "F2", "d1"], ["G", "G2", "d1"]],
    )
    levelled = prefix_levels(records, BLOCK)
    assert level_count(levelled) == 2
    assert levelled["p1"].to_list() == [8, 8, 8, None]  # F's chain of two blocks: one level
    assert levelled["p2"].to_list() == [12, None, 12, None]  # d2 is q2's alone
    ordered = order_records(levelled, BLOCK)["record_id"].to_list()
    assert ordered == ["q4", "q3", "q1", "q2"]


def test_a_prefix_shared_inside_a_field_groups_like_a_whole_field():
    # Contract forms: all share a long preamble (3 blocks); two pairs share one more
    # block inside their own text; the rest diverge at once. Depth is all that counts.
    paths = [
        ["P0", "P1", "P2", "x"],
        ["P0", "P1", "P2"],
        ["P0", "P1", "P2", "y"],
        ["P0", "P1", "P2", "x"],
        ["P0", "P1", "P2", "y"],
        ["P0", "P1", "P2"],
    ]
    records = frame([f"r{i}" for i in range(6)], [40, 50, 30, 20, 45, 10], paths)
    levelled = prefix_levels(records, BLOCK)
    assert levelled["p0"].to_list() == [12] * 6  # shared by every record: always hot
    ordered = order_records(levelled.clone(), BLOCK)["record_id"].to_list()  # takes its input
    assert ordered == ["r1", "r4", "r2", "r0", "r3", "r5"]  # y (longest 45) before x (40)
    cached = predicted_cached(order_records(levelled, BLOCK), BLOCK, window=1)
    assert cached.to_list() == [0, 12, 16, 12, 16, 8]  # r5: 10 tokens, its last computed


def test_every_group_of_a_random_trie_runs_back_to_back():
    rng = random.Random(7)
    paths = []
    for _ in range(300):
        path, depth = [], rng.randint(0, 6)
        for _ in range(depth):
            path.append(str(rng.randint(0, 2)))  # a branchy trie: many nested groups
        paths.append(path)
    records = frame([f"r{i:03d}" for i in range(300)], [rng.randint(5, 99) for _ in paths], paths)
    ordered = order_records(prefix_levels(records, BLOCK), BLOCK)
    at = {rid: i for i, rid in enumerate(ordered["record_id"])}
    members: dict[tuple[str, ...], list[int]] = {}
    for i, path in enumerate(paths):
        for k in range(1, len(path) + 1):
            members.setdefault(tuple(path[:k]), []).append(at[f"r{i:03d}"])
    for places in members.values():
        assert max(places) - min(places) + 1 == len(places)  # contiguous in the order
    shuffled = records.sample(fraction=1.0, shuffle=True, seed=3)
    again = order_records(prefix_levels(shuffled, BLOCK), BLOCK)
    assert again["record_id"].to_list() == ordered["record_id"].to_list()
    # as a plan holds them: each record's last shared key, each list once
    leafed, leaves = leaves_of(records)
    assert leaves.height < leafed.filter(pl.col("_leaf").is_not_null()).height
    held = prefix_levels(leafed.drop("blocks"), BLOCK, leaves)
    assert_frame_equal(held, prefix_levels(records, BLOCK).drop("blocks"))


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
    ordered = order_records(keys(INTERLEAVED), BLOCK)
    cut = cut_shards(ordered, max_records, max_tokens)
    assert cut["shard"].to_list() == shards


def test_an_empty_plan_has_no_shards():
    ordered = order_records(keys(INTERLEAVED).head(0), BLOCK)
    assert cut_shards(ordered, 10, 100)["shard"].to_list() == []


def test_reuse_prediction_by_hand():
    # In the golden order, with a window of one record:
    #   c1: first record, nothing cached                                   -> 0
    #   a2: only p0 = 2 is hot, less than a block                          -> 0
    #   a1: a2 has A: min(p1 = 9, 14 - 1) = 9 -> whole blocks -> 8
    #   a3: 8;  b2: p0 only -> 0;  b3: min(12, 15) -> 12;  b1: 12;  c2: p0 -> 0
    ordered = order_records(keys(INTERLEAVED), BLOCK)
    cached = predicted_cached(ordered, BLOCK, window=1)
    assert cached.to_list() == [0, 0, 8, 8, 0, 12, 12, 0]
    assert reuse_share(cached, ordered["tokens"]) == pytest.approx(40 / 128)


def test_reuse_prediction_never_counts_a_prompts_last_token():
    # The whole prompt is the shared document: vLLM still computes the last token, so
    # the 8-token prompt reuses one block, not two.
    frame = keys([("d1", "D", 8, 8), ("d2", "D", 8, 8)])
    assert predicted_cached(frame, BLOCK, window=1).to_list() == [0, 4]


def test_input_order_reuse_depends_on_how_many_prompts_the_cache_holds():
    frame = keys(INTERLEAVED)  # A at rows 0, 3, 6; B at rows 1, 4, 7
    assert predicted_cached(frame, BLOCK, window=2).sum() == 0
    assert predicted_cached(frame, BLOCK, window=3).to_list() == [0, 0, 0, 8, 12, 0, 8, 12]


def test_shards_share_nothing_in_the_prediction():
    ordered = cut_shards(order_records(keys(INTERLEAVED), BLOCK), 2, 10**6)
    cached = predicted_cached(ordered, BLOCK, window=1, by="shard")
    # a1 opens shard 1 after a2 closed shard 0, so A's prefix is cold there.
    assert cached.to_list() == [0, 0, 0, 8, 0, 12, 0, 0]


def test_a_short_leading_field_does_not_split_the_groups_below_it():
    # A 1-token tag then a long document: the tag fills no block of its own, so the
    # first block already depends on the document and records group by document.
    records = frame(
        ["d1a", "d2a", "d1b", "d2b"],
        [30, 25, 10, 28],
        [["t/D1", "D1b"], ["t/D2", "D2b"], ["t/D1", "D1b"], ["t/D2", "D2b"]],
    )
    ordered = order_records(records, BLOCK)["record_id"].to_list()
    assert ordered == ["d1a", "d1b", "d2b", "d2a"]


def test_chunk_keys_find_how_far_each_text_shares_its_start():
    from nightshift.scheduling.sharing import chunk_keys, shared_depth

    texts = pl.Series(["a" * 130 + "x", "a" * 130 + "y", "b" * 10, "", "a" * 64, "a" * 129])
    keys = chunk_keys(texts, 64)
    assert keys.list.len().to_list() == [3, 3, 1, 0, 1, 3]
    assert keys[0][:2].to_list() == keys[1][:2].to_list() != keys[2].to_list()
    depth = shared_depth(keys)
    # "a"*64 is the first chunk of four texts; two more share a second chunk of a's.
    assert depth["depth"].to_list() == [2, 2, 0, 0, 1, 2]
    assert depth["node"][0] == depth["node"][1] == depth["node"][5] == keys[0][1]
    assert depth["node"][2] is None and depth["node"][4] == keys[0][0]


def test_block_keys_cover_every_block_before_them():
    from nightshift.scheduling.sharing import block_keys

    one, two = block_keys(list(range(10)), 4), block_keys([*range(8), 99, 98, 97, 96], 4)
    assert len(one) == 2 and one == two[:2] and len(two) == 3
    assert block_keys([5, *range(1, 8)], 4)[1] != one[1]  # a change in block 0 changes block 1


@pytest.mark.parametrize("at_once", [0, 40, 1 << 20])
def test_shared_depth_matches_counting_every_shared_key_by_hand(at_once, monkeypatch):
    """Level by level (only prompts still sharing are looked at), all keys at once, or
    levels first and then the rest at once: each gives what counting, for each prompt,
    the leading keys any other prompt also has gives."""
    from collections import Counter

    from nightshift.scheduling import sharing
    from nightshift.scheduling.sharing import chunk_keys, shared_depth

    monkeypatch.setattr(sharing, "AT_ONCE_KEYS", at_once)

    rng = random.Random(7)
    stems = ["", "s" * 64, "s" * 200 + "t" * 64, "u" * 70]
    texts = [
        rng.choice(stems) + "".join(rng.choices("ab", k=rng.randint(0, 260))) for _ in range(300)
    ]
    texts += ["same start " * 30] * 3  # every key shared: the level's fast path
    keys = chunk_keys(pl.Series(texts), 64)
    seen = Counter(k for row in keys.to_list() for k in row)
    expected = []
    for row in keys.to_list():
        depth = next((d for d, k in enumerate(row) if seen[k] < 2), len(row))
        expected.append((depth, row[depth - 1] if depth else None))
    got = shared_depth(keys)
    assert list(zip(got["depth"].to_list(), got["node"].to_list(), strict=True)) == expected
    assert max(d for d, _ in expected) >= 5 and min(d for d, _ in expected) == 0


def test_a_batch_of_empty_prompts_has_no_chunk_keys_and_shares_nothing():
    """A read batch whose prompts all render empty (a raw template over empty fields)
    was an IndexError that stopped the plan; now each has no key and depth 0."""
    from nightshift.scheduling.sharing import chunk_keys, shared_depth

    for texts in (["", ""], []):
        keys = chunk_keys(pl.Series(texts, dtype=pl.String), 64)
        assert keys.to_list() == [[] for _ in texts] and keys.dtype == pl.List(pl.UInt64)
        assert shared_depth(keys)["depth"].to_list() == [0] * len(texts)
