"""``task.kind: embed``: one vector per record, checkpointed, resumed, deduplicated and
cached like any job, on the fake engine (tests/test_embed_engine.py runs vLLM's pooling
runner and compares with ``LLM.embed``)."""

from __future__ import annotations

import json
import shutil

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.errors import SpecErrors
from nightshift.jobs.loading import validate_spec

from .conftest import spec_dict, write_records

runner = CliRunner()


def embed_job(models, tmp_path, texts: list[str], **sections) -> dict:
    rows = [{"ticket_id": f"T{i:04d}", "body": t} for i, t in enumerate(texts)]
    inputs = write_records(tmp_path / "in" / "docs.parquet", rows)
    data = spec_dict(models["chat"], inputs, tmp_path / "out", task={"kind": "embed"}, **sections)
    data["input"] = {"path": str(inputs), "id_column": "ticket_id"}
    data["prompt"] = {"template": "{body}"}
    del data["sampling"]
    return data


def run(spec_path, *extra) -> str:
    result = runner.invoke(app, ["jobs", "run", str(spec_path), "--set", "run.engine=fake", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_an_embed_job_writes_one_fixed_size_float32_vector_per_record(models, tmp_path, write_spec):
    texts = [f"document number {i} about refunds" for i in range(30)] + ["same"] * 4
    data = embed_job(models, tmp_path, texts)
    output = run(write_spec(data))
    results = tmp_path / "out" / "results"
    table = pq.read_table(list(results.glob("*.parquet")))
    field = table.schema.field("embedding")
    dimension = validate_spec(data).embed.dimensions or field.type.list_size
    assert pa.types.is_fixed_size_list(field.type) and field.type.value_type == pa.float32()
    assert dimension == 128  # the test model's hidden size
    frame = pl.read_parquet(results / "*.parquet")
    assert frame.height == 34 and frame["ticket_id"].n_unique() == 34
    norms = frame.select(pl.col("embedding").arr.to_list().list.eval(pl.element() ** 2).list.sum())
    assert norms.to_series().to_list() == pytest.approx([1.0] * 34, abs=1e-5)  # normalize
    # the four identical texts: one generated, three copies with its very vector
    same = frame.filter(pl.col("ticket_id").is_in([f"T{i:04d}" for i in range(30, 34)]))
    assert same["embedding"].to_list().count(same["embedding"][0].to_list()) == 4
    assert same["answered_from"].null_count() == 1
    got = duckdb.sql(f"select embedding from '{results}/*.parquet' limit 1").fetchall()
    assert len(got[0][0]) == dimension
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["embedding"] == {"dimension": dimension, "normalized": True}
    assert report["tokens"]["output"] == 0 and report["tokens"]["prompt"] > 0
    assert "embedding" in output or "embed" in output


def test_embed_dimensions_and_normalize_shape_the_vectors(models, tmp_path, write_spec):
    data = embed_job(models, tmp_path, ["alpha beta", "gamma delta"])
    data["embed"] = {"dimensions": 8, "normalize": False}
    result = runner.invoke(app, ["jobs", "run", str(write_spec(data)), "--set", "run.engine=fake"])
    assert result.exit_code == 2 and "embed.dimensions" in result.output
    assert "not trained for shortened (Matryoshka)" in result.output
    # the same model marked as trained for it (as vLLM reads config.json)
    model = tmp_path / "matryoshka"
    shutil.copytree(models["chat"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 64]}))
    data["model"] = {**data["model"], "path": str(model)}
    run(write_spec(data))
    frame = pl.read_parquet(tmp_path / "out" / "results" / "*.parquet")
    assert frame.schema["embedding"] == pl.Array(pl.Float32, 8)
    lengths = [sum(x * x for x in v) ** 0.5 for v in frame["embedding"].to_list()]
    assert not all(abs(n - 1.0) < 1e-3 for n in lengths)


def test_an_embed_job_refuses_sampling_and_an_embed_section_needs_embed(models, tmp_path):
    data = embed_job(models, tmp_path, ["x"])
    with pytest.raises(SpecErrors, match="sampling: task.kind embed generates no tokens"):
        validate_spec({**data, "sampling": {"max_tokens": 4}})
    generate = {**data, "task": {"kind": "generate"}, "sampling": {"max_tokens": 4}}
    with pytest.raises(SpecErrors, match="embed: applies to task.kind embed only"):
        validate_spec({**generate, "embed": {"normalize": False}})


