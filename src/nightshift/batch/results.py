"""A finished job's answers as the provider's own output lines.

Read only through the commit markers and the plan (``io.outputs.committed_files``, what
``nightshift jobs export`` and ``jobs status`` read), never a listing. Every line's ids
are derived from the input's digest and the custom_id, and ``created`` is when the batch
was converted, so a rerun of a finished batch writes the same bytes.

OpenAI: answers go to OUTPUT as ``{id, custom_id, response{status_code: 200, request_id,
body}, error: null}`` with a ``chat.completion`` or ``text_completion`` body; a bad
request (a bad line, a prompt over the context, a bad sampling value) goes to ERRORS with
``status_code`` 400 and ``body.error{message, type, param, code}``; anything else
(an engine failure) with ``response: null`` and ``error{code, message}``.
Anthropic: every request's ``MessageBatchIndividualResponse`` goes to OUTPUT, as the
provider's results stream holds them: ``succeeded`` with a Message, or ``errored``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from nightshift.batch.records import BadLine

# reject_kind -> (code, param) of the 400 it becomes
REJECT_CODES = {
    "over_length": ("context_length_exceeded", "messages"),
    "bad_sampling": ("invalid_value", None),
}
NOT_RUN = "not run: its shard failed; rerun the same command to retry it"


@dataclass
class Answer:
    """One record's outcome in the job: ok (``row`` from results), or an error."""

    ok: bool
    row: dict[str, Any] = field(default_factory=dict)
    status: int = 400  # for an error: 400 a bad request, 500 anything else
    code: str = "invalid_request"
    message: str = ""
    param: str | None = None
    echo: dict[str, Any] = field(default_factory=dict)  # what the body repeats (ECHO_COLUMN)


@dataclass
class Written:
    lines: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens: a reasoning model's thinking


def request_ids(batch_key: str, custom_id: str | None, line: int) -> dict[str, str]:
    digest = hashlib.sha256(f"{batch_key}\0{custom_id}\0{line}".encode()).hexdigest()[:24]
    return {"line": f"batch_req_{digest}", "request": f"req_{digest}", "body": digest}


_PARSED = "\0choices"  # a row's choices once read: a line's shape reads them up to 3 times


def choices(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The answer's choices: the run's ``detail`` (n, logprobs), or its one text. Read
    once per row (kept in it under a key no column has), not once per use."""
    made = row.get(_PARSED)
    if made is None:
        made = row[_PARSED] = _choices(row)
    return made


def _choices(row: dict[str, Any]) -> list[dict[str, Any]]:
    detail = row.get("detail")
    if detail:
        return json.loads(detail)["choices"]
    return [
        {
            "text": row["text"],
            "finish_reason": row["finish_reason"],
            "stop_sequence": None,
            "output_tokens": row["output_tokens"],
            "logprobs": None,
            "reasoning": row.get("reasoning"),  # a reasoning model's thinking (model.reasoning)
            "reasoning_tokens": row.get("reasoning_tokens"),
        }
    ]


# Line separators other than "\n" that JSON leaves raw: str.splitlines (and so many a
# reader of JSONL) would cut a line at them, so they go out escaped (valid JSON still).
_SEPARATORS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


_ENCODER = json.JSONEncoder(ensure_ascii=False)  # json.dumps makes one a call: 10% of a line


def dumps(line: dict[str, Any]) -> str:
    text = _ENCODER.encode(line)
    if "\u2028" in text or "\u2029" in text or "\x85" in text:  # rare: a scan, not a rewrite
        text = text.translate(_SEPARATORS)
    return text + "\n"


def bad_line_answer(bad: BadLine) -> Answer:
    return Answer(False, code=bad.code, message=bad.message, param=bad.param)
