"""A user's command on the real engine: `nightshift jobs run` on a model without a chat
template, in a process of its own that starts its own vLLM engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import spec_dict
from .test_vllm_engine import LABELS, read_results

pytestmark = pytest.mark.engine


def test_cli_run_on_a_model_without_chat_template(models, ticket_dir, tmp_path, write_spec):
    spec = write_spec(spec_dict(models["plain"], ticket_dir, tmp_path / "out"))
    cli = Path(sys.executable).parent / "nightshift"
    done = subprocess.run(
        [str(cli), "jobs", "run", str(spec), "--set", "run.chunk_records=64"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "120 ok, 0 rejected, 0 failed of 120 records" in done.stdout
    results = read_results(tmp_path / "out")
    assert set(results["label"]) <= set(LABELS) and len(results) == 120
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["time_s"]["engine_startup"] > 0
    assert report["cost"]["usd_total"] > 0
