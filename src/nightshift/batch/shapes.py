"""The providers' output line shapes, one function per line kind.

Shapes follow the providers' references: OpenAI's batch output line
(``BatchRequestOutput``) around a ``ChatCompletion`` or ``Completion`` body, Anthropic's
``MessageBatchIndividualResponse`` around a ``Message``; tests validate them with both
SDKs' own types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nightshift.batch.openai import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from nightshift.batch.reasoning import (
    chat_message_reasoning,
    response_reasoning_items,
    thinking_blocks,
    thinking_tokens,
)
from nightshift.batch.results import Answer, choices, dumps, request_ids
from nightshift.batch.vectors import Vector, as_base64, placeholder, spliced

# What OpenAI writes for a text model: nothing spent on reasoning, audio or predictions.
COMPLETION_DETAILS = {
    "reasoning_tokens": 0,
    "audio_tokens": 0,
    "accepted_prediction_tokens": 0,
    "rejected_prediction_tokens": 0,
}


@dataclass(frozen=True)
class Context:
    """What every line of one batch shares: its digest (the ids), ``created``, endpoint."""

    batch_key: str
    created: int
    endpoint: str  # CHAT, COMPLETIONS or "anthropic"


def openai_text(
    ctx: Context, custom_id: str | None, line: int, model: str | None, answer: Answer
) -> str:
    """``openai_line`` as the line written, embeddings in their text (``batch.vectors``)."""
    text = dumps(openai_line(ctx, custom_id, line, model, answer))
    if ctx.endpoint != EMBEDDINGS or not answer.ok:
        return text
    vectors = answer.row.get("embeddings") or [answer.row["embedding"]]
    return spliced(text, vectors)


def openai_line(
    ctx: Context, custom_id: str | None, line: int, model: str | None, answer: Answer
) -> dict:
    ids = request_ids(ctx.batch_key, custom_id, line)
    out: dict[str, Any] = {"id": ids["line"], "custom_id": custom_id}
    if answer.ok:
        made = BODIES.get(ctx.endpoint, _openai_body)
        body = made(ctx, ids["body"], model, answer.row, answer.echo)
        out |= {"response": {"status_code": 200, "request_id": ids["request"], "body": body}}
        return out | {"error": None}
    if answer.status == 400:
        param = answer.param
        if param == "messages" and ctx.endpoint != CHAT:
            param = "prompt" if ctx.endpoint == COMPLETIONS else "input"
        error = {
            "message": answer.message,
            "type": "invalid_request_error",
            "param": param,
            "code": answer.code,
        }
        response = {"status_code": 400, "request_id": ids["request"], "body": {"error": error}}
        return out | {"response": response, "error": None}
    return out | {"response": None, "error": {"code": answer.code, "message": answer.message}}


def _openai_body(
    ctx: Context, digest: str, model: str | None, row: dict[str, Any], echo: dict[str, Any]
) -> dict:
    chat = ctx.endpoint == CHAT
    made = [(_chat_choice if chat else _text_choice)(i, c) for i, c in enumerate(choices(row))]
    prompt, output = row["prompt_tokens"], row["output_tokens"]
    return {
        "id": f"chatcmpl-{digest}" if chat else f"cmpl-{digest}",
        "object": "chat.completion" if chat else "text_completion",
        "created": ctx.created,
        "model": model,
        "choices": made,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {
                "cached_tokens": row["cached_tokens"] or 0,
                "audio_tokens": 0,
            },
            "completion_tokens_details": _thought(row),
        },
        "system_fingerprint": None,
    }


def _embedding_body(
    ctx: Context, digest: str, model: str | None, row: dict[str, Any], echo: dict[str, Any]
) -> dict:
    """OpenAI's ``CreateEmbeddingResponse``: one embedding, as floats or, as OpenAI
    encodes them, base64 of little-endian float32."""
    vectors = row.get("embeddings") or [row["embedding"]]  # a line of several inputs
    if echo.get("encoding_format") == "base64":
        vectors = [None if v is None else as_base64(v) for v in vectors]
    else:  # a Vector's text goes in after the line is dumped (openai_text)
        vectors = [placeholder(i) if isinstance(v, Vector) else v for i, v in enumerate(vectors)]
    prompt = row["prompt_tokens"]
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def _response_body(
    ctx: Context, digest: str, model: str | None, row: dict[str, Any], echo: dict[str, Any]
) -> dict:
    """OpenAI's ``Response`` object for a Responses API request: one message of
    ``output_text``; ``incomplete`` where max_output_tokens cut it short."""
    first = choices(row)[0]
    cut = first.get("finish_reason") == "length"
    return {
        "id": f"resp_{digest}",
        "object": "response",
        "created_at": ctx.created,
        "status": "incomplete" if cut else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "model": model,
        "output": [
            *response_reasoning_items(digest, first),
            _response_message(digest, first["text"], cut),
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
        "store": False,
        "temperature": _or(echo.get("temperature"), 1.0),
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": _or(echo.get("top_p"), 1.0),
        "truncation": "disabled",
        "usage": _response_usage(row),
        "user": None,
        "metadata": echo.get("metadata") or {},
    }


def _response_message(digest: str, text: str, cut: bool) -> dict[str, Any]:
    """The Response's one output item: the assistant's message of ``output_text``."""
    return {
        "id": f"msg_{digest}",
        "type": "message",
        "status": "incomplete" if cut else "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _response_usage(row: dict[str, Any]) -> dict[str, Any]:
    prompt, output, cached = row["prompt_tokens"], row["output_tokens"], row["cached_tokens"] or 0
    return {
        "input_tokens": prompt,
        # no cache writes are billed apart here: vLLM's prefix cache just keeps blocks
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": thinking_tokens(choices(row))},
        "total_tokens": prompt + output,
    }


def _thought(row: dict[str, Any]) -> dict[str, int]:
    """``completion_tokens_details``: a reasoning model's thinking tokens, none else."""
    return COMPLETION_DETAILS | {"reasoning_tokens": thinking_tokens(choices(row))}


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


