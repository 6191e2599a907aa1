"""A batch's output written from its job's answers in line order (``batch.lineorder``):
every custom_id comes back byte for byte, or its line is refused with the reason, in
every file format; and writing an embeddings batch's output never holds every vector
as Python objects (measured with tracemalloc), whatever the batch's size."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from anthropic.types.messages import MessageBatchIndividualResponse

from nightshift.batch.run import MARKER, _write_files, run_batch
from nightshift.io.objectstore import open_store

FAKE = ["run.engine=fake"]
IDS = ["req\u0000one", "req\u0000two", "req", "req\u00000", "tab\tnew\nline\u2028é"]


def write(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def openai_line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


BODIES = {
    "/v1/chat/completions": lambda i: {"messages": [{"role": "user", "content": f"hi {i}"}]},
    "/v1/completions": lambda i: {"prompt": f"Once {i}"},
    "/v1/responses": lambda i: {"input": f"Question {i}"},
}


@pytest.mark.parametrize("url", sorted(BODIES))
def test_custom_ids_come_back_byte_for_byte_in_openai_files(models, tmp_path, url):
    items = [
        openai_line(cid, url, {**BODIES[url](i), "max_tokens": 3}) for i, cid in enumerate(IDS)
    ]
    if url == "/v1/responses":
        for item in items:
            item["body"]["max_output_tokens"] = item["body"].pop("max_tokens")
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(str(source), str(out), model=str(models["chat"]), overrides=FAKE)
    assert (done.completed, done.failed) == (len(IDS), 0)
    back = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in back] == IDS  # input order, each its own answer
    assert len({x["response"]["body"]["id"] for x in back}) == len(IDS)


def test_custom_ids_come_back_byte_for_byte_in_anthropic_files(models, tmp_path):
    items = [
        {"custom_id": cid, "params": {"max_tokens": 3, "messages": [
            {"role": "user", "content": f"hello {i}"}]}}
        for i, cid in enumerate(IDS)
    ]  # fmt: skip
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    run_batch(str(source), str(out), model=str(models["chat"]), overrides=FAKE)
    back = [
        MessageBatchIndividualResponse.model_validate_json(x) for x in out.read_text().splitlines()
    ]
    assert [x.custom_id for x in back] == IDS
    assert {x.result.type for x in back} == {"succeeded"}


def test_an_embeddings_line_whose_custom_id_holds_a_nul_is_refused_naming_why(models, tmp_path):
    url = "/v1/embeddings"
    items = [openai_line(cid, url, {"input": ["a", "b"]}) for cid in ("e\u00001", "e")]
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(str(source), str(out), model=str(models["chat"]), overrides=FAKE)
    assert (done.completed, done.failed) == (1, 1)
    assert [json.loads(x)["custom_id"] for x in out.read_text().splitlines()] == ["e"]
    refused = json.loads((tmp_path / "out.errors.jsonl").read_text())
    assert refused["custom_id"] is None or refused["custom_id"] == "e\u00001"
    assert "NUL" in refused["response"]["body"]["error"]["message"]


def test_writing_an_embeddings_output_holds_a_bounded_part_of_its_vectors(models, tmp_path):
    lines, texts = 40, 100  # 4,000 vectors of 128 floats
    items = [
        openai_line(
            f"e{j}", "/v1/embeddings", {"input": [f"passage {j} {i}" for i in range(texts)]}
        )
        for j in range(lines)
    ]
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(str(source), str(out), model=str(models["chat"]), overrides=FAKE)
    assert done.completed == lines
    first = out.read_bytes()
    work = open_store(str(tmp_path / "out.jsonl.nightshift"))
    marker = json.loads(work.get_bytes(MARKER))
    tracemalloc.start()
    try:  # the output written again from the finished job, measured
        again = _write_files(work, marker, str(out), str(tmp_path / "e.jsonl"), tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert again.completed == lines and out.read_bytes() == first
    vectors = lines * texts * 128
    # A float in a Python list costs at least 32 bytes: every vector at once would be
    # over vectors * 32 bytes (16 MB here; 21.9 MB measured before lineorder), where a
    # few slices and one line's worth is what may be held (4.9 MB measured).
    assert peak < vectors * 32 / 2, f"peak {peak / 1e6:.1f} MB for {vectors * 32 / 1e6:.0f} MB"
