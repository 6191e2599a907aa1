"""Anthropic Message Batches input lines: ``{custom_id, params{model, max_tokens,
messages, system, temperature, top_p, top_k, stop_sequences, ...}}``.

``system`` (a string or text blocks) becomes the conversation's first, system turn;
content is a string or text blocks (joined; ``cache_control`` is accepted and means
nothing here: the prefix cache serves shared prefixes anyway). ``thinking`` sets a
reasoning model's budget (``batch.reasoning``). Tools, images, documents,
``stream: true`` and a final assistant turn (a prefill: nightshift
answers in a new turn, never continues one) are bad lines naming the parameter.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nightshift.batch.reasoning import anthropic_thinking
from nightshift.batch.records import BadRequest, Request, validated

IGNORED = {"metadata", "service_tier"}


class TextBlock(BaseModel):
    """A text block. ``cache_control`` is the one field ignored on purpose: it marks a
    prefix for the provider to cache, and the prefix cache serves every shared prefix here
    without being asked, so the answer is the same. ``citations`` would be dropped from
    the prompt, so any is refused (``_text``); every other field is unknown (forbid)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class Message(BaseModel):
    # Any field beside role and content (there are none in the API) is refused.
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Params(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    thinking: dict[str, Any] | None = None  # a reasoning model's budget (batch.reasoning)


class BatchLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    custom_id: str
    params: dict[str, Any]


class AnthropicParser:
    format = "anthropic"

    def custom_id(self, line: dict[str, Any]) -> Any:
        return line.get("custom_id")

    def parse(self, line: dict[str, Any], number: int) -> Request:
        batch = validated(BatchLine, line, "")
        params: Params = validated(Params, batch.params, "params")
        if params.stream:
            raise BadRequest(
                "params.stream: true is not supported in a batch",
                "unsupported_parameter",
                "params.stream",
            )
        for key, value in (params.model_extra or {}).items():
            if key not in IGNORED and value not in (None, [], {}):
                raise BadRequest(
                    f"params.{key} is not supported by nightshift batches",
                    "unsupported_parameter",
                    f"params.{key}",
                )
        if params.messages[-1].role == "assistant":
            last = len(params.messages) - 1
            raise BadRequest(
                f"params.messages[{last}]: a final assistant turn (a prefill, to be "
                "continued) is not supported; end the conversation with a user turn",
                "unsupported_parameter",
                f"params.messages[{last}]",
            )
        turns = [_turn(m, i) for i, m in enumerate(params.messages)]
        if params.system:
            turns.insert(0, {"role": "system", "content": _text(params.system, "params.system")})
        sampling = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "stop": params.stop_sequences or None,
        }
        sampling |= anthropic_thinking(params.thinking, params.max_tokens)
        return Request(model=params.model, sampling=sampling, messages=turns)


def _turn(message: Message, index: int) -> dict[str, str]:
    where = f"params.messages[{index}].content"
    return {"role": message.role, "content": _text(message.content, where)}


def _text(content: str | list[dict[str, Any]], where: str) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for i, block in enumerate(content):
        if block.get("type") != "text":
            raise BadRequest(
                f"{where}[{i}]: blocks of type {block.get('type')!r} are not supported "
                "(text only: no images, documents, tool use or tool results)",
                "unsupported_parameter",
                f"{where}[{i}]",
            )
        text = validated(TextBlock, block, f"{where}[{i}]")
        if text.citations:
            raise BadRequest(
                f"{where}[{i}].citations is not supported (the chat template renders text "
                "only; leave them out)",
                "unsupported_parameter",
                f"{where}[{i}].citations",
            )
        parts.append(text.text)
    return "\n".join(parts)
