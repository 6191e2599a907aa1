"""What goes to vLLM per request and what comes back: ``SamplingParams`` built from a
``Sampling`` (once per distinct one), and vLLM's finished outputs as ``EngineResult``
with every choice, its stop sequence and its logprobs in the engine contract's shape.
"""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

from nightshift.engines.base import (
    Choice,
    EngineResult,
    Pooling,
    Sampling,
    TokenLogprob,
    as_vector,
)
from nightshift.engines.reasoning import Markers, Thought


class ParamsCache:
    """``SamplingParams`` per distinct ``Sampling``, built once each: records with their
    own sampling mostly share a few. Keyed on canonical JSON, as a JSON schema is a dict
    (unhashable); bounded, as every record may have its own."""

    def __init__(self, default: Sampling, limit: int = 4096) -> None:
        self._default = _sampling_params(default)
        self._default_sampling, self._limit = default, limit
        self._built: dict[str, Any] = {}

    def get(self, sampling: Sampling) -> Any:
        if sampling is self._default_sampling:
            return self._default
        key = json.dumps(asdict(sampling), sort_keys=True, default=str)
        params = self._built.get(key)
        if params is None:
            if len(self._built) >= self._limit:
                self._built.clear()
            params = self._built[key] = _sampling_params(sampling)
        return params


def _sampling_params(sampling: Sampling):
    if sampling.pooling is not None:
        return _pooling_params(sampling.pooling)
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    structured, c = None, sampling.constraint
    if c and c.choice:
        structured = StructuredOutputsParams(choice=list(c.choice))
    elif c and c.json_schema is not None:
        structured = StructuredOutputsParams(json=c.json_schema)
    elif c and c.json_object:
        structured = StructuredOutputsParams(json_object=True)
    return SamplingParams(
        n=sampling.n,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        # vLLM returns score tokens in place of top logprobs: a job asks for one or other
        logprobs=None if sampling.score_tokens else sampling.logprobs,
        logprob_token_ids=list(sampling.score_tokens) or None,
        structured_outputs=structured,
        output_kind=RequestOutputKind.FINAL_ONLY,  # as LLM.generate: no per-step partials
        # honoured only with a reasoning parser (model.reasoning), refused without one
        thinking_token_budget=sampling.reasoning_budget if sampling.reasoning else None,
    )


def _pooling_params(pooling: Pooling):
    from vllm import PoolingParams

    # vLLM's embed task normalizes through its activation (use_activation)
    return PoolingParams(
        task="embed", use_activation=pooling.normalize, dimensions=pooling.dimensions
    )


def _embedding(key: int, out: Any) -> EngineResult:
    """A finished pooling request: its vector, and the prompt tokens it read."""
    data = out.outputs.data
    return EngineResult(
        key=key,
        finish_reason="stop",
        prompt_tokens=len(out.prompt_token_ids or []),
        cached_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
        # float32 numpy, never Python floats (engines.base.as_vector)
        embedding=as_vector(data.float().reshape(-1).cpu().numpy()),
    )


# vLLM's finish reasons (vllm.v1.engine.FINISH_REASON_STRINGS) that are no answer: an
# aborted request was given up before it finished; "error" is vLLM's retryable
# request-level internal error (a KV load failure, say). None is an unfinished output.
_UNANSWERED = {"abort", None}
_RETRYABLE = {"error"}


