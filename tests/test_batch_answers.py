"""Answers into the providers' batch output lines, without an engine: each line checked
with the openai and anthropic SDKs' own types, errors in their documented shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types import Completion
from openai.types.chat import ChatCompletion

from nightshift.batch.openai import COMPLETIONS
from nightshift.batch.output import write_outputs
from nightshift.batch.results import Answer
from nightshift.batch.shapes import Context, anthropic_line, openai_line

from .batchlines import CTX, ok_row


def test_an_openai_answer_is_a_chat_completion_and_a_completion():
    line = openai_line(CTX, "a", 1, "tiny", Answer(True, ok_row()))
    assert line["error"] is None and line["response"]["status_code"] == 200
    assert line["id"].startswith("batch_req_") and line["response"]["request_id"].startswith("req_")
    body = ChatCompletion.model_validate(line["response"]["body"])
    assert body.choices[0].message.content == "hello" and body.model == "tiny"
    assert body.usage.prompt_tokens_details.cached_tokens == 16
    assert body.usage.total_tokens == 24
    text = openai_line(
        Context("abc", 1, COMPLETIONS), "a", 1, "tiny", Answer(True, ok_row(finish="length"))
    )
    completion = Completion.model_validate(text["response"]["body"])
    assert (
        completion.object == "text_completion" and completion.choices[0].finish_reason == "length"
    )


def test_n_choices_and_logprobs_come_from_the_detail_column():
    token = {
        "token": "hi",
        "logprob": -0.5,
        "bytes": [104, 105],
        "top_logprobs": [{"token": "hi", "logprob": -0.5, "bytes": [104, 105]}],
    }
    detail = {
        "choices": [
            {
                "text": "hi",
                "finish_reason": "stop",
                "stop_sequence": None,
                "output_tokens": 1,
                "logprobs": [token],
            },
            {
                "text": "yo",
                "finish_reason": "length",
                "stop_sequence": None,
                "output_tokens": 1,
                "logprobs": [token],
            },
        ]
    }
    row = ok_row(text="hi", detail=json.dumps(detail))
    body = ChatCompletion.model_validate(
        openai_line(CTX, "a", 1, "m", Answer(True, row))["response"]["body"]
    )
    assert [c.message.content for c in body.choices] == ["hi", "yo"]
    assert [c.index for c in body.choices] == [0, 1]
    assert body.choices[1].logprobs.content[0].top_logprobs[0].logprob == -0.5
    line = openai_line(Context("abc", 1, COMPLETIONS), "a", 1, "m", Answer(True, row))
    completion = Completion.model_validate(line["response"]["body"])
    assert completion.choices[0].logprobs.tokens == ["hi"]
    assert completion.choices[0].logprobs.top_logprobs == [{"hi": -0.5}]


def test_openai_error_lines():
    bad = openai_line(
        CTX,
        "a",
        3,
        None,
        Answer(False, code="context_length_exceeded", message="too long", param="messages"),
    )
    assert bad["error"] is None
    assert bad["response"]["status_code"] == 400
    assert bad["response"]["body"] == {
        "error": {
            "message": "too long",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    failed = openai_line(
        CTX, "a", 3, None, Answer(False, status=500, code="server_error", message="engine died")
    )
    assert failed["response"] is None and failed["error"] == {
        "code": "server_error",
        "message": "engine died",
    }


@pytest.mark.parametrize(
    ("detail_choice", "reason", "sequence"),
    [
        ({"finish_reason": "stop", "stop_sequence": None}, "end_turn", None),
        ({"finish_reason": "stop", "stop_sequence": "\n\n"}, "stop_sequence", "\n\n"),
        ({"finish_reason": "length", "stop_sequence": None}, "max_tokens", None),
    ],
)
def test_anthropic_lines_are_message_batch_individual_responses(detail_choice, reason, sequence):
    choice = {"text": "hi", "output_tokens": 4, "logprobs": None, **detail_choice}
    row = ok_row(detail=json.dumps({"choices": [choice]}))
    line = anthropic_line(Context("k", 1, "anthropic"), "a", 1, "tiny", Answer(True, row))
    parsed = MessageBatchIndividualResponse.model_validate(line)
    assert parsed.result.type == "succeeded"
    message = parsed.result.message
    assert (message.stop_reason, message.stop_sequence) == (reason, sequence)
    assert message.content[0].text == "hi"
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (4, 16)


def test_anthropic_errored_lines():
    for answer, kind in [
        (Answer(False, message="bad"), "invalid_request_error"),
        (Answer(False, status=500, code="server_error", message="died"), "api_error"),
    ]:
        line = anthropic_line(Context("k", 1, "anthropic"), "a", 1, None, answer)
        parsed = MessageBatchIndividualResponse.model_validate(line)
        assert parsed.result.type == "errored" and parsed.result.error.error.type == kind


def test_an_anthropic_line_without_a_usable_custom_id_still_validates():
    """The SDK's type requires a string: a line with no usable custom_id gets "" (never a
    real id: empty ones are refused), its message naming the line."""
    bad = Answer(False, code="missing_custom_id", message="line 7: no custom_id")
    line = anthropic_line(Context("k", 1, "anthropic"), None, 7, None, bad)
    parsed = MessageBatchIndividualResponse.model_validate(line)
    assert parsed.custom_id == "" and "line 7" in parsed.result.error.error.message


def test_usage_holds_the_providers_detail_fields():
    body = openai_line(CTX, "a", 1, "tiny", Answer(True, ok_row()))["response"]["body"]
    assert body["choices"][0]["message"]["annotations"] == []
    details = ChatCompletion.model_validate(body).usage.completion_tokens_details
    assert details.reasoning_tokens == 0 and details.audio_tokens == 0
    message = anthropic_line(Context("k", 1, "anthropic"), "a", 1, "t", Answer(True, ok_row()))
    usage = MessageBatchIndividualResponse.model_validate(message).result.message.usage
    assert usage.service_tier == "batch" and usage.cache_creation.ephemeral_5m_input_tokens == 0


def test_the_errors_file_is_written_before_output(tmp_path, monkeypatch):
    """OUTPUT is the sign a batch is done: once it exists, ERRORS is whole too."""
    import nightshift.batch.output as output

    seen, put = [], output.put

    def watched(path, url):
        seen.append((Path(url).name, (tmp_path / "o.jsonl").exists()))
        put(path, url)

    monkeypatch.setattr(output, "put", watched)
    lines = iter([(1, "a", "tiny", Answer(True, ok_row())), (2, None, None, Answer(False))])
    write_outputs(CTX, "openai", lines, str(tmp_path / "o.jsonl"), str(tmp_path / "e.jsonl"))
    assert seen == [("e.jsonl", False)]  # ERRORS put while OUTPUT was not there yet
    assert [
        len(f.read_text().splitlines()) for f in (tmp_path / "o.jsonl", tmp_path / "e.jsonl")
    ] == [1, 1]


def test_a_failure_writing_errors_leaves_no_output(tmp_path, monkeypatch):
    import nightshift.batch.output as output
    from nightshift.errors import StoreError

    def broken(path, url):
        raise StoreError(f"cannot write {url}: disk full")

    monkeypatch.setattr(output, "put", broken)
    lines = iter([(1, "a", "tiny", Answer(True, ok_row())), (2, None, None, Answer(False))])
    with pytest.raises(StoreError, match="e.jsonl: disk full"):
        write_outputs(CTX, "openai", lines, str(tmp_path / "o.jsonl"), str(tmp_path / "e.jsonl"))
    assert list(tmp_path.iterdir()) == []  # no OUTPUT, and no temp file beside it


def test_a_failure_reading_the_answers_is_not_called_a_failure_writing_output(tmp_path):
    def answers():
        yield (1, "a", "tiny", Answer(True, ok_row()))
        raise FileNotFoundError(2, "No such file or directory", "bucket-1-00000.arrow")

    with pytest.raises(FileNotFoundError, match="bucket-1"):
        write_outputs(
            CTX, "openai", answers(), str(tmp_path / "o.jsonl"), str(tmp_path / "e.jsonl")
        )
    assert list(tmp_path.iterdir()) == []


def test_a_row_read_for_its_choices_writes_the_same_line_every_time():
    """A line's shape reads its row's choices up to three times, parsed once and kept in
    the row: nothing of that shows in the line, and a second write is byte-identical."""
    from nightshift.batch.results import choices, dumps
    from nightshift.batch.shapes import openai_text

    detail = {"choices": [{"text": "a\u2028b", "finish_reason": "stop", "stop_sequence": None,
                           "output_tokens": 2, "logprobs": None}]}  # fmt: skip
    row = ok_row() | {"detail": json.dumps(detail)}
    first = openai_text(CTX, "a", 1, "tiny", Answer(True, row))
    assert choices(row) is choices(row) and choices(row)[0]["text"] == "a\u2028b"
    assert openai_text(CTX, "a", 1, "tiny", Answer(True, row)) == first
    assert "choices\\u0000" not in first and "\\u0000choices" not in first
    assert "\u2028" not in first and "a\\u2028b" in first  # escaped: JSONL readers split there
    body = ChatCompletion.model_validate(json.loads(first)["response"]["body"])
    assert body.choices[0].message.content == "a\u2028b"
    plain = {"k": "é \x85 \u2029"}
    assert (
        dumps(plain)
        == json.dumps(plain, ensure_ascii=False).translate(
            str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})
        )
        + "\n"
    )
