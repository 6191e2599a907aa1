"""OpenAI batch input lines: ``{custom_id, method, url, body}``, one endpoint per file.

``/v1/chat/completions`` bodies become conversations (string content, or text parts
joined; ``developer`` turns are system turns), ``/v1/completions`` bodies raw prompts.
Each body's sampling becomes the record's own: ``max_tokens`` or
``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``n``,
``response_format`` (json_schema, json_object), ``logprobs``/``top_logprobs``. Anything
nightshift cannot honour (``stream: true``, tools, images, penalties, a message's
``name``, ``audio`` or ``refusal``, keys of a text part beside ``type`` and ``text``...)
is a bad line naming the parameter, never silently dropped. The body keys in ``IGNORED``
are accepted because they cannot change the answer (bookkeeping such as ``user``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from nightshift.batch.reasoning import effort_budget
from nightshift.batch.records import INPUT_MARK, BadRequest, Request, validated
from nightshift.batch.responses import responses_request

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)
# Accepted and without effect on the answer.
IGNORED = {
    "model",
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
    "stream_options",
}
# Values that ask for nothing, so a key holding one is as good as absent.
NEUTRAL: tuple[Any, ...] = (None, False, 0, 0.0, [], {}, "none", "text", ["text"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(default=None, ge=1, le=128)
    stream: bool | None = None


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatMessage(BaseModel):
    """A turn as the chat template renders it: a role and text, nothing else. Every other
    field of OpenAI's message (``name``, ``audio``, ``refusal``, ``tool_calls``,
    ``function_call``...) lands in ``model_extra`` and is refused by ``_turn`` unless it
    asks for nothing; none is ignored, as none could be honoured."""

    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_effort: str | None = None  # a reasoning model's budget (batch.reasoning)


class CompletionBody(_Body):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)


MAX_INPUTS = 2048  # texts in one /v1/embeddings request, as OpenAI allows


class EmbeddingBody(BaseModel):
    """A ``/v1/embeddings`` body: one text to embed (``input``), its encoding and size."""

    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)


class BatchLine(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


class OpenAIParser:
    """Parses lines of one file; the first valid line's ``url`` is the file's endpoint."""

    format = "openai"

    def __init__(self) -> None:
        self.endpoint: str | None = None
        self.endpoint_line: int | None = None
        self.dimensions: tuple[int | None, int] | None = None  # embeddings: (size, line)
        self._asked: tuple[int | None, int] | None = None  # the last line's, until it runs

    def accepted(self) -> None:
        """The line just parsed runs (``records.convert``: its model is served too): its
        vector size is the file's, never that of a line refused after parsing."""
        if self.dimensions is None:
            self.dimensions = self._asked

    def custom_id(self, line: dict[str, Any]) -> Any:
        return line.get("custom_id")

    def parse(self, line: dict[str, Any], number: int) -> Request:
        batch = validated(BatchLine, line, "")
        if batch.method.upper() != "POST":
            raise BadRequest(f"method {batch.method!r} is not supported; use POST", param="method")
        if batch.url not in ENDPOINTS:
            raise BadRequest(
                f"url {batch.url!r} is not supported; use {', '.join(ENDPOINTS)}",
                "unsupported_url",
                "url",
            )
        if self.endpoint is not None and batch.url != self.endpoint:
            raise BadRequest(
                f"url {batch.url!r} differs from this batch's endpoint {self.endpoint!r} "
                f"(line {self.endpoint_line}); a batch file holds requests for one endpoint",
                "mismatched_url",
                "url",
            )
        if batch.url == EMBEDDINGS:
            if INPUT_MARK in batch.custom_id:  # it marks one input of a line's several
                raise BadRequest("custom_id: a NUL character is not allowed", param="custom_id")
            request = self._embedding(batch.body, number)
        elif batch.url == RESPONSES:
            request = responses_request(batch.body)
        else:
            request = _chat(batch.body) if batch.url == CHAT else _completion(batch.body)
        if self.endpoint is None:
            self.endpoint, self.endpoint_line = batch.url, number
        return request

    def _embedding(self, data: dict[str, Any], number: int) -> Request:
        """One text to embed; every line of a file asks for one size (the job's)."""
        body: EmbeddingBody = validated(EmbeddingBody, data, "")
        for key, value in (body.model_extra or {}).items():
            if key != "user" and value is not None:
                raise BadRequest(
                    f"{key} is not supported by nightshift batches", "unsupported_parameter", key
                )
        text = body.input
        if isinstance(text, list):
            if not all(isinstance(t, str) for t in text):
                raise BadRequest(
                    "input: token ids are not supported; send the text",
                    "unsupported_parameter",
                    "input",
                )
            if not text:
                raise BadRequest("input: give at least one text", param="input")
            if len(text) > MAX_INPUTS:
                raise BadRequest(f"input: at most {MAX_INPUTS} texts per request", param="input")
        if self.dimensions is None:
            self._asked = (body.dimensions, number)
        elif body.dimensions != self.dimensions[0]:
            raise BadRequest(
                f"dimensions {body.dimensions} differs from this batch's "
                f"{self.dimensions[0]} (line {self.dimensions[1]}); one size per batch file",
                param="dimensions",
            )
        echo = {"encoding_format": body.encoding_format} if body.encoding_format else None
        if isinstance(text, str):
            return Request(model=body.model, sampling={}, prompt=text, echo=echo)
        return Request(model=body.model, sampling={}, prompt=text[0], echo=echo, inputs=text)


