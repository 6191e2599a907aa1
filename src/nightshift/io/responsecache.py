"""A content-addressed response cache shared by jobs (``cache.path``: a directory or s3://).

An entry is one engine answer under ``responses/<s>/<k[:2]>/<k>.json``, where ``s`` is the
SHA-256 of the caller's *scope* (everything besides the prompt that decides the answer:
model and tokenizer identity as in the fingerprint, dtype, KV-cache dtype, engine extras,
sampling and the guided-decoding constraint) and ``k`` the SHA-256 of the scope and the
exact prompt token ids. The scope leads the key so that one job's entries are listed by
prefix, never by reading everyone's (`jobs plan`'s sample). Entries are written with
``put_if_absent`` (a conditional write on both stores), so concurrent jobs never
overwrite one another; deterministic answers make either copy right. An entry carries its
key and a SHA-256 of its answer: one that does not parse, names another key or fails its
checksum is damaged, is never returned, and is deleted so the regenerated answer can take
its place. The answer holds every detail a result row is made of (text, finish reason,
token counts, and each choice with its stop sequence and logprobs), so an answer served
from the cache is the one that was generated.

Entries of the old layout (``responses/<k[:2]>/<k>.json``, before the scope led the key)
held no choice detail and may hold samples: no run reads them; `cache prune` deletes them.

What grows: one small JSON object per distinct (scope, prompt) answered, never deleted by
a run. ``nightshift cache stats|prune PATH`` counts it and trims it by age or count; both
touch only keys shaped exactly like entries, never another file under ``responses/``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nightshift.errors import ObjectNotFound
from nightshift.io.objectstore import ObjectStore, open_store

PREFIX = "responses/"
ANSWER_FIELDS = (
    "text",
    "finish_reason",
    "prompt_tokens",
    "output_tokens",
    "cached_tokens",
    "choices",  # [] when the engine gave its one answer as text and finish_reason only
)
# a classify job's label scores (engines.base.Sampling), an embed job's vector
# a reasoning model's answer (model.reasoning) keeps its thinking apart, choice 0's
OPTIONAL_FIELDS = ("scores", "embedding", "reasoning", "reasoning_tokens", "reasoning_unfinished")
CHOICE_FIELDS = ("text", "finish_reason", "output_tokens", "stop_sequence", "logprobs")
_HEX = "[0-9a-f]"
ENTRY = re.compile(rf"responses/{_HEX}{{64}}/({_HEX}{{2}})/\1{_HEX}{{62}}\.json")
OLD_ENTRY = re.compile(rf"responses/({_HEX}{{2}})/\1{_HEX}{{62}}\.json")
HEX_DIGITS = "0123456789abcdef"


def scope_digest(scope: dict[str, Any]) -> str:
    canonical = json.dumps(scope, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _checksum(answer: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(answer, sort_keys=True).encode()).hexdigest()


@dataclass
class CacheCounts:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    damaged: int = 0


class ResponseCache:
    """Look answers up by prompt token ids within one scope; store new ones."""

    def __init__(self, store: ObjectStore, scope: dict[str, Any]) -> None:
        self.store, self.scope = store, scope_digest(scope)
        self.counts = CacheCounts()

    @classmethod
    def open(cls, location: str, scope: dict[str, Any]) -> ResponseCache:
        return cls(open_store(location), scope)

    def key(self, token_ids: Sequence[int]) -> str:
        h = hashlib.sha256(self.scope.encode())
        h.update(array("q", token_ids).tobytes())  # exact ids, fixed width: no ambiguity
        digest = h.hexdigest()
        return f"{PREFIX}{self.scope}/{digest[:2]}/{digest}.json"

    def get(self, token_ids: Sequence[int]) -> dict[str, Any] | None:
        """The stored answer (``ANSWER_FIELDS``), or None: absent or damaged."""
        key = self.key(token_ids)
        try:
            data = self.store.get_bytes(key)
        except ObjectNotFound:
            self.counts.misses += 1
            return None
        answer = _valid(data, key)
        if answer is None:
            self.counts.damaged += 1
            self.counts.misses += 1
            self.store.delete([key])  # the regenerated answer takes its place
            return None
        self.counts.hits += 1
        return answer

    def put(self, token_ids: Sequence[int], answer: dict[str, Any]) -> None:
        """Store an answer, unless another job stored one first (a conditional write)."""
        answer = {"choices": [], **answer}
        answer = {f: answer[f] for f in (*ANSWER_FIELDS, *OPTIONAL_FIELDS) if f in answer}
        key = self.key(token_ids)
        entry = {
            "key": key,
            "scope": self.scope,
            "answer": answer,
            "sha256": _checksum(answer),
            "at": time.time(),
        }
        if self.store.put_if_absent(key, json.dumps(entry).encode()):
            self.counts.stored += 1


def _valid(data: bytes, key: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(data)
        answer = entry["answer"]
        if entry["key"] != key or entry["sha256"] != _checksum(answer):
            return None
        if set(answer) - set(OPTIONAL_FIELDS) != set(ANSWER_FIELDS):
            return None
        if not isinstance(answer["text"], str) or not _scores_valid(answer.get("scores", [])):
            return None
        if not _scores_valid(answer.get("embedding", [])):
            return None
        if not isinstance(answer["choices"], list) or not all(
            set(c) == set(CHOICE_FIELDS) and isinstance(c["text"], str) for c in answer["choices"]
        ):
            return None
        return answer
    except (ValueError, KeyError, TypeError):
        return None


def _scores_valid(scores: Any) -> bool:
    # -inf is JSON's -Infinity, which Python's json writes and reads back
    return isinstance(scores, list) and all(isinstance(s, int | float) for s in scores)


def sample_answers(location: str, scope: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` valid answers stored under ``scope`` (for `jobs plan`'s estimate).

    Only this scope's keys are listed, a sixteenth of them at a time (keys are hashes, so
    any sixteenth is a fair sample), and at most ``limit`` entries are read: a big shared
    cache costs at most 16 listings and ``limit`` reads."""
    store, found = open_store(location), []
    for digit in HEX_DIGITS:
        for key in store.list(f"{PREFIX}{scope}/{digit}"):
            if len(found) >= limit:
                return found
            if not ENTRY.fullmatch(key):
                continue
            try:
                answer = _valid(store.get_bytes(key), key)
            except ObjectNotFound:
                continue
            if answer is not None:
                found.append(answer)
    return found


