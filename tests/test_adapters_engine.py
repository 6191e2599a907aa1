"""One adapter per record on the real engine (vLLM CPU, the tiny model, two small random
adapters built here): an adapter changes the answers, and every record's answer equals
vLLM's own ``LLM.generate`` for the same adapter and prompt."""

from __future__ import annotations

import polars as pl
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.jobs.loading import validate_spec
from nightshift.running.engines import engine_arguments

from .inprocess import vllm_in_this_process
from .test_adapters import adapter_job

pytestmark = pytest.mark.engine


def test_each_record_answers_as_vllm_does_under_its_adapter(models, tmp_path, write_spec):
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    data = adapter_job(models, tmp_path, names=["a", "b", None], bodies=2)
    data["prompt"] = {"template": "{body}", "chat_template": False}
    data["engine"] = {**data["engine"], "kv_cache_dtype": "auto", "max_num_seqs": 16}
    data["sampling"] = {"max_tokens": 8, "temperature": 0.0}
    result = CliRunner().invoke(app, ["jobs", "run", str(write_spec(data))])
    assert result.exit_code == 0, result.output
    [log] = (tmp_path / "out.logs").iterdir()  # vLLM's own lines, kept where it says
    assert f"engine log: {log}" in result.output and log.stat().st_size
    rows = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet").sort("ticket_id")
    assert rows.height == 9
    spec = validate_spec(data)
    with vllm_in_this_process():  # the reference: vLLM's own LLM, started in 3 s
        llm = LLM(**engine_arguments(spec))
    try:
        loras = {n: LoRARequest(n, i, p) for i, (n, p) in enumerate(spec.model.adapters.items(), 1)}
        params = SamplingParams(temperature=0.0, max_tokens=8)
        for row in rows.iter_rows(named=True):
            body = f"body {int(row['ticket_id'][1:]) % 2}"
            [own] = llm.generate(
                [body], params, lora_request=loras.get(row["lora"]), use_tqdm=False
            )
            assert row["text"] == own.outputs[0].text, row
    finally:
        llm.llm_engine.engine_core.shutdown()
    # the same prompt under a, b and the base model: three answers
    rows = rows.with_columns((pl.col("ticket_id").str.slice(1).cast(pl.Int64) % 2).alias("body"))
    for body in (0, 1):
        same = rows.filter(pl.col("body") == body).unique("lora")
        assert same.height == 3 and same["text"].n_unique() == 3, same
