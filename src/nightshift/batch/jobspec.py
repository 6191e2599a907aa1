"""The nightshift job a batch runs as: its records, one conversation (or prompt, or
text to embed) each, with each record's own sampling; written to WORK/job.yaml."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from nightshift.batch.openai import EMBEDDINGS
from nightshift.batch.records import ADAPTER_COLUMN, ID_COLUMN, SAMPLING_COLUMN
from nightshift.engines.reasoning import detect_parser
from nightshift.io.objectstore import ObjectStore
from nightshift.jobs.loading import apply_override, validate_spec

RECORDS = "input/records.parquet"
JOB_DIR = "job"
# Defaults for a first run. A request without max_tokens gets DEFAULT_MAX_TOKENS (at most
# half the context); without temperature/top_p the providers' own defaults, 1 and 1.
DEFAULT_MAX_TOKENS = 1024
DEFAULT_CONTEXT = 4096  # a model whose config names no context length
MAX_DEFAULT_CONTEXT = 16384  # the most a first run asks of the KV cache
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


def job_spec(work: ObjectStore, marker: dict, model: Path, overrides: list[str]) -> dict[str, Any]:
    """The job that runs a batch's records: one conversation (or raw prompt) each, with
    each record's own sampling."""
    if marker["shape"] == "messages":
        prompt: dict[str, Any] = {"messages_column": "messages"}
    else:
        prompt = {"template": "{prompt}", "chat_template": False}
    spec: dict[str, Any] = {
        "name": _job_name(marker["input"]),
        "input": {
            "path": work.uri(RECORDS),
            "id_column": ID_COLUMN,
            "sampling_column": SAMPLING_COLUMN,
        },
        "prompt": prompt,
        "task": {"kind": "generate"},
        "model": {"path": str(model), "max_model_len": model_context(model)},
        "sampling": {"temperature": 1.0, "top_p": 1.0},
        "output": {"path": work.uri(JOB_DIR)},
        # a provider's batch runs as sent; --set run.canary=true checks FP8 KV first
        "run": {"canary": False},
    }
    if marker["endpoint"] == EMBEDDINGS:
        _as_embeddings(spec, marker)
    parser = detect_parser(model) if marker["endpoint"] != EMBEDDINGS else None
    if parser:  # a reasoning model: its thinking apart, its lines' budgets honoured
        spec["model"]["reasoning"] = parser
    if marker.get("adapters"):  # a request's model names its adapter, as vLLM's server does
        spec["model"]["adapters"] = marker["adapters"]
        spec["input"]["adapter_column"] = ADAPTER_COLUMN
    for item in overrides:
        apply_override(spec, item)
    context = spec["model"]["max_model_len"]
    if isinstance(context, int) and context > 1 and "sampling" in spec:
        spec["sampling"]["max_tokens"] = min(DEFAULT_MAX_TOKENS, context // 2)
    validate_spec(spec)  # a bad --set is named here, before Prefect starts
    return spec


def _as_embeddings(spec: dict[str, Any], marker: dict) -> None:
    """A /v1/embeddings batch: an embed job of its texts, normalized as OpenAI's are."""
    spec["task"] = {"kind": "embed"}
    spec["embed"] = {"normalize": True, "dimensions": marker.get("dimensions")}
    del spec["input"]["sampling_column"], spec["sampling"]


def _job_name(input_url: str) -> str:
    stem = re.sub(r"\W+", "-", Path(input_url).stem).strip("-")[:60]
    return f"batch-{stem}" if stem else "batch"


def model_context(model: Path) -> int:
    """The model's own context length from its config.json, at most MAX_DEFAULT_CONTEXT."""
    try:
        config = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return DEFAULT_CONTEXT
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return min(value, MAX_DEFAULT_CONTEXT)
    return DEFAULT_CONTEXT
