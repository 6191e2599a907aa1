"""The fake engine's fast path (``FakeEngine(fast=True)``, NIGHTSHIFT_FAKE_FAST=1): plain
requests answered at a few microseconds a record, so a benchmark of nightshift's own cost
subtracts little beside what it measures.

A plain request is one under the run's own sampling, with no adapter, whose sampling
asks for one answer without logprobs or thinking; the engine answers every other request
(and every request when it injects failures) on its default path. Per request here:

- the prefix cache: the chained keys of its whole leading blocks (never the last token),
  made in C (``zip`` cuts the blocks, ``hash`` each, a running sum of them times fixed
  odd weights chains each key to every block before it), looked up in two sets: the
  blocks touched lately, and those touched in the span before (once the first holds half
  of ``cache_blocks``, it becomes the second). A bounded cache whose hits are those of a
  least-recently-used one, give or take that half;
- its digest (its last block's key and the tokens after it), from which its answer, its
  label scores and its vector come: 4,096 answers and score rows a sampling, each made
  once, so answers stay fixed per prompt, as the default path's do (other answers).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from itertools import accumulate, islice, takewhile
from operator import add, mul

from nightshift.engines.base import EngineRequest, EngineResult, EngineStats, Sampling
from nightshift.engines.fake_answers import _BITS_64, _fast_vector

_ROWS = 4096  # answers and score rows a sampling keeps: distinct enough, made once each
_WEIGHTS: list[int] = []  # the blocks' weights, odd, the same in every engine and process
_DRAW_WEIGHT = random.Random(16).getrandbits
_GROWING = threading.Lock()  # engines in two threads draw the weights in one order


def is_plain(sampling: Sampling) -> bool:
    """Whether the fast path answers requests under ``sampling``."""
    return sampling.n == 1 and sampling.logprobs is None and not sampling.reasoning


class FastAnswers:
    """The fast path's state: the prefix cache's two sets, and the run's answers so far.
    ``answer(seed, sampling)`` is the engine's own (text, finish) for a seed."""

    def __init__(
        self, block_size: int, cache_blocks: int | None, embedding_size: int, answer
    ) -> None:
        self._size = block_size
        self._embedding_size = embedding_size
        self._recent: set[int] = set()
        self._before: set[int] = set()
        self._half = max(1, cache_blocks // 2) if cache_blocks else None
        self._answer = answer
        self._made: tuple[Sampling, list, list] | None = None  # the sampling's rows

    def clear(self) -> None:
        self._recent.clear()
        self._before.clear()

    def answer(
        self, window: Sequence[EngineRequest], sampling: Sampling, stats: EngineStats, draw
    ) -> list[EngineResult]:
        """Each plain request's result, in order; counts go to ``stats``. ``draw()``: a
        fresh random number, for a sample without a seed (drawn afresh each time)."""
        if sampling.pooling is not None:
            return self._embed(window, sampling, stats)
        answers, scores = self._rows(sampling)
        sampled = sampling.temperature > 0
        results, prompt, cached_all, out = [], 0, 0, 0
        for request in window:
            ids = request.token_ids
            cached, digest = self._cached(ids)
            prompt, cached_all = prompt + len(ids), cached_all + cached
            row = digest % _ROWS
            score = scores[row] if scores else None
            if sampled:  # as the default path: the prompt's digest plus the draw
                row = (digest + (draw() if sampling.seed is None else sampling.seed)) % _ROWS
            text, finish, tokens = answers[row] or self._make(row, sampling)
            out += tokens
            result = EngineResult(request.key, text, finish, len(ids), tokens, cached)
            result.scores = score
            results.append(result)
        _count(stats, prompt, cached_all, out)
        return results

    def _embed(self, window, sampling: Sampling, stats: EngineStats) -> list[EngineResult]:
        """Each request's vector: fixed by its prompt's digest (``fake_answers``)."""
        size = sampling.pooling.dimensions or self._embedding_size
        normalize = sampling.pooling.normalize
        results, prompt, cached_all = [], 0, 0
        for request in window:
            ids = request.token_ids
            cached, digest = self._cached(ids)
            prompt, cached_all = prompt + len(ids), cached_all + cached
            result = EngineResult(request.key, "", "stop", len(ids), 0, cached)
            result.embedding = _fast_vector(digest, size, normalize)  # read-only float32
            results.append(result)
        _count(stats, prompt, cached_all, 0)
        return results

    def _cached(self, ids: Sequence[int]) -> tuple[int, int]:
        """Tokens served from cache (whole leading blocks touched before), and the
        prompt's digest."""
        size = self._size
        full = (len(ids) - 1) // size
        if len(_WEIGHTS) < full:
            with _GROWING:
                _WEIGHTS.extend(_DRAW_WEIGHT(64) | 1 for _ in range(full - len(_WEIGHTS)))
        blocks = islice(zip(*[iter(ids)] * size, strict=False), full)
        keys = list(accumulate(map(mul, map(hash, blocks), _WEIGHTS), add))
        recent, before = self._recent, self._before
        hits = len(list(takewhile(recent.__contains__, keys)))
        if before:
            for key in islice(keys, hits, None):
                if key not in recent and key not in before:
                    break
                hits += 1
        recent.update(keys)
        if self._half is not None and len(recent) >= self._half:
            self._before, self._recent = recent, set()
        digest = hash((keys[-1] if keys else 0, *ids[full * size :])) & _BITS_64
        return hits * size, digest

    def _rows(self, sampling: Sampling) -> tuple[list, list | None]:
        """The answers and score rows of ``sampling``, made as rows are first asked for."""
        made = self._made
        if made is None or made[0] is not sampling:
            tokens = sampling.score_tokens
            scores = [_score_row(row, tokens) for row in range(_ROWS)] if tokens else None
            self._made = made = (sampling, [None] * _ROWS, scores)
        return made[1], made[2]

    def _make(self, row: int, sampling: Sampling) -> tuple[str, str, int]:
        """Row ``row``'s answer, cut at the first stop string it holds (as vLLM's stop)."""
        text, finish = self._answer(row, sampling)
        found = [(text.find(stop), stop) for stop in sampling.stop if stop in text]
        if found:
            text, finish = text[: min(found)[0]], "stop"
        tokens = max(1, min(sampling.max_tokens, len(text.split())))
        self._made[1][row] = answer = (text, finish, tokens)
        return answer


def _score_row(row: int, tokens: tuple[int, ...]) -> tuple[float, ...]:
    """Made-up log probabilities of ``tokens``, between -10.5 and -0.5."""
    return tuple(-0.5 - (hash((row, -1, t)) % 10_000) / 1_000 for t in tokens)


def _count(stats: EngineStats, prompt: int, cached: int, out: int) -> None:
    stats.prompt_tokens += prompt
    stats.prompt_tokens_cached += cached
    stats.output_tokens += out
    stats.prefix_cache_queries += prompt
    stats.prefix_cache_hits += cached
    stats.prefill_seconds += prompt * 1e-6
    stats.decode_seconds += out * 1e-5
