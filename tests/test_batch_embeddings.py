"""``/v1/embeddings`` batch files through ``nightshift batch run``: an embed job per file,
the output lines checked with the openai SDK's own types; one real-engine run compares
the vectors with ``LLM.embed``."""

from __future__ import annotations

import base64
import json
import struct

import numpy as np
import pytest
from openai.types import CreateEmbeddingResponse

from nightshift.batch.run import run_batch

from .inprocess import vllm_in_this_process

URL = "/v1/embeddings"


def line(custom_id: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": URL, "body": body}


def lines_of(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def write(path, items: list[dict]):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def test_an_embeddings_batch_writes_embedding_bodies_and_refuses_what_it_cannot_do(
    models, tmp_path
):
    texts = [f"text number {i}" for i in range(6)] + ["text number 0"]  # a repeat
    items = [line(f"e{i}", {"model": "emb", "input": t}) for i, t in enumerate(texts)]
    items[1]["body"]["input"] = [texts[1]]  # a list of one text
    items[2]["body"]["encoding_format"] = "base64"
    items += [
        line("many", {"input": ["text number 1", "another text", "text number 0"]}),
        line("ids", {"input": [1, 2, 3]}),  # token ids
        line("size", {"input": "x", "dimensions": 8}),  # another size than the file's
        line("extra", {"input": "x", "truncate": True}),
    ]
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(
        str(source),
        str(out),
        model=str(models["chat"]),
        served_names=["emb"],
        overrides=["run.engine=fake"],
    )
    assert (done.total, done.completed, done.failed) == (11, 8, 3)
    answers = {x["custom_id"]: x for x in lines_of(out)}
    # base64 is the wire form the SDK decodes itself: decoded here first, as it does
    data = answers["e2"]["response"]["body"]["data"][0]
    decoded = list(
        struct.unpack(
            f"<{len(base64.b64decode(data['embedding'])) // 4}f",
            base64.b64decode(data["embedding"]),
        )
    )
    data["embedding"] = decoded
    bodies = {
        k: CreateEmbeddingResponse.model_validate(v["response"]["body"]) for k, v in answers.items()
    }
    assert set(bodies) == {f"e{i}" for i in range(7)} | {"many"}
    # several texts on one line: one embedding each, in input order, usage summed
    many = bodies["many"]
    assert [d.index for d in many.data] == [0, 1, 2]
    assert many.data[0].embedding == bodies["e1"].data[0].embedding
    assert many.data[2].embedding == bodies["e0"].data[0].embedding
    assert many.usage.prompt_tokens > bodies["e1"].usage.prompt_tokens
    first = bodies["e0"]
    assert first.object == "list" and first.model == "emb" and first.data[0].index == 0
    vector = first.data[0].embedding
    assert len(vector) == 128 and abs(np.linalg.norm(vector) - 1) < 1e-5  # normalized
    assert bodies["e6"].data[0].embedding == vector  # the repeated text: the same vector
    assert first.usage.prompt_tokens == first.usage.total_tokens > 0
    assert len(decoded) == 128 and abs(np.linalg.norm(decoded) - 1) < 1e-5
    errors = {
        x["custom_id"]: x["response"]["body"]["error"]
        for x in lines_of(tmp_path / "out.errors.jsonl")
    }
    assert "token ids are not supported" in errors["ids"]["message"]
    assert "one size per batch file" in errors["size"]["message"]
    assert errors["extra"]["param"] == "truncate"


@pytest.mark.engine
def test_an_embeddings_batch_on_vllm_equals_llm_embed(smollm2, tmp_path):
    from vllm import LLM

    texts = ["My card was charged twice.", "The app crashes on start.", "Reset my password."]
    items = [line(f"e{i}", {"input": t}) for i, t in enumerate(texts)]
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(
        str(source),
        str(out),
        model=str(smollm2),
        overrides=[
            "model.max_model_len=512",
            "engine.kv_cache_dtype=auto",
            "engine.extra.enforce_eager=true",
        ],
    )
    assert (done.completed, done.failed) == (3, 0)
    ours = [
        CreateEmbeddingResponse.model_validate(x["response"]["body"]).data[0].embedding
        for x in lines_of(out)
    ]
    with vllm_in_this_process():  # the reference: vLLM's own LLM, started in 3 s
        llm = LLM(model=str(smollm2), runner="pooling", max_model_len=512, enforce_eager=True)
    try:
        theirs = [o.outputs.embedding for o in llm.embed(texts, use_tqdm=False)]
    finally:
        llm.llm_engine.engine_core.shutdown()
    for a, b in zip(ours, theirs, strict=True):
        assert np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b) >= 0.999


def test_a_line_refused_for_its_model_does_not_set_the_files_vector_size(models, tmp_path):
    items = [
        line("other", {"model": "not-served", "input": "a", "dimensions": 64}),
        line("kept", {"input": "b"}),  # the model's own size: the first line that runs
        line("sized", {"input": "c", "dimensions": 64}),
    ]
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(
        str(source), str(out), model=str(models["chat"]), overrides=["run.engine=fake"]
    )
    assert (done.completed, done.failed) == (1, 2)
    assert [x["custom_id"] for x in lines_of(out)] == ["kept"]
    errors = {x["custom_id"]: x for x in lines_of(tmp_path / "out.errors.jsonl")}
    assert errors["other"]["response"]["body"]["error"]["code"] == "model_not_found"
    assert errors["sized"]["response"]["body"]["error"]["param"] == "dimensions"


def test_each_float_is_written_short_and_reads_back_as_the_engines_float32(models, tmp_path):
    import re

    import polars as pl

    from nightshift.io.outputs import committed_files

    items = [line(f"e{i}", {"input": f"text number {i}"}) for i in range(40)]
    items.append(line("b", {"input": "text number 3", "encoding_format": "base64"}))
    source, out = write(tmp_path / "in.jsonl", items), tmp_path / "out.jsonl"
    done = run_batch(
        str(source), str(out), model=str(models["chat"]), overrides=["run.engine=fake"]
    )
    assert done.completed == 41
    job = f"{out}.nightshift/job"
    results = pl.concat([pl.read_parquet(f) for f in committed_files(job, "results")])
    engine = {
        r["custom_id"]: np.asarray(r["embedding"], dtype=np.float32)
        for r in results.iter_rows(named=True)
    }
    raw = {json.loads(x)["custom_id"]: x for x in out.read_text().splitlines()}
    for i in range(40):
        [data] = json.loads(raw[f"e{i}"])["response"]["body"]["data"]
        assert np.array_equal(np.asarray(data["embedding"], dtype=np.float32), engine[f"e{i}"])
        numbers = re.findall(r"-?\d[\d.]*(?:e[-+]?\d+)?", raw[f"e{i}"].split('"embedding": ')[1])
        # float32's shortest form has at most 9 significant digits (a widened double: 17)
        assert (
            max(len(n.split("e")[0].replace("-", "").replace(".", "").lstrip("0")) for n in numbers)
            <= 9
        )
    [data] = json.loads(raw["b"])["response"]["body"]["data"]
    assert base64.b64decode(data["embedding"]) == engine["b"].astype("<f4").tobytes()
    assert np.array_equal(engine["b"], engine["e3"])
