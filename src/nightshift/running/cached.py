"""The run's side of the response cache (``io.responsecache``): its scope, lookups, stores.

The scope is what decides an answer besides the prompt's token ids, taken from the plan's
fingerprint inputs (the model and tokenizer identity by content, dtype, max_model_len,
KV-cache dtype, engine extras) and the sampling the engine is given, guided-decoding
constraint included. The prompt template and task are not in it: the token ids are the
rendered prompt, and rows are parsed from the cached text by this job's task.

Only a repeatable answer is cached (``cacheable``): a sample stays a sample, whether its
sampling is the job's or a record's own. An entry keeps the whole result (every choice,
its stop sequence and logprobs), so a row, a detail column or a batch line made from a
cached answer equals the one made from the generated answer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from nightshift.engines.base import (
    Choice,
    EngineRequest,
    EngineResult,
    Sampling,
    TokenLogprob,
    as_vector,
)
from nightshift.io.planstore import PlanStore
from nightshift.io.responsecache import ResponseCache
from nightshift.jobs.sampling import sampling_key
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.cachescope import cache_scope, cacheable


class RunCache:
    """Looks each request up before it is sent; stores each new answer.

    A request with its own sampling (``input.sampling_column``) is looked up in the scope
    of that sampling, so the same prompt under other settings is another answer. Each
    request, under the job's sampling or its own, is cached only when ``cacheable``."""

    def __init__(
        self,
        cache: ResponseCache,
        location: str,
        sampling: Sampling,
        manifest: dict[str, Any] | None = None,
    ) -> None:
        self.cache, self.location = cache, location
        self.answered: set[int] = set()  # request keys answered from the cache
        self._job_cacheable = cacheable(sampling)  # requests without their own sampling
        self._sampling = sampling
        self._inputs = (manifest or {}).get("fingerprint_inputs", {})
        # per-record samplings' and adapters' caches, by (sampling key, adapter)
        self._scoped: dict[tuple[str, str | None], ResponseCache] = {}

    @classmethod
    def open(cls, spec: JobSpec, manifest: dict[str, Any], sampling: Sampling) -> RunCache | None:
        """The run's side of ``cache.path``; None when the spec names none."""
        return cls.at(spec.cache.path, manifest, sampling) if spec.cache.path else None

    @classmethod
    def at(cls, location: str, manifest: dict[str, Any], sampling: Sampling) -> RunCache:
        """A response cache at ``location`` in this run's scope (the canary keeps the
        job's answers to its sample in one, ``pipelines.canary``)."""
        scope = cache_scope(manifest.get("fingerprint_inputs", {}), sampling)
        return cls(ResponseCache.open(location, scope), location, sampling, manifest)

    def _for(self, sampling: Sampling | None, adapter: str | None = None) -> ResponseCache | None:
        """The cache for a request's own sampling (None: the job's) and adapter (None:
        the base model); None: not cached."""
        if sampling is None and adapter is None:
            return self.cache if self._job_cacheable else None
        if not (cacheable(sampling) if sampling is not None else self._job_cacheable):
            return None
        # a tuple: the base model (None) and an adapter called "None" are two scopes
        key = (sampling_key(sampling) if sampling is not None else "", adapter)
        cache = self._scoped.get(key)
        if cache is None:
            scope = cache_scope(self._inputs, sampling or self._sampling, adapter)
            cache = ResponseCache(self.cache.store, scope)
            cache.counts = self.cache.counts  # one tally for the run
            self._scoped[key] = cache
        return cache

    def lookup(self, request: EngineRequest) -> EngineResult | None:
        cache = self._for(request.sampling, request.adapter)
        answer = cache.get(request.token_ids) if cache is not None else None
        if answer is None:
            return None
        try:
            result = result_of(request.key, answer)
        except (KeyError, TypeError, ValueError):  # checksummed but not ours: a miss
            return None
        self.answered.add(request.key)
        return result

    def from_cache(self, key: int) -> bool:
        return key in self.answered

    def store(
        self,
        token_ids,
        result: EngineResult,
        sampling: Sampling | None = None,
        adapter: str | None = None,
    ) -> None:
        """Keep an engine's answer; errors, unfinished and cached answers are not stored."""
        cache = self._for(sampling, adapter)
        if result.error or result.aborted or result.key in self.answered or cache is None:
            return
        cache.put(token_ids, answer_of(result))

    def section(self) -> dict[str, Any]:
        c = self.cache.counts
        return {
            "path": self.location,
            "hits": c.hits,
            "misses": c.misses,
            "stored": c.stored,
            "damaged_ignored": c.damaged,
        }


