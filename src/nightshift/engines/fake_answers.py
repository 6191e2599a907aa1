"""What the fake engine answers (``engines.fake``): digests of token ids and the made-up
content drawn from them (label scores, JSON for a schema, logprobs, vectors), pure
functions the engine and its reasoning stand-in (``engines.fake_reasoning``) share."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from nightshift.engines.base import TokenLogprob

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


def _fast_vector(seed: int, size: int, normalize: bool) -> list[float]:
    import numpy as np

    vector = np.random.default_rng(seed).uniform(-1.0, 1.0, size)
    if normalize:
        vector /= np.linalg.norm(vector) or 1.0
    return vector.tolist()
