"""The fingerprint of what a run's results depend on.

Stored with the plan; a rerun into the same output must match it, or a resumed job
would mix answers from two different prompts, models or sampling settings (a stale
checkpoint reused after the prompt changed is a classic way to ruin a dataset).

What counts: the model and tokenizer (by the content of the files that define them, not
by path; see ``jobs.modelfiles``), the LoRA adapters and the column that picks one per
record, the input's id, kept and sampling columns, the prompt, the task,
sampling, and the engine settings that change the numbers (weights dtype, KV cache dtype,
context length, any ``engine.extra`` not known to be harmless). What does not: where the
output goes, shard sizes, batch sizes, memory settings, prices. (Batch composition does
move temperature-0 results by rounding; nightshift records the settings with every run
instead of pretending otherwise.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from nightshift.engines.identity import (
    FAKE_ENGINE_VERSION,
    FAKE_FAST_PATH_VERSION,
    describe,
    engine_identity,
)
from nightshift.engines.tokenizer import model_source
from nightshift.jobs.modelfiles import folder_identity
from nightshift.jobs.spec import JobSpec

# engine.extra keys that change speed or memory, never answers.
HARMLESS_ENGINE_EXTRA = frozenset(
    {
        "enforce_eager",
        "num_gpu_blocks_override",
        "pipeline_parallel_size",
        "data_parallel_size",
        "swap_space",
        "disable_log_stats",
        "max_seq_len_to_capture",
        "compilation_config",
    }
)
# Fingerprint entries that describe a model folder, and the spec key that names it.
MODEL_KEYS = {"model.identity": "model.path", "model.tokenizer": "model.tokenizer"}


def result_inputs(spec: JobSpec) -> dict[str, Any]:
    """The parts of ``spec`` (and of the model folder) that results depend on."""
    data = spec.model_dump(mode="json", by_alias=True)
    extra = {k: v for k, v in data["engine"]["extra"].items() if k not in HARMLESS_ENGINE_EXTRA}
    inputs = {
        "input.id_column": data["input"]["id_column"],
        "input.keep_columns": data["input"]["keep_columns"],
        "prompt": data["prompt"],
        "task": data["task"],
        "sampling": data["sampling"],
        "model.identity": model_identity(spec.model.path),
        "model.tokenizer": model_identity(spec.model.tokenizer) if spec.model.tokenizer else None,
        "model.dtype": spec.model.dtype,
        "model.max_model_len": spec.model.max_model_len,
        "engine.kv_cache_dtype": spec.engine.kv_cache_dtype,
        "engine.extra": extra,
        # which engine at which version: an upgrade can change answers (engines.identity)
        "engine": engine_identity(spec.run.engine),
    }
    if spec.model.adapters:  # each adapter by content: a changed one is refused on resume
        inputs["model.adapters"] = {n: model_identity(p) for n, p in spec.model.adapters.items()}
    if spec.embed is not None:  # embed jobs only: other jobs' prints stay as they were
        inputs["embed"] = data["embed"]
    if spec.input.sampling_column is not None:  # set only where used: older prints stay
        inputs["input.sampling_column"] = spec.input.sampling_column
    if spec.input.adapter_column is not None:  # it picks the model that answers each record
        inputs["input.adapter_column"] = spec.input.adapter_column
    return inputs


def plan_stamp(spec: JobSpec) -> dict[str, Any]:
    """What a plan.json carries so a later run can tell whether it may resume."""
    inputs = result_inputs(spec)
    return {"fingerprint": fingerprint(inputs), "fingerprint_inputs": inputs}


def fingerprint(inputs: dict[str, Any]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def changed_keys(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Which fingerprinted keys differ, for the refusal message; a model folder's
    changed files by name (``model.path files chat_template.jinja``), an engine by its
    versions. A plan from before engine versions were recorded has no ``engine`` entry:
    its run is resumable under any engine (nothing says which one made it)."""
    changed = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if key == "engine" and old is None:
            continue
        if old != new:
            changed.append(_changed_engine(key, old, new) or _changed_files(key, old, new) or key)
    return changed


def _changed_engine(key: str, old: Any, new: Any) -> str | None:
    if key != "engine":
        return None
    why = "an engine upgrade can change answers: install the version it was made with"
    if _fake_paths(old, new):  # the fake's two paths: the environment picks one
        path = "0" if old["version"] == FAKE_ENGINE_VERSION else "1"
        why = f"the fake engine's two paths answer differently: set NIGHTSHIFT_FAKE_FAST={path}"
    return (
        f"engine (the run was made with {describe(old)}, this is {describe(new)}; "
        f"{why} to resume it)"
    )


def _fake_paths(old: Any, new: Any) -> bool:
    """Whether ``old`` and ``new`` are the fake engine's two paths."""
    paths = {FAKE_ENGINE_VERSION, FAKE_FAST_PATH_VERSION}
    both = (old, new)
    return (
        all(isinstance(e, dict) and e.get("name") == "fake" for e in both)
        and {e.get("version") for e in both} == paths
    )


def _changed_files(key: str, old: Any, new: Any) -> str | None:
    if key not in MODEL_KEYS or not all(isinstance(v, dict) for v in (old, new)):
        return None
    if "weights" in old:  # weights by size: a plan from before every file was hashed
        return f"{key} (recorded by an older nightshift, which did not hash every file)"
    before, after = old.get("files"), new.get("files")
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None
    names = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
    return f"{MODEL_KEYS[key]} files {', '.join(names)}" if names else None


def model_identity(name_or_path: str) -> dict[str, Any]:
    """A model folder by the content of its files (see ``jobs.modelfiles``); a hub id by
    its name."""
    folder = Path(model_source(name_or_path))
    if not folder.is_dir():
        return {"hub_id": name_or_path}
    return {"files": folder_identity(folder)}