def canary_answers(
    plans: PlanStore, manifest: dict[str, Any], sampling: Sampling
) -> RunCache | None:
    """The answers the canary's sample got under the job's settings, when a canary ran
    (``pipelines.canary``): looked up like ``cache.path``'s, never stored into."""
    kept = (plans.canary() or {}).get("answers")
    return RunCache.at(plans.store.uri(kept), manifest, sampling) if kept else None


def answer_of(result: EngineResult) -> dict[str, Any]:
    """An engine result as the cache stores it (``io.responsecache.ANSWER_FIELDS``)."""
    return {
        "text": result.text,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "output_tokens": result.output_tokens,
        "cached_tokens": result.cached_tokens,
        "choices": [
            {
                "text": c.text,
                "finish_reason": c.finish_reason,
                "output_tokens": c.output_tokens,
                "stop_sequence": c.stop_sequence,
                "logprobs": None if c.logprobs is None else [_token(t) for t in c.logprobs],
            }
            for c in result.choices
        ],
        **({} if result.scores is None else {"scores": list(result.scores)}),
        **({} if result.embedding is None else {"embedding": result.embedding.tolist()}),
        **_thinking(result),
    }


def _thinking(result: EngineResult) -> dict[str, Any]:
    """A reasoning model's thinking (choice 0's), kept apart as the answer had it."""
    if result.reasoning is None:
        return {}
    return {
        "reasoning": result.reasoning,
        "reasoning_tokens": result.reasoning_tokens,
        "reasoning_unfinished": result.reasoning_unfinished,
    }


def result_of(key: int, answer: dict[str, Any]) -> EngineResult:
    """The engine result ``answer_of`` stored, under this run's request ``key``."""
    choices = tuple(
        Choice(
            text=c["text"],
            finish_reason=c["finish_reason"],
            output_tokens=int(c["output_tokens"]),
            stop_sequence=c["stop_sequence"],
            logprobs=None if c["logprobs"] is None else tuple(map(_logprob, c["logprobs"])),
        )
        for c in answer["choices"]
    )
    thinking = {
        "reasoning": answer.get("reasoning"),
        "reasoning_tokens": int(answer.get("reasoning_tokens") or 0),
        "reasoning_unfinished": bool(answer.get("reasoning_unfinished")),
    }
    if choices and thinking["reasoning"] is not None:  # choice 0 thought it
        choices = (replace(choices[0], **thinking), *choices[1:])
    return EngineResult(
        key,
        **thinking,
        text=answer["text"],
        finish_reason=answer["finish_reason"],
        prompt_tokens=int(answer["prompt_tokens"]),
        output_tokens=int(answer["output_tokens"]),
        cached_tokens=int(answer["cached_tokens"]),
        choices=choices,
        scores=tuple(map(float, answer["scores"])) if "scores" in answer else None,
        embedding=as_vector(answer["embedding"]) if "embedding" in answer else None,
    )


def _token(t: TokenLogprob) -> dict[str, Any]:
    top = [_token(x) for x in t.top_logprobs]
    return {"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes), "top": top}


def _logprob(t: dict[str, Any]) -> TokenLogprob:
    top = tuple(map(_logprob, t["top"]))
    return TokenLogprob(t["token"], float(t["logprob"]), tuple(t["bytes"]), top)
