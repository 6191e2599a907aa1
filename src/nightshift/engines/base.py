"""The engine contract: what the job runner asks of any generation backend.

An engine takes a stream of prompts that are already token ids (so the counts the
planner saw are exactly what the model sees, and no BOS is ever added twice) and yields
one result per prompt as each finishes, in any order, matched back by ``key``. It reads
ahead of what it has finished so its batch never drains between records. A problem with
one prompt comes back as that result's ``error`` (``retryable`` when sending the same
request again may succeed); a request the engine gave up on without finishing (vLLM's
``abort``) comes back ``aborted``: it is no answer, and its record stays unanswered. A
dead engine raises ``EngineFatalError``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Constraint:
    """Guided decoding: the answer is one of ``choice``, JSON matching ``json_schema``, or
    (``json_object``) any JSON object."""

    choice: tuple[str, ...] | None = None
    json_schema: dict[str, Any] | None = None
    json_object: bool = False


@dataclass(frozen=True)
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    constraint: Constraint | None = None
    n: int = 1  # answers (choices) per prompt
    logprobs: int | None = None  # None: none; k: each chosen token's and the top k's
    top_k: int = 0  # sample from the k likeliest tokens; 0: from all (vLLM's default)
    # Token ids whose log probabilities at the answer's first place come back as the
    # result's ``scores``, in this order, taken before any sampling rule or constraint
    # (classify scores each label by its first token, see jobs.tasks).
    score_tokens: tuple[int, ...] = ()
    pooling: Pooling | None = None  # set: embed the prompt, generate nothing
    # model.reasoning: the model thinks before it answers (the engine splits the two);
    # reasoning_budget: the most thinking tokens (vLLM's thinking_token_budget), None: no
    # cap but max_tokens, which counts the thinking and the answer together.
    reasoning: bool = False
    reasoning_budget: int | None = None


@dataclass(frozen=True)
class Pooling:
    """An embedding instead of an answer (``task.kind: embed``): vLLM's pooling runner."""

    normalize: bool = True
    dimensions: int | None = None  # Matryoshka truncation; None: the model's own size


# Not frozen (nor are Choice and EngineResult): one is built for every record, and a
# frozen dataclass's __init__ sets each field through object.__setattr__ (3.0 µs for a
# result of 15 fields against 0.7). Nothing changes one after it is built.
@dataclass
class EngineRequest:
    key: int  # the runner's handle for the request, unique in the run; results carry it back
    token_ids: Sequence[int]
    sampling: Sampling | None = None  # this request's own (input.sampling_column); None: the run's
    adapter: str | None = None  # the LoRA adapter it runs under (model.adapters); None: base


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's log probability; ``bytes`` are its text's UTF-8 bytes."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    top_logprobs: tuple[TokenLogprob, ...] = ()  # the likeliest tokens at its place


@dataclass  # not frozen: see EngineRequest
class Choice:
    """One of a request's ``n`` answers. ``stop_sequence``: the stop string that ended it."""

    text: str
    finish_reason: str | None
    output_tokens: int = 0
    stop_sequence: str | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None  # None: not asked for
    reasoning: str | None = None  # the thinking before ``text`` (None: the model did not)
    reasoning_tokens: int = 0  # of output_tokens, those spent thinking
    reasoning_unfinished: bool = False  # thinking used every token: ``text`` is no answer


@dataclass  # not frozen: see EngineRequest
class EngineResult:
    key: int
    text: str = ""  # choice 0's, as are finish_reason and stop_sequence
    finish_reason: str | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0  # summed over the choices
    cached_tokens: int = 0
    error: str | None = None
    retryable: bool = False  # the error may not recur: the request is worth sending again
    aborted: bool = False  # not finished: no answer, never a row; the record is asked again
    choices: tuple[Choice, ...] = ()  # every answer; () means one: text and finish_reason
    scores: tuple[float, ...] | None = None  # Sampling.score_tokens' log probabilities
    # Sampling.pooling's vector: a read-only float32 numpy array (``as_vector``), never
    # Python floats (a 1,024-float vector as floats costs more than nightshift's whole path)
    embedding: Any = field(default=None, compare=False)  # an array: no == of its own
    # choice 0's thinking, apart from ``text`` (Choice's fields); tokens summed over choices
    reasoning: str | None = None
    reasoning_tokens: int = 0
    reasoning_unfinished: bool = False

    def all_choices(self) -> tuple[Choice, ...]:
        """Every answer, choice 0 first (one made of ``text`` when ``choices`` is empty)."""
        if self.choices:
            return self.choices
        return (
            Choice(
                self.text,
                self.finish_reason,
                self.output_tokens,
                reasoning=self.reasoning,
                reasoning_tokens=self.reasoning_tokens,
                reasoning_unfinished=self.reasoning_unfinished,
            ),
        )


@dataclass
class EngineStats:
    """Counters the engine itself keeps; the report prefers them to our own sums."""

    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    output_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefill_seconds: float = 0.0  # summed over requests: time from scheduled to first token
    decode_seconds: float = 0.0  # summed over requests: first token to last
    preemptions: int = 0  # requests evicted from a full KV cache, to be computed again
    engine_steps: int = 0  # scheduler iterations (one batch each)
    draft_tokens: int = 0  # speculative decoding: tokens proposed
    draft_tokens_accepted: int = 0  # ... and accepted (each saves a decode step)
    # Peaks seen while running (sampled, so a lower bound): what bound the batch.
    peak_kv_cache_usage: float = 0.0  # share of the KV cache's blocks in use
    peak_running: int = 0  # requests in one batch: the batch size reached
    peak_waiting: int = 0  # requests queued for room in the batch

    def plus(self, other: EngineStats) -> EngineStats:
        """Two engines' (or workers') counters together: counts add, peaks take the larger."""
        return EngineStats(**{k: _combine(k, v, getattr(other, k)) for k, v in vars(self).items()})

    def since(self, before: EngineStats) -> EngineStats:
        """The counts added after ``before`` was read (a caller's engine used again); the
        peaks cannot be split, so they stay the engine's own."""
        return EngineStats(
            **{k: v if k in PEAKS else v - getattr(before, k) for k, v in vars(self).items()}
        )


PEAKS = frozenset({"peak_kv_cache_usage", "peak_running", "peak_waiting"})


def _combine(name: str, a: float, b: float) -> float:
    return max(a, b) if name in PEAKS else a + b


@dataclass(frozen=True)
class EngineInfo:
    """What the engine was actually built with, as it reports it."""

    name: str
    kv_cache_dtype: str
    kv_cache_tokens: int
    block_size: int
    prefix_caching: bool
    settings: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    info: EngineInfo

    def run(
        self, requests: Iterable[EngineRequest | None], sampling: Sampling
    ) -> Iterator[EngineResult]:
        """Results of ``requests`` as they finish, each under its own ``sampling`` or,
        without one, under ``sampling``. ``requests`` may yield None: nothing to send
        yet; the engine goes on with what it holds and asks again (a feed whose next
        shard has not arrived never makes a running batch wait)."""
        ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...


def as_vector(values: Any, copy: bool = True) -> Any:
    """``values`` (a sequence or array of numbers) as an embedding: a read-only float32
    numpy array, as ``EngineResult.embedding`` holds it. A copy (never an engine's
    buffer) unless ``copy`` is False: a read-only float32 array nobody writes to (the
    fake engine's) is used as it is, as a copy of 500 floats or more releases the GIL,
    and the feeding thread may then wait on other threads for it."""
    import numpy as np

    array = np.array(values, dtype=np.float32, copy=copy or None).reshape(-1)
    array.flags.writeable = False
    return array
