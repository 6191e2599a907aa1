"""Provider batch files without an engine: lines into records (the answers' shapes are
in ``test_batch_answers``), and output files in input order."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from nightshift.batch.anthropic import AnthropicParser
from nightshift.batch.openai import CHAT, COMPLETIONS, OpenAIParser
from nightshift.batch.output import outcomes, write_outputs
from nightshift.batch.records import convert
from nightshift.batch.results import Answer

from .batchlines import CTX, ok_row

USER = [{"role": "user", "content": "hi"}]


def chat(custom_id, body=None, url=CHAT, **line):
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": url,
        "body": body or {"messages": USER},
        **line,
    }


def parse(tmp_path: Path, lines: list, parser=None, served=("tiny",)):
    """Convert ``lines`` (dicts, or raw text for broken ones); records and bad lines."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    out = tmp_path / "records.parquet"
    done = convert(source, parser or OpenAIParser(), list(served), out)
    rows = pq.read_table(out).to_pylist() if done.records else []
    return rows, {b.line: b for b in done.bad}


def test_openai_chat_lines_become_conversations_with_their_own_sampling(tmp_path):
    body = {
        "model": "tiny",
        "messages": [
            {"role": "developer", "content": "Answer in JSON."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "{x} {{ y }}"},
                    {"type": "text", "text": "ok"},
                ],
            },
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": "go"},
        ],
        "max_completion_tokens": 7,
        "temperature": 0,
        "top_p": 0.5,
        "seed": 3,
        "stop": "END",
        "n": 2,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "object"}},
        },
        "logprobs": True,
        "top_logprobs": 2,
        "user": "someone",
        "presence_penalty": 0,
    }
    rows, bad = parse(tmp_path, [chat("a", body), chat("b", {"messages": USER, "max_tokens": 4})])
    assert not bad
    a, b = rows
    assert (a["custom_id"], a["line"], a["model"]) == ("a", 1, "tiny")
    assert a["messages"][0] == {"role": "system", "content": "Answer in JSON."}
    assert a["messages"][1]["content"] == "{x} {{ y }}\nok"  # text stays text
    assert json.loads(a["sampling"]) == {
        "max_tokens": 7,
        "temperature": 0.0,
        "top_p": 0.5,
        "seed": 3,
        "stop": ["END"],
        "n": 2,
        "json_schema": {"type": "object"},
        "logprobs": True,
        "top_logprobs": 2,
    }
    assert json.loads(b["sampling"]) == {"max_tokens": 4}  # unset keys: the job's values
    assert b["model"] == "tiny"  # no model: the served name


def test_openai_completion_lines_become_raw_prompts(tmp_path):
    body = {"prompt": ["Once {upon}"], "max_tokens": 3, "logprobs": 2, "json": None}
    rows, bad = parse(tmp_path, [chat("p", body, url=COMPLETIONS)])
    assert not bad
    assert rows[0]["prompt"] == "Once {upon}"
    assert json.loads(rows[0]["sampling"]) == {"max_tokens": 3, "logprobs": True, "top_logprobs": 2}


def test_json_object_format(tmp_path):
    rows, _ = parse(
        tmp_path, [chat("j", {"messages": USER, "response_format": {"type": "json_object"}})]
    )
    assert json.loads(rows[0]["sampling"]) == {"json_object": True}


BAD_OPENAI = [
    ("not json {", "invalid_json", None),
    ("[1, 2]", "invalid_json", None),
    ({"method": "POST", "url": CHAT, "body": {"messages": USER}}, "missing_custom_id", None),
    (chat(7), "invalid_custom_id", None),
    (chat("ok"), "duplicate_custom_id", "ok"),  # the first "ok" runs
    (chat("u1", url="/v1/audio/speech"), "unsupported_url", "u1"),
    (chat("u2", {"prompt": "x"}, url=COMPLETIONS), "mismatched_url", "u2"),
    ({**chat("m1"), "method": "GET"}, "invalid_request", "m1"),
    (chat("s1", {"messages": USER, "stream": True}), "unsupported_parameter", "s1"),
    (
        chat("t1", {"messages": USER, "tools": [{"type": "function"}]}),
        "unsupported_parameter",
        "t1",
    ),
    (chat("f1", {"messages": USER, "functions": [{"name": "f"}]}), "unsupported_parameter", "f1"),
    (chat("p1", {"messages": USER, "frequency_penalty": 0.5}), "unsupported_parameter", "p1"),
    (
        chat(
            "i1",
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}
                ]
            },
        ),
        "unsupported_parameter",
        "i1",
    ),
    (chat("r1", {"messages": [{"role": "tool", "content": "x"}]}), "invalid_request", "r1"),
    (chat("x1", {"model": "gpt-4o", "messages": USER}), "model_not_found", "x1"),
    (chat("x2", {"messages": USER, "temperature": "hot"}), "invalid_request", "x2"),
    (chat("x3", {"messages": USER, "top_logprobs": 3}), "invalid_request", "x3"),
    (chat("x4", {"messages": []}), "invalid_request", "x4"),
    (chat("x5", {"messages": USER, "n": 0}), "invalid_request", "x5"),
    ({**chat("x6"), "extra": 1}, "invalid_request", "x6"),
]