BODIES = {EMBEDDINGS: _embedding_body, RESPONSES: _response_body}


def _finish(choice: dict[str, Any]) -> str:
    return "length" if choice.get("finish_reason") == "length" else "stop"


def _chat_choice(index: int, choice: dict[str, Any]) -> dict[str, Any]:
    logprobs = None
    if choice.get("logprobs") is not None:
        content = [
            {
                "token": t["token"],
                "logprob": t["logprob"],
                "bytes": t.get("bytes"),
                "top_logprobs": [
                    {"token": x["token"], "logprob": x["logprob"], "bytes": x.get("bytes")}
                    for x in t.get("top_logprobs") or []
                ],
            }
            for t in choice["logprobs"]
        ]
        logprobs = {"content": content, "refusal": None}
    message = {"role": "assistant", "content": choice["text"], "refusal": None, "annotations": []}
    message |= chat_message_reasoning(choice)  # a reasoning model's thinking, apart
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": _finish(choice),
    }


def _text_choice(index: int, choice: dict[str, Any]) -> dict[str, Any]:
    logprobs = None
    if choice.get("logprobs") is not None:
        tokens = choice["logprobs"]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t["token"])
        logprobs = {
            "tokens": [t["token"] for t in tokens],
            "token_logprobs": [t["logprob"] for t in tokens],
            "top_logprobs": [
                {x["token"]: x["logprob"] for x in t.get("top_logprobs") or []} for t in tokens
            ],
            "text_offset": offsets,
        }
    return {
        "text": choice["text"],
        "index": index,
        "logprobs": logprobs,
        "finish_reason": _finish(choice),
    }


def anthropic_line(
    ctx: Context, custom_id: str | None, line: int, model: str | None, answer: Answer
) -> dict:
    ids = request_ids(ctx.batch_key, custom_id, line)
    # The SDK's custom_id is a string: "" for a line without a usable one (never a real
    # id, empty ones are refused); its message names the line.
    custom_id = custom_id or ""
    if answer.code == "batch_expired":  # its batch's window ended before it ran
        return {"custom_id": custom_id, "result": {"type": "expired"}}
    if not answer.ok:
        error = _anthropic_error(answer, ids["request"])
        return {"custom_id": custom_id, "result": {"type": "errored", "error": error}}
    message = _anthropic_message(ids["body"], model, answer.row)
    return {"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}


def _anthropic_error(answer: Answer, request_id: str) -> dict[str, Any]:
    """An errored request's ``ErrorResponse``: a 400 is the request's own fault."""
    kind = "invalid_request_error" if answer.status == 400 else "api_error"
    return {
        "type": "error",
        "error": {"type": kind, "message": answer.message},
        "request_id": request_id,
    }


def _anthropic_message(digest: str, model: str | None, row: dict[str, Any]) -> dict[str, Any]:
    """A succeeded request's ``Message``: one text block. Anthropic counts cached input
    apart from ``input_tokens``, so the cached tokens come off the prompt's."""
    first = choices(row)[0]
    stop_reason, stop_sequence = _stop(first)
    cached = row["cached_tokens"] or 0
    return {
        "id": f"msg_{digest}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [*thinking_blocks(first), {"type": "text", "text": first["text"]}],
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {
            "input_tokens": row["prompt_tokens"] - cached,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "output_tokens": row["output_tokens"],
            "service_tier": "batch",
        },
    }


def _stop(choice: dict[str, Any]) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for how the choice ended."""
    if choice.get("finish_reason") == "length":
        return "max_tokens", None
    if choice.get("stop_sequence"):
        return "stop_sequence", choice["stop_sequence"]
    return "end_turn", None
