"""The fake engine's fast path (``FakeEngine(fast=True)``; a job's fake engine takes it
unless NIGHTSHIFT_FAKE_FAST=0): plain requests answered a window at a time, at 7-14 µs a
record (the default path: 38 µs on classify requests; 10-24 before: its block hashing
alone took a third of that), so a benchmark of nightshift's own cost subtracts little
beside what it measures.

A plain request is one with no adapter whose sampling (its own, else the run's) asks for
one answer without logprobs or thinking; the engine answers every other request (and
every request when it injects failures) on its default path. Per request here:

- the prefix cache (``engines.fake_cache.FastBlocks``: its keys made in C-level calls);
- its digest (``hash`` of its ids, as the default path's fast digest), from which its
  answer, its label scores and its vector come: 65,536 answers and 4,096 score rows a
  sampling, each made once when first needed, so answers stay fixed per prompt and
  process, whatever the block size (other answers than the default path's);
- an FP8 KV cache's rounding (``fp8_changes``): as on the default path, that share of
  prompts (fixed by the digest) answer as another prompt would, so a canary comparing
  an FP8 engine with its reference sees the same share change on either path.

Requests the fast path does not take (an adapter, two answers, logprobs) are answered by
the engine's default path, with this cache, so neither their answers nor any cache
count depend on which requests share their window.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from nightshift.engines.base import Choice, EngineRequest, EngineResult, EngineStats, Sampling
from nightshift.engines.fake_answers import _BITS_64, _fast_vector, answer_text, cut_at_stop
from nightshift.engines.fake_cache import FastBlocks

_ANSWERS = 1 << 16  # answers a sampling keeps: as varied as a run's output, made once each
_SCORES = 4096  # label-score rows a sampling keeps (made-up numbers: plenty)
_KEPT = 2 * _ANSWERS  # rows kept in all samplings' tables (a bound on the fake's memory)
_SEED_BITS = (1 << 48) - 1  # what the engine's answers draw their words from


def is_plain(sampling: Sampling) -> bool:
    """Whether the fast path answers requests under ``sampling``."""
    return sampling.n == 1 and sampling.logprobs is None and not sampling.reasoning


def fast_digest(ids: Sequence[int]) -> int:
    """A prompt's digest on the fast path: Python's hash of its ids (fixed across runs)."""
    return hash(tuple(ids)) & _BITS_64


class FastAnswers:
    """The fast path's answers so far, by sampling."""

    def __init__(self, blocks: FastBlocks, embedding_size: int, fp8_changes: float = 0.0) -> None:
        self._blocks = blocks  # the engine's prefix cache, every request's
        self._embedding_size = embedding_size
        self._changed = int(fp8_changes * 10_000)  # of every 10,000 prompts
        self._made: OrderedDict[int, tuple[Sampling, dict, dict | None]] = OrderedDict()
        self._rows_kept = 0  # answers and score rows in ``_made``, all samplings

    def clear(self) -> None:
        self._made.clear()
        self._rows_kept = 0

    def answer(
        self, window: Sequence[EngineRequest], sampling: Sampling, stats: EngineStats, draw
    ) -> list[EngineResult]:
        """Each request's result, in order, under its own sampling or else ``sampling``
        (each one ``is_plain``); counts go to ``stats``. ``draw()``: a fresh random
        number, for a sample without a seed (drawn afresh each time)."""
        results, prompt, cached_all, out = [], 0, 0, 0
        for request in window:
            own = request.sampling or sampling
            ids = request.token_ids
            cached, digest = self._blocks.cached(ids), fast_digest(ids)
            prompt, cached_all = prompt + len(ids), cached_all + cached
            result = EngineResult(request.key, "", "stop", len(ids), 0, cached)
            if own.pooling is None:
                if self._changed and hash((digest, -2)) % 10_000 < self._changed:
                    digest = hash((digest, -3)) & _BITS_64  # another prompt's answer
                self._generated(result, digest, own, draw)
                out += result.output_tokens
            else:  # a vector fixed by the prompt's digest (``fake_answers``), read-only
                size = own.pooling.dimensions or self._embedding_size
                result.embedding = _fast_vector(digest, size, own.pooling.normalize)
            results.append(result)
        _count(stats, prompt, cached_all, out)
        return results

    def _generated(self, result: EngineResult, digest: int, sampling: Sampling, draw) -> None:
        """``result``'s answer under ``sampling``: its row's, made once."""
        answers, scores = self._rows(sampling)
        row = digest % _ANSWERS
        if sampling.temperature > 0:  # as the default path: the digest plus the draw
            row = (digest + (draw() if sampling.seed is None else sampling.seed)) % _ANSWERS
        made = answers.get(row) or self._make(row, sampling, answers)
        result.text, result.finish_reason, result.output_tokens, stop = made
        if scores is not None:
            at = digest % _SCORES
            result.scores = scores.get(at) or self._score(at, sampling, scores)
        if stop is not None:  # which stop string ended it: a choice says so
            result.choices = (Choice(*made),)

    def _rows(self, sampling: Sampling) -> tuple[dict, dict | None]:
        """The answers and score rows made so far under ``sampling``. Every sampling's
        are kept, the least recently used given up first past ``_KEPT`` rows in all: a
        run's own, a batch's few, a record's own one each (never a hot one given up)."""
        key = id(sampling)
        made = self._made.get(key)
        if made is None or made[0] is not sampling:
            made = (sampling, {}, {} if sampling.score_tokens else None)
            self._made[key] = made  # the sampling held: its id stays its own
        else:
            self._made.move_to_end(key)
        return made[1], made[2]

    def _kept(self) -> None:
        """One row more is kept: past ``_KEPT``, the least recently used samplings' rows
        are given up (never the one in use: it was used last)."""
        self._rows_kept += 1
        while self._rows_kept > _KEPT and len(self._made) > 1:
            _, answers, scores = self._made.popitem(last=False)[1]
            self._rows_kept -= len(answers) + len(scores or ())

    def _make(self, row: int, sampling: Sampling, answers: dict) -> tuple:
        """Row ``row``'s answer, cut at the first stop string it holds (as vLLM's stop),
        and that string."""
        text, finish, stop = cut_at_stop(
            *answer_text(hash((row, -5)) & _SEED_BITS, sampling), sampling
        )
        tokens = max(1, min(sampling.max_tokens, len(text.split())))
        answers[row] = answer = (text, finish, tokens, stop)
        self._kept()
        return answer

    def _score(self, row: int, sampling: Sampling, scores: dict) -> tuple[float, ...]:
        """Made-up log probabilities of the sampling's score tokens, -10.5 to -0.5."""
        tokens = sampling.score_tokens
        scores[row] = made = tuple(-0.5 - (hash((row, -1, t)) % 10_000) / 1_000 for t in tokens)
        self._kept()
        return made


def _count(stats: EngineStats, prompt: int, cached: int, out: int) -> None:
    stats.prompt_tokens += prompt
    stats.prompt_tokens_cached += cached
    stats.output_tokens += out
    stats.prefix_cache_queries += prompt
    stats.prefix_cache_hits += cached
    stats.prefill_seconds += prompt * 1e-6
    stats.decode_seconds += out * 1e-5