def _result(
    key: int,
    out: Any,
    top: int | None = None,
    score_tokens: tuple[int, ...] = (),
    markers: Markers | None = None,
) -> EngineResult:
    """One finished request; ``top``: the top logprobs it asked for (None: none);
    ``score_tokens``: the tokens whose first-place log probabilities it asked for;
    ``markers``: a reasoning model's, to take each answer apart from its thinking."""
    if hasattr(out.outputs, "data"):  # a PoolingRequestOutput: one vector, no choices
        return _embedding(key, out)
    completions = sorted(out.outputs or [], key=lambda c: getattr(c, "index", 0))
    reasons = [c.finish_reason for c in completions] or [None]
    prompt_tokens = len(out.prompt_token_ids or [])
    if any(reason in _UNANSWERED for reason in reasons):  # any choice unfinished: no answer
        return EngineResult(
            key, finish_reason=reasons[0], prompt_tokens=prompt_tokens, aborted=True
        )
    thoughts = _thoughts(completions, markers, out.prompt_token_ids or [])
    choices = tuple(_choice(c, top, t) for c, t in zip(completions, thoughts, strict=True))
    # one choice's internal error makes the whole request worth sending again
    reason = next((r for r in reasons if r in _RETRYABLE), reasons[0])
    result = EngineResult(
        key=key,
        text=choices[0].text,
        finish_reason=reason,
        prompt_tokens=prompt_tokens,
        output_tokens=sum(c.output_tokens for c in choices),
        cached_tokens=int(out.num_cached_tokens or 0),
        choices=choices,
        scores=_scores(completions[0], score_tokens, thoughts[0]) if score_tokens else None,
        reasoning=choices[0].reasoning,
        reasoning_tokens=sum(c.reasoning_tokens for c in choices),
        reasoning_unfinished=choices[0].reasoning_unfinished,
    )
    if reason in _RETRYABLE:
        error = f"vLLM ended the request with an internal error (finish_reason {reason!r})"
        return replace(result, error=error, retryable=True)
    return result


def _thoughts(
    completions: list[Any], markers: Markers | None, prompt_ids: list[int]
) -> list[Thought | None]:
    """Each completion taken apart into thinking and answer (None: not a reasoning model)."""
    if markers is None:
        return [None] * len(completions)
    open_ = markers.open_after(prompt_ids)
    return [markers.split(c.token_ids, c.text, open_) for c in completions]


def _scores(completion: Any, tokens: tuple[int, ...], thought: Thought | None) -> tuple[float, ...]:
    """The answer's first place's log probability of each of ``tokens`` (-inf where vLLM
    gave none, which it does only for a token it ruled out): after the thinking, for a
    reasoning model."""
    at = thought.answer_at if thought is not None else 0
    places = completion.logprobs or []
    place = (places[at] if at < len(places) else None) or {}
    return tuple(float(place[t].logprob) if t in place else float("-inf") for t in tokens)


def _choice(completion: Any, top: int | None, thought: Thought | None = None) -> Choice:
    stop = getattr(completion, "stop_reason", None)
    logprobs = _logprobs(completion, top) if top is not None else None
    choice = Choice(
        text=completion.text,
        finish_reason=completion.finish_reason,
        output_tokens=len(completion.token_ids),
        stop_sequence=stop if isinstance(stop, str) else None,  # an int is a stop token id
        logprobs=logprobs,
    )
    if thought is None:
        return choice
    return replace(
        choice,
        text=thought.answer,
        reasoning=thought.reasoning,
        reasoning_tokens=thought.reasoning_tokens,
        reasoning_unfinished=thought.unfinished,
        logprobs=logprobs[thought.answer_at :] if logprobs is not None else None,
    )


def _logprobs(completion: Any, top: int) -> tuple[TokenLogprob, ...]:
    """vLLM's logprobs (per place: token id -> Logprob with its rank and decoded text)
    as the chosen token's and the ``top`` likeliest at each place."""
    out = []
    for token_id, place in zip(completion.token_ids, completion.logprobs or [], strict=False):
        place = place or {}
        chosen = place.get(token_id)
        ranked = sorted(
            (e for e in place.items() if e[1].rank is not None and e[1].rank <= top),
            key=lambda e: e[1].rank,
        )
        out.append(
            TokenLogprob(
                *_token(chosen), top_logprobs=tuple(TokenLogprob(*_token(e)) for _, e in ranked)
            )
        )
    return tuple(out)


def _token(entry: Any) -> tuple[str, float, tuple[int, ...]]:
    text = (entry.decoded_token if entry is not None else None) or ""
    logprob = float(entry.logprob) if entry is not None else float("-inf")
    return text, logprob, tuple(text.encode())
