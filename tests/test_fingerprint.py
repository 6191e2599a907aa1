"""The fingerprint sees every model file that shapes an answer, and stays cheap to take."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from nightshift.jobs import modelfiles
from nightshift.jobs.fingerprint import changed_keys, model_identity

from .conftest import spec_dict


@pytest.fixture
def model(models, tmp_path) -> Path:
    """A copy of the demo model that a test may edit."""
    return Path(shutil.copytree(models["chat"], tmp_path / "model"))


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte in place: same size, same name."""
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def tensor_middle(path: Path) -> int:
    """The file offset of the middle of the safetensors file's largest tensor."""
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    header = json.loads(path.read_bytes()[8 : 8 + length])
    begin, end = max(
        (t["data_offsets"] for k, t in header.items() if k != "__metadata__"),
        key=lambda span: span[1] - span[0],
    )
    return 8 + length + (begin + end) // 2


def test_an_unchanged_model_keeps_its_identity_wherever_it_lies(models, model):
    assert model_identity(str(model)) == model_identity(str(models["chat"]))
    assert model_identity(str(model)) == model_identity(str(model))


@pytest.mark.parametrize(
    "name",
    [
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
    ],
)
def test_every_prompt_file_counts(model, name):
    before = {"model.identity": model_identity(str(model))}
    path = model / name
    path.write_bytes((path.read_bytes() if path.exists() else b"") + b"\n")
    after = {"model.identity": model_identity(str(model))}
    assert changed_keys(before, after) == [f"model.path files {name}"]


def test_one_byte_of_the_weights_counts(model):
    weights = model / "model.safetensors"
    before = model_identity(str(model))
    flip_byte(weights, tensor_middle(weights))
    assert (
        model_identity(str(model))["files"]["model.safetensors"]
        != before["files"]["model.safetensors"]
    )


@pytest.mark.parametrize("suffix", [".safetensors", ".bin", ".gguf"])
def test_large_weights_are_sampled_and_a_changed_tensor_counts(model, monkeypatch, suffix):
    monkeypatch.setattr(modelfiles, "FULL_HASH_BYTES", 0)  # as if the file were 10 GB
    weights = model / f"weights{suffix}"
    shutil.copyfile(model / "model.safetensors", weights)
    first = modelfiles.file_digest(weights)
    assert first.startswith("sampled:") and modelfiles.file_digest(weights) == first
    flip_byte(weights, tensor_middle(weights))
    assert modelfiles.file_digest(weights) != first


class _CountingPath(type(Path())):
    """A path whose opened files count the bytes read from them."""

    read_bytes_total = 0

    def open(self, *args, **kwargs):
        stream = super().open(*args, **kwargs)
        read = stream.read

        def counted(*a):
            data = read(*a)
            _CountingPath.read_bytes_total += len(data)
            return data

        stream.read = counted
        return stream


