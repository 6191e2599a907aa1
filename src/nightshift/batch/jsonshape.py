"""The shape of a JSON text, told from its bytes before anything parses it.

Request lines (``batch.records``) and HTTP bodies (``batch.http``) are both refused when
they nest deeper than ``MAX_DEPTH``: ``json.loads`` recurses per level (``RecursionError``
past about a thousand) and so does everything that walks the result later (pydantic,
rendering, ``json.dumps``). With the strings' contents blanked out, the brackets are the
structure itself. (Invalid JSON may be measured wrong here; ``json.loads`` refuses it next.)
"""

from __future__ import annotations

import re

MAX_DEPTH = 64  # tool schemas nest a few levels; nothing real comes near this
# A string, or an unterminated one to the end: every match from a quote succeeds, so
# the scan is linear (a failing match retried from each later quote is quadratic).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.S)
_NOT_BRACKET = bytes(sorted(set(range(256)) - set(b"[]{}")))
_SIGN = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")


def skeleton(raw: bytes) -> bytes:
    """``raw`` with every string's contents taken out: brackets, commas and colons left
    are the structure's own."""
    return _STRING.sub(b'""', raw)


def nesting_depth(shape: bytes, chunk: int = 1 << 20) -> int:
    """How deep the arrays and objects of a ``skeleton`` nest: the running sum of +1 per
    opening bracket, -1 per closing one, in chunks (a running sum takes 8 bytes a
    bracket); a few counts when it cannot be deep at all."""
    if shape.count(b"[") + shape.count(b"{") <= MAX_DEPTH:
        return 0
    import numpy as np

    signs = shape.translate(None, _NOT_BRACKET).translate(_SIGN)
    level = deepest = 0
    for start in range(0, len(signs), chunk):
        part = np.frombuffer(
            signs, dtype=np.int8, count=min(chunk, len(signs) - start), offset=start
        )
        running = np.cumsum(part, dtype=np.int64) + level
        deepest, level = max(deepest, int(running.max())), int(running[-1])
    return deepest
