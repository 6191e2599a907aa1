"""``/v1/responses`` batch lines through ``nightshift batch run`` (fake engine): each
answer a ``Response`` the openai SDK reads, the same conversation as a chat line gets,
and what the Responses API has beyond text generation refused per line."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from nightshift.batch.run import run_batch

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["billing", "bug"]}},
    "required": ["label"],
    "additionalProperties": False,
}


def line(custom_id: str, body: dict, url: str = "/v1/responses") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def run(models, tmp_path, name: str, items: list[dict]):
    source, out = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in items))
    fake = ["run.engine=fake"] if name != "real" else ["model.max_model_len=1024"]
    done = run_batch(str(source), str(out), model=str(models["chat"]), served_names=["demo"],
                     overrides=[*fake, "engine.extra.enforce_eager=true"])  # fmt: skip
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    errors = tmp_path / f"{name}.out.errors.jsonl"
    bad = [json.loads(x) for x in errors.read_text().splitlines()] if errors.exists() else []
    return done, {x["custom_id"]: x for x in lines}, {x["custom_id"]: x for x in bad}


def test_responses_lines_answer_as_response_objects(models, tmp_path):
    items = [
        line("plain", {"model": "demo", "input": "Hello there", "max_output_tokens": 6}),
        line("asked", {"instructions": "Be brief.", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Refund me"}]}],
            "metadata": {"ticket": "T1"}, "temperature": 0, "max_output_tokens": 8}),
        line("schema", {"input": "Classify: card declined", "text": {"format": {
            "type": "json_schema", "name": "label", "schema": SCHEMA, "strict": True}}}),
        line("cut", {"input": "Tell me a story", "max_output_tokens": 2}),
    ]  # fmt: skip
    refused = {
        "tools": {"input": "x", "tools": [{"type": "function", "name": "f"}]},
        "previous_response_id": {"input": "x", "previous_response_id": "resp_1"},
        "background": {"input": "x", "background": True},
        "stream": {"input": "x", "stream": True},
        "input[0]": {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
        "input[0].content[0]": {"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]},
    }  # fmt: skip
    items += [line(f"no-{key}", body) for key, body in refused.items()]
    done, answers, errors = run(models, tmp_path, "responses", items)
    assert (done.completed, done.failed) == (4, len(refused))
    bodies = {k: Response.model_validate(v["response"]["body"]) for k, v in answers.items()}
    asked = bodies["asked"]
    assert asked.object == "response" and asked.model == "demo"
    assert asked.instructions == "Be brief." and asked.metadata == {"ticket": "T1"}
    assert asked.output_text and asked.output[0].content[0].type == "output_text"
    usage = asked.usage
    assert usage.input_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert json.loads(bodies["schema"].output_text)["label"] in {"billing", "bug"}
    assert bodies["schema"].status == "completed" and bodies["schema"].incomplete_details is None
    assert bodies["schema"].text.format.type == "json_schema"
    assert bodies["cut"].status == "incomplete"
    assert bodies["cut"].incomplete_details.reason == "max_output_tokens"
    for key in refused:
        error = errors[f"no-{key}"]["response"]["body"]["error"]
        assert error["param"] == key and error["code"] == "unsupported_parameter", error

    # instructions and input are the conversation a chat request with them would be
    chat = line("chat", {"model": "demo", "temperature": 0, "max_tokens": 8, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Refund me"}]},
        url="/v1/chat/completions")  # fmt: skip
    _, same, _ = run(models, tmp_path, "chat", [chat])
    reply = ChatCompletion.model_validate(same["chat"]["response"]["body"])
    assert reply.choices[0].message.content == asked.output_text


@pytest.mark.engine
def test_responses_lines_on_vllm(smollm2, tmp_path):
    items = [
        line(f"r{i}", {"instructions": "Answer in one word.", "input": question,
                       "temperature": 0, "max_output_tokens": 16})
        for i, question in enumerate(["What colour is the sky?", "What is 2 plus 2?"])
    ]  # fmt: skip
    done, answers, _ = run({"chat": smollm2}, tmp_path, "real", items)
    assert (done.completed, done.failed) == (2, 0)
    for answer in answers.values():
        body = Response.model_validate(answer["response"]["body"])
        assert body.output_text.strip() and body.usage.output_tokens > 0
