"""The run's side of the response cache (``io.responsecache``): its scope, lookups, stores.

The scope is what decides an answer besides the prompt's token ids, taken from the plan's
fingerprint inputs (the model and tokenizer identity by content, dtype, max_model_len,
KV-cache dtype, engine extras) and the sampling the engine is given, guided-decoding
constraint included. The prompt template and task are not in it: the token ids are the
rendered prompt, and rows are parsed from the cached text by this job's task.
"""

from __future__ import annotations

from typing import Any

from nightshift.engines.base import EngineRequest, EngineResult, Sampling
from nightshift.io.responsecache import ANSWER_FIELDS, ResponseCache
from nightshift.jobs.sampling import deterministic, sampling_key
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.cachescope import cache_scope


def _scope(manifest: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
    return cache_scope(manifest.get("fingerprint_inputs", {}), sampling)


class RunCache:
    """Looks each request up before it is sent; stores each new answer.

    A request with its own sampling (``input.sampling_column``) is looked up in the scope
    of that sampling, so the same prompt under other settings is another answer; and
    only when that sampling is deterministic, with one choice and no logprobs (a cached
    answer holds one text, and a sample is not worth repeating)."""

    def __init__(
        self, cache: ResponseCache, location: str, manifest: dict[str, Any] | None = None
    ) -> None:
        self.cache, self.location = cache, location
        self.answered: set[int] = set()  # request keys answered from the cache
        self._inputs = (manifest or {}).get("fingerprint_inputs", {})
        self._scoped: dict[str, ResponseCache] = {}  # per-record samplings' caches

    @classmethod
    def open(cls, spec: JobSpec, manifest: dict[str, Any], sampling: Sampling) -> RunCache | None:
        if not spec.cache.path:
            return None
        scope = _scope(manifest, sampling)
        return cls(ResponseCache.open(spec.cache.path, scope), spec.cache.path, manifest)

    def _for(self, sampling: Sampling | None) -> ResponseCache | None:
        """The cache for a request's own sampling (None: the job's); None: not cached."""
        if sampling is None:
            return self.cache
        if not deterministic(sampling) or sampling.n != 1 or sampling.logprobs is not None:
            return None
        key = sampling_key(sampling)
        cache = self._scoped.get(key)
        if cache is None:
            scope = cache_scope(self._inputs, sampling)
            cache = ResponseCache(self.cache.store, scope)
            cache.counts = self.cache.counts  # one tally for the run
            self._scoped[key] = cache
        return cache

    def lookup(self, request: EngineRequest) -> EngineResult | None:
        cache = self._for(request.sampling)
        answer = cache.get(request.token_ids) if cache is not None else None
        if answer is None:
            return None
        self.answered.add(request.key)
        return EngineResult(request.key, **answer)

    def from_cache(self, key: int) -> bool:
        return key in self.answered

    def store(self, token_ids, result: EngineResult, sampling: Sampling | None = None) -> None:
        """Keep an engine's answer; errors and cached answers are not stored."""
        cache = self._for(sampling)
        if result.error or result.key in self.answered or cache is None:
            return
        cache.put(token_ids, {f: getattr(result, f) for f in ANSWER_FIELDS})

    def section(self) -> dict[str, Any]:
        c = self.cache.counts
        return {
            "path": self.location,
            "hits": c.hits,
            "misses": c.misses,
            "stored": c.stored,
            "damaged_ignored": c.damaged,
        }
