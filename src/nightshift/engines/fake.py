"""A deterministic, instant stand-in for vLLM, for unit tests.

It honours the engine contract closely enough for the runner not to tell the difference:
answers depend only on the prompt's token ids and sampling (each request's own when it
has one: max_tokens, n, stop, logprobs, seed), except that a sample (temperature above 0,
no seed) is drawn afresh each time, as vLLM's is; guided choices and JSON are respected,
and the prefix cache is simulated at block granularity (``engines.fake_cache``:
unbounded, or least recently used blocks evicted beyond ``cache_blocks``), so
cached-token counts behave like the real engine's. Its answers are made in
``engines.fake_answers``; its fast path, for benchmarks, is ``engines.fake_fast``.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from nightshift.engines.base import (
    Choice,
    EngineInfo,
    EngineRequest,
    EngineResult,
    EngineStats,
    Pooling,
    Sampling,
    as_vector,
)
from nightshift.engines.fake_answers import (  # noqa: F401  (prompt_digest: tests, the log)
    _BITS_64,
    _digest,
    _fast_vector,
    _logprob,
    _scores,
    _text_digest,
    answer_text,
    cut_at_stop,
    prompt_digest,
)
from nightshift.engines.fake_cache import FastBlocks, LruBlocks
from nightshift.engines.fake_fast import FastAnswers, fast_digest, is_plain
from nightshift.engines.fake_faults import InjectedFaults, slow_start
from nightshift.engines.identity import fake_takes_fast_path

# What a GPU's KV cache holds, in blocks of 16 tokens: an H100 at FP8 KV with a model of
# about 1B parameters keeps some 250,000. A job's fake engine keeps as many, so its
# memory stays flat however many records a job has (NIGHTSHIFT_FAKE_CACHE_BLOCKS).
GPU_CACHE_BLOCKS = 1 << 18


def fp8_changes() -> float:
    """The share of answers a fake engine's FP8 KV cache changes (NIGHTSHIFT_FAKE_FP8_CHANGES;
    none by default: the fake's answers follow the prompt and sampling only)."""
    return float(os.environ.get("NIGHTSHIFT_FAKE_FP8_CHANGES", 0))


