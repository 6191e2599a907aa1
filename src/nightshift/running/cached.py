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
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.cachescope import cache_scope


def _scope(manifest: dict[str, Any], sampling: Sampling) -> dict[str, Any]:
    return cache_scope(manifest.get("fingerprint_inputs", {}), sampling)


class RunCache:
    """Looks each request up before it is sent; stores each new answer."""

    def __init__(self, cache: ResponseCache, location: str) -> None:
        self.cache, self.location = cache, location
        self.answered: set[int] = set()  # request keys answered from the cache

    @classmethod
    def open(cls, spec: JobSpec, manifest: dict[str, Any], sampling: Sampling) -> RunCache | None:
        if not spec.cache.path:
            return None
        scope = _scope(manifest, sampling)
        return cls(ResponseCache.open(spec.cache.path, scope), spec.cache.path)

    def lookup(self, request: EngineRequest) -> EngineResult | None:
        answer = self.cache.get(request.token_ids)
        if answer is None:
            return None
        self.answered.add(request.key)
        return EngineResult(request.key, **answer)

    def from_cache(self, key: int) -> bool:
        return key in self.answered

    def store(self, token_ids, result: EngineResult) -> None:
        """Keep an engine's answer; errors and cached answers are not stored."""
        if result.error or result.key in self.answered:
            return
        self.cache.put(token_ids, {f: getattr(result, f) for f in ANSWER_FIELDS})

    def section(self) -> dict[str, Any]:
        c = self.cache.counts
        return {
            "path": self.location,
            "hits": c.hits,
            "misses": c.misses,
            "stored": c.stored,
            "damaged_ignored": c.damaged,
        }
