"""The fake engine's fast path (a job's fake engine's unless NIGHTSHIFT_FAKE_FAST=0, so it
costs little beside nightshift's own path): fixed answers made cheaply, the same
prefix-cache counts and FP8 changes as the default path, and a default path whose
answers the speed-up left as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest

from nightshift.engines.base import Constraint, EngineRequest, Pooling, Sampling
from nightshift.engines.fake import FakeEngine

PREFIX = list(range(100, 148))  # three blocks of 16 every prompt shares
PROMPTS = [PREFIX + [1000 + i, 2000 + i, 3000 + i * 7] for i in range(12)]
SCORED = Sampling(1, 0.0, score_tokens=(11, 22, 33))


def answers(engine: FakeEngine, sampling: Sampling) -> list:
    requests = [EngineRequest(k, ids) for k, ids in enumerate(PROMPTS)]
    return sorted(engine.run(requests, sampling), key=lambda r: r.key)


def test_a_jobs_fake_engine_takes_the_fast_path_unless_the_environment_says_0(monkeypatch):
    """``run.engine: fake`` (``from_environment``) answers on the fast path, so a user's
    fake run costs little beside nightshift's own path; NIGHTSHIFT_FAKE_FAST=0 gives the
    default path's answers. Either path's answers are fixed per prompt."""
    monkeypatch.delenv("NIGHTSHIFT_FAKE_FAST", raising=False)
    first = answers(FakeEngine.from_environment(), SCORED)
    again = answers(FakeEngine.from_environment(), SCORED)
    slow = answers(FakeEngine(), SCORED)
    assert [r.scores for r in first] == [r.scores for r in again]
    assert [r.scores for r in first] != [r.scores for r in slow]  # its own answers
    assert all(len(r.scores) == 3 and all(-10.5 <= s <= -0.5 for s in r.scores) for r in first)
    # the prefix cache is simulated alike: the shared blocks come from cache after the first
    assert [r.cached_tokens for r in first] == [r.cached_tokens for r in slow]
    assert [r.cached_tokens for r in first] == [0] + [48] * 11
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FAST", "1")
    assert [r.scores for r in answers(FakeEngine.from_environment(), SCORED)] == [
        r.scores for r in first
    ]
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FAST", "0")
    assert [r.scores for r in answers(FakeEngine.from_environment(), SCORED)] == [
        r.scores for r in slow
    ]


@pytest.mark.parametrize("fast", [True, False])
def test_an_fp8_cache_changes_the_same_fixed_share_of_answers_on_either_path(fast):
    """NIGHTSHIFT_FAKE_FP8_CHANGES' share of prompts answer otherwise under an FP8 KV cache,
    on the fast path as on the default one: a canary's FP8 engine and its reference
    (``auto``) then agree on the rest, whichever path answers them."""
    sampling = Sampling(1, 0.0, constraint=Constraint(choice=tuple(f"c{i}" for i in range(50))))
    prompts = [[5, 6, 7, i, i * 3, i * 7 + 1] for i in range(2000)]

    def texts(dtype: str, share: float) -> list[str]:
        engine = FakeEngine(fast=fast, kv_cache_dtype=dtype, fp8_changes=share)
        requests = [EngineRequest(k, ids) for k, ids in enumerate(prompts)]
        return [r.text for r in sorted(engine.run(requests, sampling), key=lambda r: r.key)]

    reference = texts("auto", 0.3)
    assert reference == texts("fp8", 0.0) == texts("auto", 0.0)  # no share: no change
    changed = [a != b for a, b in zip(reference, texts("fp8", 0.3), strict=True)]
    assert 0.25 < sum(changed) / len(prompts) < 0.32  # 0.3, less those a change left as they were
    assert changed == [a != b for a, b in zip(reference, texts("fp8", 0.3), strict=True)]


def test_the_default_path_answers_as_before_the_speed_up():
    """Scores, text and seed come from the blake2b digest of the ids joined by commas,
    as they always did (outputs written before stay reproducible)."""
    import hashlib

    def digest(ids):
        raw = ",".join(map(str, ids)).encode()
        return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big")

    result = answers(FakeEngine(), SCORED)[3]
    ids = PROMPTS[3]
    assert result.scores == tuple(
        -0.5 - (digest([*ids, -1, t]) % 10_000) / 1_000 for t in (11, 22, 33)
    )
    plain = answers(FakeEngine(), Sampling(4, 0.0))[3]
    seed = digest(ids)
    assert plain.text == " ".join(f"w{(seed >> (i % 48)) % 1000}" for i in range(4))


def test_fast_embeddings_are_fixed_per_prompt_and_normalized():
    engine = FakeEngine(fast=True, embedding_size=32)
    vectors = [r.embedding for r in answers(engine, Sampling(1, pooling=Pooling(True)))]
    again = [r.embedding for r in answers(FakeEngine(fast=True, embedding_size=32),
                                          Sampling(1, pooling=Pooling(True)))]  # fmt: skip
    # float32 arrays, never Python floats (the run path's cost: engines.base.as_vector)
    assert all(v.dtype == np.float32 and not v.flags.writeable for v in vectors)
    assert [v.tolist() for v in vectors] == [v.tolist() for v in again]
    assert len({v.tobytes() for v in vectors}) == len(PROMPTS)
    assert all(len(v) == 32 and math.isclose(float(v @ v), 1.0, rel_tol=1e-6) for v in vectors)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_a_jobs_fake_engine_keeps_a_gpus_worth_of_blocks_not_every_one(monkeypatch, fast):
    """Like a GPU's KV cache, the prefix cache a job's fake engine simulates is bounded,
    so its memory stays flat however many records a job sends; recent blocks still hit
    (on either path: the fast one's cache forgets sooner, never later)."""
    from nightshift.engines.fake import GPU_CACHE_BLOCKS

    monkeypatch.setenv("NIGHTSHIFT_FAKE_FAST", fast)
    assert FakeEngine.from_environment()._cache_blocks == GPU_CACHE_BLOCKS
    monkeypatch.setenv("NIGHTSHIFT_FAKE_CACHE_BLOCKS", "5")
    engine = FakeEngine.from_environment()
    distinct = [[7000 + i] * 16 + [8000 + i] * 16 + [1] for i in range(40)]
    requests = [EngineRequest(k, ids) for k, ids in enumerate(distinct)]
    assert all(r.cached_tokens == 0 for r in engine.run(requests, Sampling(1, 0.0)))
    assert 0 < len(engine._blocks) <= 5
    [last] = engine.run([EngineRequest(0, distinct[-1])], Sampling(1, 0.0))
    [first] = engine.run([EngineRequest(0, distinct[0])], Sampling(1, 0.0))
    assert (last.cached_tokens, first.cached_tokens) == (32, 0)  # the first was evicted


def test_the_fast_path_keeps_nothing_per_request_and_the_default_records_the_order():
    """A million request keys in ``order`` were 40 MB of the run's memory a benchmark
    counted as nightshift's: the fast path only counts them."""
    fast, default = FakeEngine(fast=True), FakeEngine()
    answers(fast, SCORED)
    answers(default, SCORED)
    assert fast.order == [] and fast.taken == len(PROMPTS)
    assert default.order == list(range(len(PROMPTS))) and default.taken == len(PROMPTS)


def cached(engine: FakeEngine, prompts: list[list[int]], sampling=SCORED) -> list[int]:
    """Each prompt's cached tokens, sent one window after another in order."""
    return [next(iter(engine.run([EngineRequest(k, ids)], sampling))).cached_tokens
            for k, ids in enumerate(prompts)]  # fmt: skip


def test_fast_cache_hits_are_whole_leading_blocks_of_the_same_prefix():
    """A block counts only after every block before it hit: the same block after another
    prefix is a miss, and the last token never comes from cache (as vLLM's)."""
    a, b, c = [1] * 16, [2] * 16, [3] * 16
    engine = FakeEngine(fast=True)
    assert cached(engine, [a + b + [9], c + b + [9], a + c + [9], a + b + [8], a + b]) == [
        0,
        0,
        16,
        32,
        16,  # fmt: skip
    ]
    assert cached(engine, [a + b + [9]], Sampling(1, pooling=Pooling(True))) == [32]


def test_the_fast_cache_stays_bounded_and_keeps_what_was_touched_lately():
    engine = FakeEngine(fast=True, cache_blocks=40)
    prompts = [[7000 + i] * 16 + [1] for i in range(200)]
    assert cached(engine, prompts) == [0] * 200
    assert len(engine._blocks) <= 40  # both sets of the fast cache
    assert cached(engine, [prompts[-1], prompts[-15], prompts[0]]) == [16, 16, 0]


def test_the_fast_path_samples_afresh_keeps_stop_strings_and_choices():

    def texts(sampling, engine=None):
        return [r.text for r in answers(engine or FakeEngine(fast=True), sampling)]

    greedy = Sampling(6, 0.0)
    assert texts(greedy) == texts(greedy)
    sampled = Sampling(6, 0.8)
    assert texts(sampled) != texts(sampled)  # no seed: drawn afresh, as vLLM's
    assert texts(Sampling(6, 0.8, seed=3)) == texts(Sampling(6, 0.8, seed=3))
    words = {w for t in texts(greedy) for w in t.split()}
    stop = sorted(words)[0]
    cut = texts(Sampling(6, 0.0, stop=(stop,)))
    assert all(stop not in t for t in cut) and any(len(t) < 6 * 4 for t in cut)
    labels = ("yes", "no", "maybe")
    assert set(texts(Sampling(1, constraint=Constraint(choice=labels)))) <= set(labels)


def test_requests_the_fast_path_does_not_take_are_answered_on_the_default_one():
    """Two answers, logprobs or an adapter: the default path's work, with the fast
    digest and the fast path's cache; the window's other requests stay on the fast one."""
    engine = FakeEngine(fast=True)
    two = answers(engine, Sampling(3, 0.7, n=2))
    assert all(len(r.choices) == 2 and r.choices[0].text != r.choices[1].text for r in two)
    own = Sampling(2, 0.0, logprobs=1)
    mixed = [EngineRequest(0, PROMPTS[0]), EngineRequest(1, PROMPTS[1], own),
             EngineRequest(2, PROMPTS[2], adapter="sql")]  # fmt: skip
    results = sorted(engine.run(mixed, SCORED), key=lambda r: r.key)
    assert results[0].scores is not None and results[1].choices[0].logprobs is not None
    assert results[2].text and engine.taken == len(PROMPTS) + 3


def test_a_plain_requests_answer_and_cache_count_do_not_depend_on_its_window():
    """A window holding a request with its own sampling, or an adapter, answers its plain
    requests as a window of plain ones would, from the same cache."""
    own = Sampling(2, 0.0, logprobs=1)

    def run(neighbours: bool) -> list:
        engine = FakeEngine(fast=True)
        results = []
        for k, ids in enumerate(PROMPTS):
            window = [EngineRequest(k, ids)]
            if neighbours and k % 3:
                window.append(
                    EngineRequest(100 + k, ids[:40] + [7, k], own, "sql" if k % 2 else None)
                )
            results += [r for r in engine.run(window, Sampling(5, 0.0)) if r.key < 100]
        return sorted((r.key, r.text, r.cached_tokens) for r in results)

    assert run(neighbours=True) == run(neighbours=False)


def test_fast_answers_hold_for_any_prompt_block_size_and_cache():
    """An empty prompt is answered; the block size changes cache counts, never answers;
    a cache of no blocks serves nothing; a stop string is named as the default path's is."""
    sampling = Sampling(8, 0.0)
    small, large = FakeEngine(fast=True, block_size=16), FakeEngine(fast=True, block_size=32)
    assert [r.text for r in answers(small, sampling)] == [r.text for r in answers(large, sampling)]
    [empty] = FakeEngine(fast=True).run([EngineRequest(0, [])], sampling)
    assert empty.text and empty.prompt_tokens == 0 and empty.cached_tokens == 0
    none = FakeEngine(fast=True, cache_blocks=0)
    assert cached(none, [PROMPTS[0]] * 3) == [0, 0, 0]
    text = answers(FakeEngine(fast=True), sampling)[0].text
    stop = text.split()[3]
    result = answers(FakeEngine(fast=True), Sampling(8, 0.0, stop=(stop,)))[0]
    assert result.finish_reason == "stop" and result.all_choices()[0].stop_sequence == stop


def test_fast_answers_are_as_varied_as_the_default_paths():
    """Each word of a long answer varies from prompt to prompt (a table of answers must
    not make the benchmark's output shorter or more alike than a real engine's)."""
    prompts = [[5, i, i * 7 % 1000] for i in range(3000)]
    engine = FakeEngine(fast=True)
    texts = [r.text for r in engine.run([EngineRequest(k, p) for k, p in enumerate(prompts)],
                                        Sampling(32, 0.0))]  # fmt: skip
    assert len(set(texts)) > 2900 and all(len(t.split()) == 32 for t in texts)
    assert min(len({t.split()[i] for t in texts}) for i in range(32)) > 500


def test_a_record_with_its_own_plain_sampling_takes_the_fast_path_too():
    """A batch's lines each carry their own sampling (one object for equal ones): answered
    as the run's own sampling would be, vectors too."""
    own, run = Sampling(6, 0.0), Sampling(2, 0.0)
    engine = FakeEngine(fast=True)
    mine = sorted(engine.run([EngineRequest(k, p, own) for k, p in enumerate(PROMPTS)], run),
                  key=lambda r: r.key)  # fmt: skip
    assert [r.text for r in mine] == [r.text for r in answers(FakeEngine(fast=True), own)]
    pooled = Sampling(1, pooling=Pooling(True))
    vectors = engine.run([EngineRequest(0, PROMPTS[0], pooled)], run)
    assert next(iter(vectors)).embedding.tolist() == answers(engine, pooled)[0].embedding.tolist()


def test_records_each_with_their_own_sampling_keep_the_fast_paths_memory_bounded():
    """A sampling a record has alone adds its rows; past the bound the least recently
    used samplings' rows go, never the run's own while it is in use."""
    from nightshift.engines import fake_fast

    engine = FakeEngine(fast=True)
    run = Sampling(3, 0.0)
    for k in range(3 * fake_fast._KEPT):
        own = Sampling(3, 0.7, seed=k) if k % 2 else None  # a distinct object each
        [result] = engine.run([EngineRequest(k, [5, k, k + 1], own)], run)
        assert result.text
    path = engine._fast_path
    assert path._rows_kept <= fake_fast._KEPT
    assert path._rows_kept == sum(len(a) + len(s or ()) for _, a, s in path._made.values())
    assert id(run) in path._made  # the run's own, used every other record, kept
    engine.close()
    assert not path._made and path._rows_kept == 0


def test_a_windows_cache_counts_follow_its_order_whichever_path_answers():
    """Per record, as the default path counts them (each request after those before it)."""
    a, b = [1] * 16, [2] * 16
    two, one = Sampling(4, 0.7, n=2, seed=1), Sampling(4, 0.0)
    window = [EngineRequest(0, a + b + [9], two), EngineRequest(1, a + b + [9], one),
              EngineRequest(2, a + b + [8], two)]  # fmt: skip
    counts = {}
    for engine in (FakeEngine(), FakeEngine(fast=True)):
        results = engine.run(window, Sampling(4, 0.0))
        counts[engine._fast] = sorted((r.key, r.cached_tokens) for r in results)
    assert counts[True] == counts[False] == [(0, 0), (1, 32), (2, 32)]


@pytest.mark.parametrize("fast", [True, False])
def test_an_injected_failure_takes_its_turn_and_leaves_every_other_answer(fast):
    """Aborts, flaky errors and ``fail_when`` land on the n-th request taken on either
    path, and every other request keeps the answer it gets with nothing injected (a run
    killed under injected faults and resumed without them agrees with a clean one)."""
    requests = [EngineRequest(k, ids) for k, ids in enumerate(PROMPTS)]
    clean = {r.key: (r.text, r.scores) for r in FakeEngine(fast=fast).run(requests, SCORED)}
    unlucky = PROMPTS[7]
    engine = FakeEngine(
        fast=fast,
        abort_every=5,
        flaky_every=11,
        fail_when=lambda ids: "boom" if ids == unlucky else None,
    )
    hurt = {r.key: r for r in engine.run(requests, SCORED)}
    assert {k for k, r in hurt.items() if r.aborted} == {4, 9}  # the 5th and 10th taken
    assert {k for k, r in hurt.items() if r.retryable} == {10}
    assert hurt[7].error == "boom"
    kept = {k: (r.text, r.scores) for k, r in hurt.items() if k not in (4, 7, 9, 10)}
    assert kept == {k: v for k, v in clean.items() if k in kept} and len(kept) == 8
    assert engine.taken == len(PROMPTS)
