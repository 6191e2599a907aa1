"""OpenAI ``/v1/responses`` batch lines: the Responses API's text requests as conversations.

``input`` (a string, or message items whose content is a string or ``input_text`` /
``output_text`` parts) and ``instructions`` (the system turn) become the record's
messages; ``max_output_tokens``, ``temperature``, ``top_p`` and ``text.format``
(``json_schema``, ``json_object``) its sampling. What the answer's ``response`` object
repeats of the request (instructions, metadata, the settings) travels in the records'
echo column. ``reasoning.effort`` bounds a reasoning model's thinking (``batch.reasoning``;
no summaries: the reasoning item holds the whole thinking). What nightshift cannot honour
(tools, ``previous_response_id``, ``background``, streaming, images, files...) is a bad
line naming the parameter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nightshift.batch.reasoning import effort_budget
from nightshift.batch.records import BadRequest, Request, validated

# Accepted and without effect on the answer (a stateless batch keeps nothing).
IGNORED = {"model", "user", "store", "service_tier", "prompt_cache_key", "safety_identifier",
           "truncation", "parallel_tool_calls", "include"}  # fmt: skip
NEUTRAL: tuple[Any, ...] = (None, False, [], {}, "auto", "disabled", "none")
WHY_NOT = {
    "tools": "no tools: nightshift generates text",
    "tool_choice": "no tools: nightshift generates text",
    "previous_response_id": "a batch is stateless: put the conversation in input",
    "conversation": "a batch is stateless: put the conversation in input",
    "background": "a batch line runs in its batch",
    "stream": "a batch is not streamed",
    "prompt": "no stored prompts: send the text in input and instructions",
}


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class Reasoning(BaseModel):
    """``reasoning``: its effort becomes the thinking budget; no summary is written."""

    model_config = ConfigDict(extra="forbid", strict=True)

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto"] | None = None  # auto: none is the provider's choice too


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: TextConfig | None = None
    metadata: dict[str, str] | None = None
    reasoning: Reasoning | None = None  # a reasoning model's budget (batch.reasoning)


def responses_request(data: dict[str, Any]) -> Request:
    body: ResponsesBody = validated(ResponsesBody, data, "")
    _refuse_unsupported(body)
    turns = [{"role": "system", "content": body.instructions}] if body.instructions else []
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    turns += [_turn(item, i) for i, item in enumerate(items)]
    if not any(t["role"] != "system" for t in turns):
        raise BadRequest("input: at least one user or assistant message is needed", param="input")
    fmt = body.text.format if body.text and body.text.format else TextFormat(type="text")
    sampling = {
        "max_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        **_format(fmt),
    }
    effort = body.reasoning.effort if body.reasoning else None
    sampling |= effort_budget(effort, body.max_output_tokens, "reasoning.effort")
    echo = {
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)},
        "metadata": body.metadata or {},
        "reasoning": {"effort": effort, "summary": None},
    }
    return Request(model=body.model, sampling=sampling, messages=turns, echo=echo)


def _refuse_unsupported(body: ResponsesBody) -> None:
    for key, value in (body.model_extra or {}).items():
        if key in IGNORED or any(value == n and type(value) is type(n) for n in NEUTRAL):
            continue
        why = WHY_NOT.get(key, "nightshift batches do not support it")
        raise BadRequest(f"{key} is not supported: {why}", "unsupported_parameter", key)


def _format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise BadRequest("text.format.schema is required with type json_schema",
                             param="text.format.schema")  # fmt: skip
        return {"json_schema": fmt.json_schema}
    return {}


def _turn(item: dict[str, Any], index: int) -> dict[str, str]:
    """One message item: ``{role, content}`` (``type: message`` optional)."""
    where = f"input[{index}]"
    kind = item.get("type", "message")
    if kind != "message":
        raise BadRequest(
            f"{where}: items of type {kind!r} are not supported (messages only: no tool "
            "calls or their outputs)",
            "unsupported_parameter",
            where,
        )
    role, content = item.get("role"), item.get("content")
    extra = set(item) - {"type", "role", "content", "id", "status"}
    if extra:
        key = sorted(extra)[0]
        raise BadRequest(
            f"{where}.{key} is not supported", "unsupported_parameter", f"{where}.{key}"
        )
    if role not in ("user", "assistant", "system", "developer"):
        raise BadRequest(f"{where}.role must be user, assistant, system or developer",
                         param=f"{where}.role")  # fmt: skip
    if isinstance(content, list):
        content = "\n".join(_part(p, f"{where}.content[{i}]") for i, p in enumerate(content))
    if not isinstance(content, str):
        raise BadRequest(f"{where}.content must be text or text parts", param=f"{where}.content")
    return {"role": "system" if role == "developer" else role, "content": content}


def _part(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
        raise BadRequest(
            f"{where}: content of type {kind!r} is not supported (text only: no images, "
            "audio or files)",
            "unsupported_parameter",
            where,
        )
    extra = set(part) - {"type", "text", "annotations", "logprobs"}
    if extra:
        key = sorted(extra)[0]
        raise BadRequest(
            f"{where}.{key} is not supported", "unsupported_parameter", f"{where}.{key}"
        )
    return part["text"]
