"""A content-addressed response cache shared by jobs (``cache.path``: a directory or s3://).

An entry is one engine answer under ``responses/<k[:2]>/<k>.json``, where ``k`` is the
SHA-256 of the caller's *scope* (everything besides the prompt that decides the answer:
model and tokenizer identity as in the fingerprint, dtype, KV-cache dtype, engine extras,
sampling and the guided-decoding constraint) and the exact prompt token ids. Entries are
written with ``put_if_absent`` (a conditional write on both stores), so concurrent jobs
never overwrite one another; deterministic answers make either copy right. An entry
carries its key and a SHA-256 of its answer: one that does not parse, names another key or
fails its checksum is damaged, is never returned, and is deleted so the regenerated answer
can take its place.

What grows: one small JSON object per distinct (scope, prompt) answered, never deleted by
a run. ``nightshift cache stats|prune PATH`` counts it and trims it by age or count.
"""

from __future__ import annotations

import hashlib
import json
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nightshift.errors import ObjectNotFound
from nightshift.io.objectstore import ObjectStore, open_store

PREFIX = "responses/"
ANSWER_FIELDS = ("text", "finish_reason", "prompt_tokens", "output_tokens", "cached_tokens")


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
        return f"{PREFIX}{digest[:2]}/{digest}.json"

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
        answer = {f: answer[f] for f in ANSWER_FIELDS}
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
        if set(answer) != set(ANSWER_FIELDS) or not isinstance(answer["text"], str):
            return None
        return answer
    except (ValueError, KeyError, TypeError):
        return None


def sample_answers(location: str, scope: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` valid answers stored under ``scope`` (for `jobs plan`'s estimate)."""
    store, found = open_store(location), []
    for key in store.list(PREFIX):
        if len(found) >= limit:
            break
        try:
            data = store.get_bytes(key)
        except ObjectNotFound:
            continue
        answer = _valid(data, key)
        if answer is not None and json.loads(data).get("scope") == scope:
            found.append(answer)
    return found


def cache_stats(location: str) -> dict[str, Any]:
    """Entries, bytes, damaged entries and the oldest and newest answer's time."""
    store = open_store(location)
    entries, size, damaged, times = 0, 0, 0, []
    for key in store.list(PREFIX):
        data = store.get_bytes(key)
        entries, size = entries + 1, size + len(data)
        if _valid(data, key) is None:
            damaged += 1
        else:
            times.append(json.loads(data).get("at", 0.0))
    return {
        "path": location,
        "entries": entries,
        "bytes": size,
        "damaged": damaged,
        "oldest": min(times, default=None),
        "newest": max(times, default=None),
    }


def prune(location: str, older_than_s: float | None = None, keep: int | None = None) -> int:
    """Delete damaged entries, those older than ``older_than_s`` and all but the newest
    ``keep``; returns how many were deleted."""
    store = open_store(location)
    now, dated, doomed = time.time(), [], []
    for key in store.list(PREFIX):
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