def _refuse_unsupported(body: _Body) -> None:
    if body.stream:
        raise BadRequest(
            "stream: true is not supported in a batch", "unsupported_parameter", "stream"
        )
    for key, value in (body.model_extra or {}).items():
        if key not in IGNORED and not any(value == n and type(value) is type(n) for n in NEUTRAL):
            raise BadRequest(
                f"{key} is not supported by nightshift batches",
                "unsupported_parameter",
                key,
            )


def _common(body: _Body, max_tokens: int | None) -> dict[str, Any]:
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    return {
        "max_tokens": max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": stop or None,
        "n": body.n,
    }


def _chat(data: dict[str, Any]) -> Request:
    body: ChatBody = validated(ChatBody, data, "")
    _refuse_unsupported(body)
    if body.top_logprobs and not body.logprobs:
        raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
    limit = body.max_completion_tokens or body.max_tokens
    sampling = _common(body, limit)
    sampling |= effort_budget(body.reasoning_effort, limit, "reasoning_effort")
    sampling |= _response_format(body.response_format)
    if body.logprobs:
        sampling |= {"logprobs": True, "top_logprobs": body.top_logprobs or 0}
    messages = [_turn(m, i) for i, m in enumerate(body.messages)]
    return Request(model=body.model, sampling=sampling, messages=messages)


def _response_format(fmt: ResponseFormat | None) -> dict[str, Any]:
    if fmt is None or fmt.type == "text":
        return {}
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.json_schema is None:
        raise BadRequest(
            "response_format.json_schema is required with type json_schema",
            param="response_format.json_schema",
        )
    return {"json_schema": fmt.json_schema.json_schema}


# Why a message field is refused, by field; any other: no tools, audio or refusals.
WHY_NOT = {
    "name": "the chat template renders a role and its text, with no place for a "
    "participant's name (leave it out, or put the name in the content)",
}


def _turn(message: ChatMessage, index: int) -> dict[str, str]:
    where = f"messages[{index}]"
    for key, value in (message.model_extra or {}).items():
        if value not in (None, [], ""):
            why = WHY_NOT.get(key, "no tools, audio or refusals")
            raise BadRequest(
                f"{where}.{key} is not supported: {why}",
                "unsupported_parameter",
                f"{where}.{key}",
            )
    role = "system" if message.role == "developer" else message.role
    content = message.content
    if content is None:
        raise BadRequest(f"{where}.content is required", param=f"{where}.content")
    if isinstance(content, list):
        content = "\n".join(
            _text_part(part, f"{where}.content[{i}]") for i, part in enumerate(content)
        )
    return {"role": role, "content": content}


def _text_part(part: dict[str, Any], where: str) -> str:
    kind = part.get("type")
    if kind != "text" or not isinstance(part.get("text"), str):
        raise BadRequest(
            f"{where}: content parts of type {kind!r} are not supported (text only: no "
            "images, audio or files)",
            "unsupported_parameter",
            where,
        )
    # A text part is {type, text}; any other key would be dropped, so it is refused.
    for key, value in part.items():
        if key not in ("type", "text") and value is not None:
            raise BadRequest(
                f"{where}.{key} is not supported (a text part holds type and text)",
                "unsupported_parameter",
                f"{where}.{key}",
            )
    return part["text"]


def _completion(data: dict[str, Any]) -> Request:
    body: CompletionBody = validated(CompletionBody, data, "")
    _refuse_unsupported(body)
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise BadRequest(
                "prompt: one prompt per request (a list of several is not supported)",
                "unsupported_parameter",
                "prompt",
            )
        prompt = prompt[0]
    sampling = _common(body, body.max_tokens)
    if body.logprobs is not None:
        sampling |= {"logprobs": True, "top_logprobs": body.logprobs}
    return Request(model=body.model, sampling=sampling, prompt=prompt)