def _entries(store: ObjectStore) -> tuple[list[str], list[str]]:
    """(entries, entries of the old layout) under ``responses/``: keys shaped exactly as
    this module writes them; any other file there is not ours to count or delete."""
    keys = store.list(PREFIX)
    return [k for k in keys if ENTRY.fullmatch(k)], [k for k in keys if OLD_ENTRY.fullmatch(k)]


def cache_stats(location: str) -> dict[str, Any]:
    """Entries, bytes, damaged entries, the oldest and newest answer's time, and the
    entries of the old layout (which no run reads)."""
    store = open_store(location)
    entries, old = _entries(store)
    size, damaged, times = 0, 0, []
    for key in entries:
        try:
            data = store.get_bytes(key)
        except ObjectNotFound:  # a prune took it
            continue
        size += len(data)
        if _valid(data, key) is None:
            damaged += 1
        else:
            times.append(json.loads(data).get("at", 0.0))
    return {
        "path": location,
        "entries": len(entries),
        "bytes": size,
        "damaged": damaged,
        "oldest": min(times, default=None),
        "newest": max(times, default=None),
        "old_layout": len(old),
    }


def prune(location: str, older_than_s: float | None = None, keep: int | None = None) -> int:
    """Delete damaged entries, those of the old layout, those older than ``older_than_s``
    and all but the newest ``keep``; returns how many were deleted."""
    store = open_store(location)
    entries, doomed = _entries(store)
    now, dated = time.time(), []
    for key in entries:
        try:
            data = store.get_bytes(key)
        except ObjectNotFound:  # another prune took it
            continue
        if _valid(data, key) is None:
            doomed.append(key)
            continue
        at = json.loads(data).get("at", 0.0)
        if older_than_s is not None and now - at > older_than_s:
            doomed.append(key)
        else:
            dated.append((at, key))
    if keep is not None:
        dated.sort(reverse=True)
        doomed += [key for _, key in dated[keep:]]
    store.delete(doomed)
    return len(doomed)