def test_the_capacity_planner_predicts_an_embed_job_as_prefill_only(models, tmp_path, write_spec):
    data = embed_job(models, tmp_path, [f"text {i} " * 20 for i in range(50)])
    result = runner.invoke(app, ["jobs", "plan", str(write_spec(data)), "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    capacity = json.loads(result.output)["capacity"]
    assert capacity["output_tokens"]["per_record"] == 0
    assert capacity["tokens"]["output"] == 0 and capacity["tokens"]["prompt"] > 0
    assert capacity["time_s"]["decode"] == 0 and capacity["time_s"]["prefill"] > 0


def test_an_embed_job_killed_midway_resumes_with_every_vector_once(models, tmp_path, write_spec):
    import signal

    from .durable import assert_exactly_once, run_cli

    texts = [f"passage {i} " * (1 + i % 5) for i in range(60)]
    data = embed_job(models, tmp_path, texts, plan={"shard_records": 15})
    data["run"] = {**data["run"], "engine": "fake", "chunk_records": 4}
    spec = write_spec(data)
    killed = run_cli(spec, env={"NIGHTSHIFT_CRASH_AT": "shard.data_written:2"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = run_cli(spec)
    assert resumed.returncode == 0, resumed.stderr
    out = tmp_path / "out"
    assert_exactly_once(str(out), "ticket_id", [f"T{i:04d}" for i in range(60)])
    # the resumed output's vectors are those of a run never killed
    data["output"] = {"path": str(tmp_path / "clean")}
    assert run_cli(write_spec(data, "clean.yaml")).returncode == 0
    got, clean = (
        dict(pl.read_parquet(p / "results" / "*.parquet").select("ticket_id", "embedding").rows())
        for p in (out, tmp_path / "clean")
    )
    assert got.keys() == clean.keys() and all(got[k] == clean[k] for k in clean)


def test_a_changed_embed_setting_is_refused_on_resume(models, tmp_path, write_spec):
    data = embed_job(models, tmp_path, ["one", "two"])
    run(write_spec(data))
    data["embed"] = {"normalize": False}
    result = runner.invoke(app, ["jobs", "run", str(write_spec(data)), "--set", "run.engine=fake"])
    assert result.exit_code != 0 and "embed" in result.output


@pytest.mark.parametrize(
    "edit", [{}, {"matryoshka_dimensions": [8, 64]}, {"is_matryoshka": True}, {"id2label": {}}]
)
def test_an_embed_models_config_is_read_as_autoconfig_reads_it(models, tmp_path, edit):
    """config.json read plainly (AutoConfig imports torch: 3 s of a run's start)."""
    from nightshift.jobs.tasks import _auto_config, _plain_config

    model = tmp_path / "model"
    shutil.copytree(models["chat"], model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **edit}))
    plain, auto = _plain_config(str(model)), _auto_config(str(model))
    assert plain is not None and int(plain["hidden_size"]) == auto["hidden_size"] == 128
    assert plain.get("matryoshka_dimensions") == auto["matryoshka_dimensions"]
    assert bool(plain.get("is_matryoshka")) == bool(auto["is_matryoshka"])


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "gpt2", "n_embd": 64},  # hidden_size by another name
        {"model_type": "x", "hidden_size": 16, "text_config": {"hidden_size": 32}},  # composite
        {"model_type": "x", "hidden_size": 16, "decoder": {"hidden_size": 32}},
        {"model_type": "x", "hidden_size": "384"},  # AutoConfig's to refuse
    ],
)
def test_a_config_autoconfig_reads_otherwise_is_left_to_it(tmp_path, config):
    from nightshift.jobs.tasks import _plain_config

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert _plain_config(str(tmp_path)) is None
    assert _plain_config(str(tmp_path / "absent")) is None


def test_an_embed_jobs_dimension_is_checked_without_torch(models, tmp_path):
    import subprocess
    import sys

    data = json.dumps(json.dumps(embed_job(models, tmp_path, ["a"], run={"engine": "fake"})))
    code = (
        "import sys; from nightshift.jobs.tasks import embedding_dimension;"
        "from nightshift.jobs.loading import validate_spec; import json;"
        f"spec = validate_spec(json.loads({data}));"
        "print(embedding_dimension(spec), 'torch' in sys.modules)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.stdout.split() == ["128", "False"], run.stderr


def test_a_config_with_no_hidden_size_for_its_vectors_is_a_spec_error(models, tmp_path):
    from nightshift.errors import SpecError
    from nightshift.jobs.tasks import embedding_dimension

    model = tmp_path / "model"
    shutil.copytree(models["chat"], model)
    config = json.loads((model / "config.json").read_text())
    config["text_config"] = {"vocab_size": 10}  # a llama config that gives it as a dict
    (model / "config.json").write_text(json.dumps(config))
    data = embed_job(models, tmp_path, ["a"], run={"engine": "fake"})
    data["model"] = {**data["model"], "path": str(model)}
    with pytest.raises(SpecError, match="model.path"):
        embedding_dimension(validate_spec(data))
