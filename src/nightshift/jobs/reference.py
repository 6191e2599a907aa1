"""The job at its most exact, and the settings of a spec that may change its answers.

An FP8 KV cache stores attention keys and values in 8 bits (vLLM's own guidance: 1-2
points lost uncalibrated, worse on some models); speculative decoding drafts tokens that
the model then checks, and in floating point the checked answer can still differ. The
*reference* is the spec with neither: the KV cache in the model's dtype and no
speculation. The canary (``pipelines.canary``) and ``jobs tune`` compare answers with it.
"""

from __future__ import annotations

from typing import Any

from nightshift.jobs.spec import JobSpec

KV = "engine.kv_cache_dtype"
SPECULATION = "engine.extra.speculative_config"


def reference_sets(spec: JobSpec) -> dict[str, Any]:
    """The keys to set (as ``--set`` sets them) for ``spec``'s reference."""
    sets: dict[str, Any] = {KV: "auto"}
    if spec.engine.extra.get("speculative_config") is not None:
        sets[SPECULATION] = None  # vLLM's default: none
    return sets


def answer_changing(spec: JobSpec) -> dict[str, Any]:
    """The settings of ``spec`` that may change its answers, by key (empty: none)."""
    found: dict[str, Any] = {}
    if spec.engine.kv_cache_dtype != "auto":
        found[KV] = spec.engine.kv_cache_dtype
    if spec.engine.extra.get("speculative_config") is not None:
        found[SPECULATION] = spec.engine.extra["speculative_config"]
    return found
