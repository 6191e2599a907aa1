"""What the fake engine answers (``engines.fake``): digests of token ids and the made-up
content drawn from them (label scores, JSON for a schema, logprobs, vectors), pure
functions the engine and its reasoning stand-in (``engines.fake_reasoning``) share."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from nightshift.engines.base import Sampling, TokenLogprob

_BITS_64 = 2**64 - 1


def _digest(token_ids: Sequence[int]) -> int:
    return _text_digest(",".join(map(str, token_ids)))


def _text_digest(text: str) -> int:
    """``_digest`` of the ids ``text`` joins: a prompt joined once serves every digest
    made from it (the join, not the hash, is what costs)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def prompt_digest(token_ids: Sequence[int]) -> str:
    """What the ``log`` writes for one generated request: its prompt's digest (request
    keys mean nothing outside their run; the prompt names the record)."""
    return f"{_digest(list(token_ids)):016x}"


def _scores(joined: str, tokens: tuple[int, ...]) -> tuple[float, ...]:
    """Made-up log probabilities of ``tokens`` after the prompt whose ids ``joined``
    joins: fixed per prompt and token, between -10.5 and -0.5."""
    head = f"{joined}," if joined else ""
    return tuple(-0.5 - (_text_digest(f"{head}-1,{t}") % 10_000) / 1_000 for t in tokens)


def answer_text(seed: int, sampling: Sampling) -> tuple[str, str]:
    """The fake's answer for ``seed`` and its finish reason: a guided choice or JSON, else
    ``max_tokens`` made-up words."""
    constraint = sampling.constraint
    if constraint and constraint.choice:
        return constraint.choice[seed % len(constraint.choice)], "stop"
    if constraint and constraint.json_schema is not None:
        return json.dumps(example_json(constraint.json_schema, seed)), "stop"
    if constraint and constraint.json_object:
        return json.dumps({"answer": f"v{seed % 97}"}), "stop"
    words = [f"w{(seed >> (i % 48)) % 1000}" for i in range(sampling.max_tokens)]
    return " ".join(words), "length"


def cut_at_stop(text: str, finish: str, sampling: Sampling) -> tuple[str, str, str | None]:
    """``text`` cut at the first of the sampling's stop strings it holds (as vLLM's
    ``stop``), its finish reason, and that string (None: none cut it)."""
    found = [(text.find(stop), stop) for stop in sampling.stop if stop in text]
    if not found:
        return text, finish, None
    at, stop = min(found)
    return text[:at], "stop", stop


def example_json(schema: dict[str, Any], seed: int) -> Any:
    """A small value that matches ``schema`` (the subset guided JSON tests use)."""
    if "enum" in schema:
        return schema["enum"][seed % len(schema["enum"])]
    kind = schema.get("type", "object")
    if kind == "object":
        props = schema.get("properties", {})
        return {name: example_json(sub, seed + i) for i, (name, sub) in enumerate(props.items())}
    if kind == "array":
        return [example_json(schema.get("items", {}), seed)]
    return {
        "string": f"v{seed % 97}",
        "integer": seed % 100,
        "number": (seed % 1000) / 10,
        "boolean": bool(seed % 2),
        "null": None,
    }.get(kind)


def _logprob(token: str, seed: int, top: int) -> TokenLogprob:
    """A made-up log probability of ``token``, with ``top`` alternatives (itself first)."""
    logprob = -((seed % 7) + 1) / 8
    others = [TokenLogprob(f"t{seed % 89 + m}", logprob - m, tuple(b"t")) for m in range(1, top)]
    mine = TokenLogprob(token, logprob, tuple(token.encode()))
    return replace(mine, top_logprobs=(mine, *others)[:top])


def _fast_vector(seed: int, size: int, normalize: bool) -> Any:
    """A vector fixed by ``seed``: one of 1,024 drawn rows, rotated by more of the seed
    (distinct vectors by the million at a model's size), ~1 µs where a fresh generator's
    draws cost ~20 (more than nightshift's whole run path). A read-only view."""
    rows = _vector_rows(size, normalize)  # each row twice over: a rotation is a slice
    shift = (seed >> 10) % size  # a rotation keeps a row's length
    return rows[seed % len(rows), shift : shift + size]


@functools.cache
def _vector_rows(size: int, normalize: bool) -> Any:
    rows = np.random.default_rng(size).uniform(-1.0, 1.0, (1024, size))
    if normalize:
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    rows = np.concatenate([rows, rows], axis=1).astype(np.float32)
    rows.flags.writeable = False
    return rows
