"""Provider batch lines for a reasoning model (issue 42), through ``batch run`` on the fake
engine: OpenAI chat's ``reasoning_effort``, the Responses API's ``reasoning.effort`` and
Anthropic's ``thinking.budget_tokens`` bound each answer's thinking, and each answer
carries its thinking in its provider's own shape, read back with the official SDK types."""

from __future__ import annotations

import json

from anthropic.types.messages import MessageBatchIndividualResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from nightshift.batch.run import run_batch

from .test_reasoning import thinker  # noqa: F401 (a fixture)


def run(model, tmp_path, name: str, lines: list[dict]) -> tuple[dict, dict]:
    source, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines))
    run_batch(str(source), str(out), model=str(model), served_names=["m"],
              overrides=["run.engine=fake"])  # fmt: skip
    answers = {x["custom_id"]: x for x in map(json.loads, out.read_text().splitlines())}
    errors = tmp_path / f"{name}.out.errors.jsonl"
    bad = [json.loads(x) for x in errors.read_text().splitlines()] if errors.exists() else []
    return answers, {x["custom_id"]: x for x in bad}


def chat(custom_id: str, **body) -> dict:
    messages = [{"role": "user", "content": f"Where is my order {custom_id}?"}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": messages, **body}}  # fmt: skip


def test_chat_lines_carry_reasoning_content_within_their_effort(thinker, tmp_path):  # noqa: F811
    lines = [
        chat("low", reasoning_effort="low", max_completion_tokens=60),
        chat("off", reasoning_effort="none", max_completion_tokens=8),
        chat("typo", reasoning_effort="extreme"),
    ]
    repeat = {"reasoning_effort": "low", "max_completion_tokens": 60, "temperature": 0}
    lines += [{**chat(name, **repeat), "body": chat("same", **repeat)["body"]} for name in "ab"]
    answers, errors = run(thinker, tmp_path, "chat", lines)
    a, b = (ChatCompletion.model_validate(answers[k]["response"]["body"]) for k in "ab")
    # one answer, two lines (a dedup copy): the same output and thinking tokens on each
    assert a.usage.completion_tokens == b.usage.completion_tokens
    assert a.usage.completion_tokens_details == b.usage.completion_tokens_details
    assert a.usage.completion_tokens_details.reasoning_tokens > 0
    low = ChatCompletion.model_validate(answers["low"]["response"]["body"])
    message = low.choices[0].message
    thought = message.reasoning_content  # vLLM's field: an extra the SDK keeps
    assert thought and thought.startswith("r") and thought not in message.content
    spent = low.usage.completion_tokens_details.reasoning_tokens
    assert 0 < spent <= 58 and low.usage.completion_tokens <= 60
    off = ChatCompletion.model_validate(answers["off"]["response"]["body"])
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    error = errors["typo"]["response"]["body"]["error"]
    assert error["param"] == "reasoning_effort" and "extreme" in error["message"]


def test_responses_lines_answer_with_a_reasoning_item_first(thinker, tmp_path):  # noqa: F811
    body = {"model": "m", "input": "Refund me", "max_output_tokens": 40}
    lines = [
        {"custom_id": "r", "method": "POST", "url": "/v1/responses",
         "body": {**body, "reasoning": {"effort": "minimal"}}},
        {"custom_id": "summary", "method": "POST", "url": "/v1/responses",
         "body": {**body, "reasoning": {"effort": "low", "summary": "detailed"}}},
    ]  # fmt: skip
    answers, errors = run(thinker, tmp_path, "responses", lines)
    response = Response.model_validate(answers["r"]["response"]["body"])
    item, message = response.output
    assert item.type == "reasoning" and item.content[0].type == "reasoning_text"
    assert item.content[0].text.startswith("r") and message.type == "message"
    assert response.output_text and item.content[0].text not in response.output_text
    assert response.reasoning.effort == "minimal"
    assert 0 < response.usage.output_tokens_details.reasoning_tokens <= 38
    assert errors["summary"]["response"]["body"]["error"]["param"] == "reasoning.summary"


def test_anthropic_lines_answer_with_a_thinking_block_within_the_budget(thinker, tmp_path):  # noqa: F811
    params = {"model": "m", "max_tokens": 40, "messages": [{"role": "user", "content": "Hi"}]}
    lines = [
        {"custom_id": "think", "params": {**params, "thinking": {"type": "enabled",
                                                                 "budget_tokens": 5}}},
        {"custom_id": "over", "params": {**params, "thinking": {"type": "enabled",
                                                                "budget_tokens": 40}}},
    ]  # fmt: skip
    answers, _ = run(thinker, tmp_path, "anthropic", lines)
    ok = MessageBatchIndividualResponse.model_validate(answers["think"]).result
    thinking, text = ok.message.content
    assert thinking.type == "thinking" and text.type == "text"
    assert 0 < len(thinking.thinking.split()) <= 5 and thinking.thinking not in text.text
    assert ok.message.usage.output_tokens <= 40
    over = MessageBatchIndividualResponse.model_validate(answers["over"]).result
    assert over.type == "errored" and "budget_tokens" in over.error.error.message


def test_reasoning_settings_for_a_model_that_does_not_reason_are_refused(models, tmp_path):
    lines = [chat("effort", reasoning_effort="high"), chat("none", reasoning_effort="none")]
    answers, errors = run(models["chat"], tmp_path, "plain", lines)
    assert "model.reasoning" in errors["effort"]["response"]["body"]["error"]["message"]
    body = ChatCompletion.model_validate(answers["none"]["response"]["body"])
    assert body.choices[0].message.model_extra.get("reasoning_content") is None


def test_batch_serve_honours_reasoning_for_both_official_clients(serve, thinker):  # noqa: F811
    from .batchserver import (
        FAKE,
        anthropic_request,
        chat_line,
        finished,
        openai_batch,
        output_lines,
        wait_for,
    )

    server = serve(*FAKE, model=thinker)
    client = server.openai()
    lines = [chat_line("c", "Where is my order?", reasoning_effort="low", max_tokens=40)]
    done = finished(client, openai_batch(client, lines).id)
    assert done.status == "completed", done
    assert done.usage.output_tokens_details.reasoning_tokens > 0  # the Batch object's own
    [line] = output_lines(client, done.output_file_id)
    body = ChatCompletion.model_validate(line["response"]["body"])
    assert body.choices[0].message.reasoning_content
    assert 0 < body.usage.completion_tokens_details.reasoning_tokens <= 38
    messages = server.anthropic().messages.batches
    thinking = {"type": "enabled", "budget_tokens": 5}
    batch = messages.create(
        requests=[anthropic_request("a", "Hi", max_tokens=30, thinking=thinking)]
    )
    wait_for(lambda: messages.retrieve(batch.id), lambda b: b.processing_status == "ended")
    [result] = list(messages.results(batch.id))
    assert isinstance(result, MessageBatchIndividualResponse)
    block, text = result.result.message.content
    assert block.type == "thinking" and len(block.thinking.split()) <= 5 and text.type == "text"