def test_a_huge_weights_file_costs_a_few_megabytes_of_reads(tmp_path):
    tensors = {
        f"layer.{i}": {"dtype": "BF16", "shape": [2**22], "data_offsets": [i << 23, (i + 1) << 23]}
        for i in range(2000)  # 16 GiB of tensors, 2000 of them
    }
    header = json.dumps(tensors).encode()
    huge = tmp_path / "model-00001-of-00002.safetensors"
    other = tmp_path / "consolidated.gguf"
    with huge.open("wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + (2000 << 23))  # sparse: no disk used
    with other.open("wb") as f:
        f.truncate(16 << 30)
    for path, most in ((huge, len(header) + (1 << 20)), (other, 5 << 20)):
        _CountingPath.read_bytes_total = 0
        assert modelfiles.file_digest(_CountingPath(path)).startswith("sampled:")
        assert _CountingPath.read_bytes_total < most


def _edit_template(model: Path) -> None:
    template = model / "chat_template.jinja"
    template.write_text(template.read_text().replace("<|im_start|>assistant", "<|im_start|>bot"))


def _edit_tokenizer(model: Path) -> None:
    config = model / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<pad>", "</s>"))


def _edit_weights(model: Path) -> None:
    flip_byte(model / "model.safetensors", tensor_middle(model / "model.safetensors"))


def test_a_changed_model_file_refuses_the_rerun_and_says_which(model, ticket_dir, tmp_path):
    """Through the command users run: a model file edited between a kill and a rerun is
    refused, naming the file; the same model again resumes."""
    import yaml

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(model, ticket_dir, tmp_path / "out")))
    args = [sys.executable, "-m", "nightshift.cli", "jobs", "run", str(spec), "-q"]
    args += ["--set", "run.engine=fake"]
    assert subprocess.run(args, capture_output=True, text=True).returncode == 0
    # Each kind of model file is named when it changes; one goes through the command.
    before = model_identity(str(model))
    for name, edit in {
        "chat_template.jinja": _edit_template,
        "tokenizer_config.json": _edit_tokenizer,
    }.items():
        original = (model / name).read_bytes()
        edit(model)
        [change] = changed_keys(
            {"model.identity": before}, {"model.identity": model_identity(str(model))}
        )
        assert name in change, change
        (model / name).write_bytes(original)
    original = (model / "model.safetensors").read_bytes()
    _edit_weights(model)
    refused = subprocess.run(args, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stderr
    # The tests' Prefect logs errors to the console; the user's last line is ours.
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith("error: output.path"), refused.stderr
    assert "(model.path files model.safetensors changed)" in last
    (model / "model.safetensors").write_bytes(original)
    again = subprocess.run(args, capture_output=True, text=True)  # unchanged: resumes
    assert again.returncode == 0 and "0 by this run" in again.stdout, again.stderr


def test_a_plan_from_before_every_file_was_hashed_says_so(model):
    old = {"model.identity": {"files": {}, "weights": {"model.safetensors": 1006144}}}
    [change] = changed_keys(old, {"model.identity": model_identity(str(model))})
    assert change.startswith("model.identity (recorded by an older nightshift")


def _record_engine(plan_json: Path, engine: dict | None) -> None:
    """Rewrite a finished run's plan.json as if another engine version (None: a
    nightshift from before versions were recorded) had made it."""
    from nightshift.jobs.fingerprint import fingerprint

    manifest = json.loads(plan_json.read_text())
    inputs = manifest["fingerprint_inputs"]
    inputs.pop("engine")
    if engine is not None:
        inputs["engine"] = engine
    manifest["fingerprint"] = fingerprint(inputs)
    plan_json.write_text(json.dumps(manifest))


def test_an_engine_version_change_refuses_the_resume_naming_both(models, ticket_dir, tmp_path):
    """An engine upgrade can change answers: a resume under another version is refused,
    naming both; a plan from before versions were recorded still resumes; the report
    names the engine and its version. The fake engine's two paths answer differently,
    so each has a version of its own (NIGHTSHIFT_FAKE_FAST=0: the default path's)."""
    import yaml

    from nightshift.engines.identity import FAKE_ENGINE_VERSION, FAKE_FAST_PATH_VERSION

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(spec_dict(models["chat"], ticket_dir, tmp_path / "out")))
    args = [sys.executable, "-m", "nightshift.cli", "jobs", "run", str(spec), "-q"]
    args += ["--set", "run.engine=fake"]
    env = {k: v for k, v in os.environ.items() if k != "NIGHTSHIFT_FAKE_FAST"}
    assert subprocess.run(args, capture_output=True, text=True, env=env).returncode == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["engine"]["version"] == FAKE_FAST_PATH_VERSION
    plan_json = tmp_path / "out" / "plan" / "plan.json"
    recorded = json.loads(plan_json.read_text())["fingerprint_inputs"]["engine"]
    assert recorded == {"name": "fake", "version": FAKE_FAST_PATH_VERSION}

    default_path = subprocess.run(
        args, capture_output=True, text=True, env={**env, "NIGHTSHIFT_FAKE_FAST": "0"}
    )
    assert default_path.returncode == 2, default_path.stderr
    last = default_path.stderr.strip().splitlines()[-1]
    assert f"made with fake {FAKE_FAST_PATH_VERSION}" in last
    assert f"this is fake {FAKE_ENGINE_VERSION}" in last
    assert "two paths answer differently: set NIGHTSHIFT_FAKE_FAST=1 to resume it)" in last

    _record_engine(plan_json, {"name": "fake", "version": "0.9-old"})
    refused = subprocess.run(args, capture_output=True, text=True, env=env)
    assert refused.returncode == 2, refused.stderr
    last = refused.stderr.strip().splitlines()[-1]
    assert "made with fake 0.9-old" in last and f"this is fake {FAKE_FAST_PATH_VERSION}" in last
    assert "install the version it was made with to resume it)" in last, last

    _record_engine(plan_json, None)
    again = subprocess.run(args, capture_output=True, text=True, env=env)
    assert again.returncode == 0 and "0 by this run" in again.stdout, again.stderr


def test_the_fake_engines_two_paths_never_share_a_response_cache(monkeypatch):
    """A cache filled on the fake's fast path never serves a run on its default path
    (NIGHTSHIFT_FAKE_FAST=0), whose answers differ: the version names the path."""
    from nightshift.engines.base import Sampling
    from nightshift.engines.identity import engine_identity
    from nightshift.io.responsecache import scope_digest
    from nightshift.scheduling.cachescope import cache_scope

    def scope() -> str:
        inputs = {"model.identity": {"files": {"a": "1"}}, "engine": engine_identity("fake")}
        return scope_digest(cache_scope(inputs, Sampling(max_tokens=8)))

    monkeypatch.delenv("NIGHTSHIFT_FAKE_FAST", raising=False)
    fast = scope()
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FAST", "1")
    assert scope() == fast
    monkeypatch.setenv("NIGHTSHIFT_FAKE_FAST", "0")
    assert scope() != fast


def test_the_response_cache_never_serves_across_engine_versions():
    from nightshift.engines.base import Sampling
    from nightshift.io.responsecache import scope_digest
    from nightshift.scheduling.cachescope import cache_scope

    inputs = {"model.identity": {"files": {"a": "1"}}, "engine": {"name": "vllm", "version": "1"}}
    upgraded = {**inputs, "engine": {"name": "vllm", "version": "2"}}
    sampling = Sampling(max_tokens=8)
    assert scope_digest(cache_scope(inputs, sampling)) != scope_digest(
        cache_scope(upgraded, sampling)
    )


def test_a_refusal_between_the_fakes_two_paths_names_the_setting_that_resumes_it():
    from nightshift.engines.identity import FAKE_ENGINE_VERSION, FAKE_FAST_PATH_VERSION
    from nightshift.jobs.fingerprint import _changed_engine

    fast = {"name": "fake", "version": FAKE_FAST_PATH_VERSION}
    default = {"name": "fake", "version": FAKE_ENGINE_VERSION}
    assert "set NIGHTSHIFT_FAKE_FAST=0 to resume it)" in _changed_engine("engine", default, fast)
    assert "set NIGHTSHIFT_FAKE_FAST=1 to resume it)" in _changed_engine("engine", fast, default)
    old = {"name": "fake", "version": "0.9-old"}
    assert "install the version it was made with" in _changed_engine("engine", old, fast)
