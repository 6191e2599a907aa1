"""The settings ``jobs tune`` tries: one change each from the job's spec, and a reference.

Each candidate is the job's spec with a few keys set, as ``--set`` sets them. The default
levers are those that move throughput without changing answers (batch limits, n-gram
speculative decoding) and the one that may change them (the FP8 KV cache); ``--try
key=v1,v2`` adds any spec key. The *reference* is the job at its most exact: the model's
own dtype in the KV cache and no speculation; every candidate's answers are compared with
its answers on the same records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightshift.errors import SpecError
from nightshift.jobs.loading import override_value, set_key, validate_spec
from nightshift.jobs.platform import batch_limits
from nightshift.jobs.reference import SPECULATION, reference_sets
from nightshift.jobs.spec import JobSpec

REFERENCE = "reference"
JOB = "job"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


@dataclass(frozen=True)
class Candidate:
    """A named setting: ``sets`` maps spec keys (``engine.max_num_seqs``) to values."""

    name: str
    sets: dict[str, Any] = field(default_factory=dict)

    def applied(self, data: dict[str, Any]) -> dict[str, Any]:
        """A copy of the spec mapping ``data`` with this candidate's keys set (as ``--set``
        sets them, with the values as they are, not as text to read)."""
        import copy

        data = copy.deepcopy(data)
        for key, value in self.sets.items():
            set_key(data, key, value)
        return data


def reference(spec: JobSpec) -> Candidate:
    """The job at its most exact: KV cache in the model's dtype, no speculation."""
    return Candidate(REFERENCE, reference_sets(spec))


def default_candidates(spec: JobSpec) -> list[Candidate]:
    """One lever each: half and double the batch limits, FP8 KV where the job has none
    (or none where it has it), and n-gram speculation where answers are long."""
    e = spec.engine
    seqs, tokens = batch_limits(e)  # unset: the engine's default on this host
    found = []
    for key, now, low in (
        ("engine.max_num_seqs", seqs, 1),
        ("engine.max_num_batched_tokens", tokens, 256),
    ):
        for value in (max(low, now // 2), now * 2):
            if value != now:
                found.append(Candidate(f"{key.split('.')[-1]}={value}", {key: value}))
    other_kv = "auto" if e.kv_cache_dtype != "auto" else "fp8"
    found.append(Candidate(f"kv_cache_dtype={other_kv}", {"engine.kv_cache_dtype": other_kv}))
    if answers_are_long(spec):  # speculation drafts several tokens: pointless for one
        found.append(Candidate("ngram speculation", {SPECULATION: NGRAM}))
    return found


def answers_are_long(spec: JobSpec) -> bool:
    """Whether answers run to more than a handful of tokens (a scored label is one)."""
    return spec.task.kind != "classify" and spec.sampling.max_tokens > 8


def parse_tries(tries: list[str]) -> list[Candidate]:
    """``--try key=v1,v2``: one candidate per value (commas inside brackets or braces
    belong to the value: ``--try 'engine.extra.x={"a": 1, "b": 2}'``)."""
    found = []
    for item in tries:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(
                "--try", f"{item!r} is not key=v1,v2", "e.g. engine.max_num_seqs=64,128"
            )
        for value in split_values(raw):
            found.append(Candidate(f"{key.split('.')[-1]}={value}", {key: override_value(value)}))
    return found


def split_values(raw: str) -> list[str]:
    values, depth, start = [], 0, 0
    for i, ch in enumerate(raw):
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(raw[start:i].strip())
            start = i + 1
    values.append(raw[start:].strip())
    return [v for v in values if v]


def job_is_reference(spec: JobSpec, data: dict[str, Any]) -> bool:
    """Whether the job as it is (``spec``, from the spec file's ``data``) already runs at
    the reference's settings."""
    return effective(data, reference(spec)) == effective(data, Candidate(JOB))


def effective(data: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The whole spec ``candidate`` runs, defaults filled in (an engine.extra key set
    to None is vLLM's default, the same engine as without it)."""
    dumped = validate_spec(candidate.applied(data)).model_dump(mode="json")
    extra = dumped["engine"]["extra"]
    dumped["engine"]["extra"] = {k: v for k, v in extra.items() if v is not None}
    return dumped