class FakeEngine:
    """``fail_when(token_ids)`` may return an error string to fail that one record;
    ``die_after`` makes the engine die (EngineFatalError) once, after that many results,
    as a crashed vLLM engine process would. ``abort_every`` returns every n-th request
    it takes aborted (no answer, as vLLM's ``abort``), and ``flaky_every`` fails every
    n-th with a retryable error (as vLLM's ``error`` finish). ``hang_after`` makes it
    hang once, after that many results, as a frozen engine core does: with ``stall_s``
    its stall watch (vLLM's, ``StallWatch``) ends the hang as ``EngineStalledError``
    (the "fresh engine" after it works); ``engines.fake_faults`` makes these faults.
    ``seconds_per_record`` slows it down and ``log`` (a file path) gets one line per
    generated request (its ``prompt_digest``), for the kill tests. ``fast`` makes its
    answers from Python's hash of the prompt's ids (fixed across runs too, but other
    answers than the default path's), so it costs about 10 µs a record
    (``engines.fake_fast``): what a benchmark of nightshift's own cost subtracts must
    be small beside it.

    Results come back out of order (each window of ``window`` requests reversed), as a
    real engine's do, so callers must match them by key.
    """

    @classmethod
    def from_environment(
        cls,
        block_size: int = 16,
        kv_cache_dtype: str = "fp8",
        max_num_seqs: int = 8,
        embedding_size: int = 64,
    ) -> FakeEngine:
        """A fake engine for ``run.engine: fake``, tuned by NIGHTSHIFT_FAKE_* variables
        (the kill tests run jobs in subprocesses and can reach it no other way).
        NIGHTSHIFT_FAKE_FP8_CHANGES: the share of answers an FP8 KV cache changes;
        NIGHTSHIFT_FAKE_FAST=0: the default path for every request (``fast`` is on
        otherwise: a job's fake engine should cost far less than what it stands in for
        and what a benchmark of nightshift measures beside it). Its batch (window) is at
        most 8 and at most ``max_num_seqs``, as vLLM's is capped."""
        env = os.environ
        if env.get("NIGHTSHIFT_FAKE_START_HOLD"):
            slow_start(env["NIGHTSHIFT_FAKE_START_HOLD"])
        return cls(
            block_size=block_size,
            window=min(8, max_num_seqs),
            seconds_per_record=float(env.get("NIGHTSHIFT_FAKE_SECONDS_PER_RECORD", 0)),
            log=env.get("NIGHTSHIFT_FAKE_LOG"),
            abort_every=int(env.get("NIGHTSHIFT_FAKE_ABORT_EVERY", 0)) or None,
            kv_cache_dtype=kv_cache_dtype,
            fp8_changes=fp8_changes(),
            embedding_size=embedding_size,
            fast=fake_takes_fast_path(),
            cache_blocks=int(env.get("NIGHTSHIFT_FAKE_CACHE_BLOCKS", GPU_CACHE_BLOCKS)),
        )

    def __init__(
        self,
        block_size: int = 16,
        fail_when: Callable[[Sequence[int]], str | None] | None = None,
        window: int = 8,
        cache_blocks: int | None = None,
        die_after: int | None = None,
        seconds_per_record: float = 0.0,
        log: str | None = None,
        abort_every: int | None = None,
        flaky_every: int | None = None,
        hang_after: int | None = None,
        stall_s: float | None = None,
        kv_cache_dtype: str = "fp8",
        fp8_changes: float = 0.0,
        embedding_size: int = 64,
        fast: bool = False,
    ) -> None:
        self.info = EngineInfo(
            name="fake",
            kv_cache_dtype=kv_cache_dtype,
            kv_cache_tokens=10**9,
            block_size=block_size,
            prefix_caching=True,
        )
        self.faults = InjectedFaults(
            fail_when, die_after, abort_every, flaky_every, hang_after, stall_s
        )
        self.aborted = self.faults.aborted  # prompt_digest of each request returned aborted
        # the prefix cache (``engines.fake_cache``): one for every request, either path's
        kind = FastBlocks if fast else LruBlocks
        self._blocks: LruBlocks | FastBlocks = kind(block_size, cache_blocks)
        self._cache_blocks = cache_blocks
        # request keys in the order the engine took them (not kept in the fast mode: a
        # million keys are 40 MB a benchmark would count as nightshift's), and how many
        self.order: list[int] = []
        self.taken = 0
        self._delay = seconds_per_record
        self._log = log
        self._stats = EngineStats()
        self._window = window
        self.calls = 0
        self._interrupted = False
        self._rng = random.Random()  # samples without a seed: fresh ones every time
        # an FP8 KV cache's rounding: this share of prompts (fixed ones) answer otherwise
        self._noise = fp8_changes if kv_cache_dtype.startswith("fp8") else 0.0
        self.embedding_size = embedding_size  # a pooling request's vector length
        self._fast = fast  # about 10 µs a record: benchmarks tell nightshift's cost from its
        self._fast_path = FastAnswers(self._blocks, embedding_size, self._noise)

    def run(
        self, requests: Iterable[EngineRequest | None], sampling: Sampling
    ) -> Iterator[EngineResult]:
        self.calls += 1
        self._interrupted = False
        pending, exhausted = iter(requests), False
        while not exhausted and not self._interrupted:
            window, exhausted = self._take_window(pending)
            results = self._answer_window(window, sampling)
            self._stats.engine_steps += 1
            self._stats.peak_running = max(self._stats.peak_running, len(window))
            self._write_log(window, results)
            for result in reversed(results):
                self.faults.maybe_die()
                if self.faults.maybe_hang(lambda: self._interrupted, self._output_tokens):
                    return  # interrupted while hung: the rest are aborted, no answers
                yield result

    def interrupt(self) -> None:
        """Return from ``run`` at the next result (the run is stopping)."""
        self._interrupted = True

    def _take_window(self, pending: Iterator[EngineRequest | None]) -> tuple[list, bool]:
        """Up to ``window`` requests; fewer when the stream has none ready (None) or
        ends (then True)."""
        window: list[EngineRequest] = []
        for request in pending:
            if request is None:
                if window:
                    return window, False
                continue  # nothing held: ask again
            window.append(request)
            if len(window) == self._window:
                return window, False
        return window, True

    def _answer_window(self, window: list[EngineRequest], sampling: Sampling) -> list:
        """The window's results, in order: its plain requests (no adapter, a sampling it
        takes) on the fast path (``engines.fake_fast``) when it is on, the others each on
        the default path. An injected failure (abort, flaky, ``fail_when``) takes a
        request's turn on either path, and leaves every other answer as it was."""
        if not self._fast:
            return [self._one(request, sampling) for request in window]
        results: list[EngineResult] = []
        plain: list[EngineRequest] = []  # in window order, so is the cache: runs of them
        for request in window:
            failed = None
            if request.adapter is None and is_plain(request.sampling or sampling):
                self.taken += 1
                failed = self._injected(request)
                if failed is None:
                    plain.append(request)
                    continue
            results += self._fast_answers(plain, sampling)
            plain = []
            results.append(self._one(request, sampling) if failed is None else failed)
        return results + self._fast_answers(plain, sampling)

    def _fast_answers(self, plain: list[EngineRequest], sampling: Sampling) -> list:
        if not plain:
            return []
        return self._fast_path.answer(plain, sampling, self._stats, self._draw)

    def _draw(self) -> int:
        return self._rng.getrandbits(48)

    def _write_log(self, window: list[EngineRequest], results: list[EngineResult]) -> None:
        if self._delay:
            time.sleep(self._delay * len(results))
        if self._log:
            answered = [q for q, r in zip(window, results, strict=True) if not r.aborted]
            with open(self._log, "a") as log:
                log.writelines(f"{prompt_digest(q.token_ids)}\n" for q in answered)

    def _injected(self, request: EngineRequest) -> EngineResult | None:
        """The failure injected for ``request``, the ``taken``-th; None if none is."""
        faults = self.faults
        return faults.for_request(request, self.taken) if faults.per_request else None

    @property
    def stalls(self) -> int:
        """Hangs its stall watch ended (``hang_after``)."""
        return self.faults.stalls

    def _output_tokens(self) -> int:
        return self._stats.output_tokens

    def _one(self, request: EngineRequest, sampling: Sampling) -> EngineResult:
        self.taken += 1
        if not self._fast:
            self.order.append(request.key)
        failed = self._injected(request)
        if failed is not None:
            return failed
        ids = list(request.token_ids)
        sampling = request.sampling or sampling
        if request.adapter is not None:  # another model: other answers, its own cache blocks
            salt = -(_digest([ord(c) for c in request.adapter]) % 100_000) - 10
            cached = max(0, self._blocks.cached([salt, *ids]) - 1)
            ids = [*ids, salt]
        else:
            cached = self._blocks.cached(ids)
        if sampling.pooling is not None:
            return self._embedding(request.key, ids, cached, sampling.pooling)
        if self._noise and _digest([*ids, -2]) % 10_000 < self._noise * 10_000:
            ids = [*ids, -3]  # the answer of another prompt; the counts stay this one's
        # One draw per request, the choice's index on top: a request's n samples always
        # differ from each other (a draw per choice could repeat one, about 1 run in 700).
        draw = sampling.seed if sampling.seed is not None else self._rng.getrandbits(48)
        digest, joined = self._prompt_digest(ids)
        choices = tuple(self._choice(ids, sampling, draw + i, digest) for i in range(sampling.n))
        out = sum(c.output_tokens for c in choices)
        s = self._stats
        s.prompt_tokens += len(request.token_ids)
        s.prompt_tokens_cached += cached
        s.output_tokens += out
        s.prefix_cache_queries += len(request.token_ids)
        s.prefix_cache_hits += cached
        s.prefill_seconds += len(request.token_ids) * 1e-6
        s.decode_seconds += out * 1e-5
        first = choices[0]
        return EngineResult(
            request.key,
            first.text,
            first.finish_reason,
            len(request.token_ids),
            out,
            cached,
            choices=choices,
            scores=self._scores(digest, joined, sampling.score_tokens),
            reasoning=first.reasoning,  # a reasoning model's thinking (fake_reasoning)
            reasoning_tokens=sum(c.reasoning_tokens for c in choices),
            reasoning_unfinished=first.reasoning_unfinished,
        )

    def _prompt_digest(self, ids: list[int]) -> tuple[int, str]:
        """The prompt's digest, and its ids joined (its scores are made from them). The
        fast path (``fast``) hashes the ids as a tuple instead: other answers, as fixed,
        for about a microsecond where the join costs tens."""
        if self._fast:
            return fast_digest(ids), ""
        joined = ",".join(map(str, ids))
        return _text_digest(joined), joined

    def _scores(self, digest: int, joined: str, tokens: tuple[int, ...]) -> tuple | None:
        if not tokens:
            return None
        if self._fast:
            return tuple(-0.5 - (hash((digest, -1, t)) % 10_000) / 1_000 for t in tokens)
        return _scores(joined, tokens)

    def _embedding(self, key: int, ids: list[int], cached: int, pooling: Pooling) -> EngineResult:
        """A vector made from the prompt alone (the same prompt, the same vector)."""
        size = pooling.dimensions or self.embedding_size
        fast = self._fast  # numpy draws the vector at once: ~40x cheaper than Python's draws
        if fast:  # a view of a read-only table: used as it is
            vector = _fast_vector(self._prompt_digest(ids)[0], size, pooling.normalize)
        else:
            rng = random.Random(_digest(ids))
            vector = [rng.uniform(-1, 1) for _ in range(size)]
            if pooling.normalize:
                norm = math.sqrt(sum(x * x for x in vector)) or 1.0
                vector = [x / norm for x in vector]
        s = self._stats
        s.prompt_tokens += len(ids)
        s.prompt_tokens_cached += cached
        s.prefix_cache_queries += len(ids)
        s.prefix_cache_hits += cached
        s.prefill_seconds += len(ids) * 1e-6
        embedding = as_vector(vector, copy=not fast)
        return EngineResult(key, "", "stop", len(ids), 0, cached, embedding=embedding)

    def _choice(
        self, ids: list[int], sampling: Sampling, draw: int, digest: int | None = None
    ) -> Choice:
        """One answer to a prompt, from the request's ``draw`` (its seed, or a fresh random
        number, plus the choice's index): cut at the first stop string it holds (as vLLM's
        ``stop``), with made-up logprobs when asked. Choices differ only when sampled;
        with a seed a sample repeats, without one it does not. ``digest``: the prompt's
        ``_digest``, when the caller has it."""
        if sampling.reasoning:  # a reasoning model: its thinking first, then this answer
            from nightshift.engines.fake_reasoning import think_then_answer

            return think_then_answer(self._choice, ids, sampling, draw)
        digest = _digest(ids) if digest is None else digest
        seed = digest + (draw if sampling.temperature > 0 else 0)
        text, finish, stop_sequence = cut_at_stop(*answer_text(seed, sampling), sampling)
        words = text.split()
        tokens = max(1, min(sampling.max_tokens, len(words)))
        logprobs = None
        if sampling.logprobs is not None:
            pieces = [w if k == 0 else f" {w}" for k, w in enumerate(words)] or [""]
            logprobs = tuple(_logprob(p, seed + k, sampling.logprobs) for k, p in enumerate(pieces))
        return Choice(text, finish, tokens, stop_sequence, logprobs)

    def stats(self) -> EngineStats:
        return EngineStats(**vars(self._stats))

    def reset_peaks(self) -> None:
        self._stats.peak_running = 0

    def close(self) -> None:
        self._blocks.clear()
        self._fast_path.clear()
