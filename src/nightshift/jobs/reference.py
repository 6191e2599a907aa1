"""The job at its most exact, and the settings of a spec that may change its answers.

An FP8 KV cache stores attention keys and values in 8 bits (vLLM's own guidance: 1-2
points lost uncalibrated, worse on some models); speculative decoding drafts tokens that
the model then checks, and in floating point the checked answer can still differ. The
*reference* is the spec with neither: the KV cache in the model's dtype and no
speculation. The canary (``pipelines.canary``) and ``jobs tune`` compare answers with it.

Weights below the model's own dtype (``model.dtype: bfloat16`` for a float32 model)
round every step too: the reference runs the model in its own dtype. Only a dtype of
fewer bits counts: ``auto`` is the engine's choice for the hardware, and a wider one
(float32 for a bf16 model on a CPU without bf16 units) loses nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nightshift.jobs.spec import JobSpec

KV = "engine.kv_cache_dtype"
SPECULATION = "engine.extra.speculative_config"
DTYPE = "model.dtype"
BITS = {"float32": 32, "float": 32, "bfloat16": 16, "float16": 16, "half": 16}


def reference_sets(spec: JobSpec) -> dict[str, Any]:
    """The keys to set (as ``--set`` sets them) for ``spec``'s reference."""
    sets: dict[str, Any] = {KV: "auto"}
    if spec.engine.extra.get("speculative_config") is not None:
        sets[SPECULATION] = None  # vLLM's default: none
    own = narrower_dtype(spec)
    if own is not None:
        sets[DTYPE] = own
    return sets


def answer_changing(spec: JobSpec) -> dict[str, Any]:
    """The settings of ``spec`` that may change its answers, by key (empty: none)."""
    found: dict[str, Any] = {}
    if spec.engine.kv_cache_dtype != "auto":
        found[KV] = spec.engine.kv_cache_dtype
    if spec.engine.extra.get("speculative_config") is not None:
        found[SPECULATION] = spec.engine.extra["speculative_config"]
    if narrower_dtype(spec) is not None:
        found[DTYPE] = spec.model.dtype
    return found


def narrower_dtype(spec: JobSpec) -> str | None:
    """The model's own dtype when ``model.dtype`` has fewer bits than it (None: auto, the
    same, wider, or the model folder does not say)."""
    wanted = BITS.get(str(spec.model.dtype).lower())
    own = model_dtype(spec.model.path)
    if wanted is None or own is None or BITS.get(own, 0) <= wanted:
        return None
    return own


def model_dtype(path: str) -> str | None:
    """The dtype a model folder's config.json names (``dtype``, or ``torch_dtype`` in
    older files), or None where it names none or cannot be read."""
    try:
        config = json.loads((Path(path).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    found = config.get("dtype") or config.get("torch_dtype") if isinstance(config, dict) else None
    return str(found).lower().removeprefix("torch.") if found else None