def test_every_bad_openai_line_is_named_and_the_rest_run(tmp_path):
    lines = [chat("ok")] + [line for line, _, _ in BAD_OPENAI] + [chat("last")]
    rows, bad = parse(tmp_path, lines)
    assert [r["custom_id"] for r in rows] == ["ok", "last"]
    assert sorted(bad) == list(range(2, len(BAD_OPENAI) + 2))
    for n, (_, code, custom_id) in enumerate(BAD_OPENAI, start=2):
        assert (bad[n].code, bad[n].custom_id) == (code, custom_id), bad[n]
        assert bad[n].message.startswith(f"line {n}: ")
    assert "stream" in bad[10].message and bad[11].param == "tools"
    assert "gpt-4o" in bad[16].message and "'tiny'" in bad[16].message


def test_the_model_rule_takes_any_served_name(tmp_path):
    lines = [
        chat("a", {"model": "alias", "messages": USER}),
        chat("b", {"model": "tiny", "messages": USER}),
    ]
    rows, bad = parse(tmp_path, lines, served=("tiny", "alias"))
    assert not bad and [r["model"] for r in rows] == ["alias", "tiny"]  # each echoes its own


def test_anthropic_lines(tmp_path):
    params = {
        "model": "tiny",
        "max_tokens": 9,
        "system": [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "{{ hi }}"}]}],
        "temperature": 0.2,
        "stop_sequences": ["\n\n"],
        "metadata": {"user_id": "u"},
    }
    bad_lines = [
        {"custom_id": "s", "params": {**params, "stream": True}},
        {"custom_id": "t", "params": {**params, "tools": [{"name": "x"}]}},
        {"custom_id": "k", "params": {**params, "thinking": {"type": "enabled"}}},
        {
            "custom_id": "i",
            "params": {**params, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        },
        {"custom_id": "m", "params": {**params, "model": "claude-3"}},
        {"params": params},
        "{broken",
    ]
    lines = [{"custom_id": "a", "params": params}, *bad_lines]
    rows, bad = parse(tmp_path, lines, AnthropicParser())
    assert rows[0]["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "{{ hi }}"},
    ]
    assert json.loads(rows[0]["sampling"]) == {
        "max_tokens": 9,
        "temperature": 0.2,
        "stop": ["\n\n"],
    }
    codes = [bad[n].code for n in sorted(bad)]
    # thinking without its budget_tokens: a bad value (a reasoning model honours it)
    assert bad[sorted(bad)[2]].param == "params.thinking.budget_tokens"
    assert codes == ["unsupported_parameter"] * 2 + ["invalid_request"] + [
        "unsupported_parameter",
        "model_not_found",
        "missing_custom_id",
        "invalid_json",
    ]


def test_files_are_in_input_order_with_bad_lines_where_they_stood(tmp_path):
    rows, bad = parse(tmp_path, [chat("a"), "oops", chat("b"), chat("a")])
    records = tmp_path / "records.parquet"
    items = list(outcomes(records, list(bad.values()), None))  # no job: nothing answered yet
    assert [(n, c) for n, c, _, _ in items] == [(1, "a"), (2, None), (3, "b"), (4, "a")]
    answered = [(n, c, m, Answer(True, ok_row()) if c == "b" else a) for n, c, m, a in items]
    out, err = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    done = write_outputs(CTX, "openai", iter(answered), str(out), str(err))
    assert (done.lines, done.completed, done.failed) == (4, 1, 3)
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == ["b"]
    errors = [json.loads(x) for x in err.read_text().splitlines()]
    assert [e["custom_id"] for e in errors] == ["a", None, "a"]
    assert errors[0]["error"]["code"] == "not_run"  # its shard never committed
    assert errors[1]["response"]["body"]["error"]["code"] == "invalid_json"
    assert "line 2" in errors[1]["response"]["body"]["error"]["message"]
    again = tmp_path / "again.jsonl"
    write_outputs(CTX, "openai", iter(answered), str(again), str(tmp_path / "e2.jsonl"))
    assert again.read_bytes() == out.read_bytes()  # the same answers, the same bytes


def test_an_anthropic_prefill_is_refused_not_answered_as_a_new_turn(tmp_path):
    prefill = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer"}]
    line = {"custom_id": "p", "params": {"max_tokens": 4, "messages": prefill}}
    rows, bad = parse(tmp_path, [line], AnthropicParser())
    assert not rows and bad[1].param == "params.messages[1]"
    assert "assistant turn" in bad[1].message


def test_anthropic_top_k_is_honoured(tmp_path):
    """Anthropic's top_k (vLLM has it too) becomes the record's own top_k, down to the
    engine's SamplingParams; a job without one keeps its cache scope."""
    from nightshift.engines.base import Sampling
    from nightshift.engines.vllm_outputs import ParamsCache
    from nightshift.jobs.sampling import merge_sampling, parse_record_sampling
    from nightshift.scheduling.cachescope import cache_scope

    line = {"custom_id": "k", "params": {"max_tokens": 4, "messages": USER, "top_k": 5}}
    rows, bad = parse(tmp_path, [line], AnthropicParser())
    assert not bad and json.loads(rows[0]["sampling"])["top_k"] == 5
    job = Sampling(max_tokens=8, temperature=1.0)
    merged = merge_sampling(job, parse_record_sampling(rows[0]["sampling"]))
    assert merged.top_k == 5 and ParamsCache(job).get(merged).top_k == 5
    assert "top_k" not in cache_scope({}, job)["sampling"]
    rows, bad = parse(
        tmp_path, [{**line, "params": {**line["params"], "top_k": -1}}], AnthropicParser()
    )
    assert bad[1].param == "params.top_k"
