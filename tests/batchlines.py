"""An answered batch row, and the context its output lines are written in, as the
batch format tests build them."""

from __future__ import annotations

from nightshift.batch.openai import CHAT
from nightshift.batch.shapes import Context

CTX = Context("abc", 1700000000, CHAT)


def ok_row(text="hello", finish="stop", detail=None):
    return {
        "custom_id": "a",
        "text": text,
        "finish_reason": finish,
        "prompt_tokens": 20,
        "output_tokens": 4,
        "cached_tokens": 16,
        "detail": detail,
    }
