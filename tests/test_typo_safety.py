"""A typo never costs a finished run: a spec that cannot run against its input or model
is told so before anything is compared or deleted, and `--overwrite` then deletes
nothing (issue 43). On the fake engine, through `nightshift jobs run`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nightshift.cli import app
from nightshift.errors import SpecError
from nightshift.jobs.modelcheck import _hub_unreachable, check_model_source

from .conftest import spec_dict

runner = CliRunner()
FAKE = ["--set", "run.engine=fake", "-q"]


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def finished(models, ticket_dir, tmp_path, write_spec):
    """A finished run in tmp_path/out and its spec's data."""
    data = spec_dict(models["chat"], ticket_dir, tmp_path / "out")
    result = runner.invoke(app, ["jobs", "run", str(write_spec(data)), *FAKE])
    assert result.exit_code == 0, result.output
    return data, _files(tmp_path / "out")


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("template", "Subject: {subject}\n\n{review}", "'review'"),
        ("path", "./demo-modle", "model.path: model folder ./demo-modle does not exist"),
        ("path", "demo-modle", "model.path: no local folder 'demo-modle' exists here"),
    ],
)
@pytest.mark.parametrize("flags", [[], ["--overwrite"]])
def test_a_typo_is_reported_as_itself_and_deletes_nothing(
    finished, tmp_path, write_spec, key, value, named, flags, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a hub id that is no folder: not fetched
    _hub_unreachable.cache_clear()
    data, before = finished
    section = "prompt" if key == "template" else "model"
    typo = {**data, section: {**data[section], key: value}}
    result = runner.invoke(app, ["jobs", "run", str(write_spec(typo, "typo.yaml")), *FAKE, *flags])
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert "--overwrite" not in result.output and "different job" not in result.output
    assert _files(tmp_path / "out") == before  # the finished run, byte for byte


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
        ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "127.0.0.1 cannot be reached from this machine"),
    ],
)
def test_a_name_that_is_no_folder_nor_reachable_is_refused_at_once(monkeypatch, env, why):
    """No minute of hub retries ending in "check your connection": it says no folder of
    that name exists, and why the hub cannot give it either."""
    import time

    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    _hub_unreachable.cache_clear()
    began = time.monotonic()
    with pytest.raises(SpecError, match=f"no local folder 'my-modle' exists here .*{why}"):
        check_model_source("my-modle", "model.path")
    assert time.monotonic() - began < 5
    _hub_unreachable.cache_clear()
    with pytest.raises(SpecError, match="no local folder 'a b' exists, nor is it a model id"):
        check_model_source("a b", "model.path")
