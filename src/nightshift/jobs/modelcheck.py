"""The model folders a spec names, checked before anything is planned.

A mistyped ``model.path`` or a broken LoRA adapter would otherwise surface at engine
start, after the plan, as a traceback from transformers or vLLM. Here each is one line
naming its key (``model.path``, ``model.adapters.<name>``) and the fix: an adapter when
the spec loads (``jobs.modelspec``), the model's folder before planning.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from nightshift.errors import SpecError

# A name that starts so is a folder, never a hub id (the hub refuses them anyway).
PATH_STARTS = (".", "/", "~")
MODEL_FIX = "run `nightshift demo init` for the demo model, or give a model folder or HF id"
HUB = "https://huggingface.co"
HUB_PROBE_S = 3.0
ADAPTER_FIX = "give a LoRA adapter folder in the PEFT layout (adapter_config.json and its weights)"


def check_model_folders(path: str, tokenizer: str | None) -> None:
    """Refuse a model or tokenizer that is no local folder and cannot be fetched either.
    Run before planning, not when the spec loads: a spec may be checked where its model
    is not (the shipped configs on a fresh clone)."""
    for key, name in (("model.path", path), ("model.tokenizer", tokenizer)):
        if name:
            check_model_source(name, key)


def check_model_source(name: str, key: str) -> None:
    """A name that is no local folder is a Hugging Face id. Refused at once, saying no
    folder of that name exists, where it cannot be fetched: named as a path
    (``./my-model``), not a valid id, or neither in the hub's cache nor reachable (else
    transformers retries for about a minute, then blames the connection alone)."""
    if Path(name).expanduser().is_dir():
        return
    if name.startswith(PATH_STARTS):
        raise SpecError(key, f"model folder {name} does not exist", MODEL_FIX)
    cached = _in_hub_cache(name)
    if cached is None:
        raise SpecError(key, f"no local folder {name!r} exists, nor is it a model id", MODEL_FIX)
    unreachable = None if cached else _hub_unreachable()
    if unreachable:
        raise SpecError(
            key,
            f"no local folder {name!r} exists here ({Path.cwd()}), and {unreachable}, so it "
            "cannot be fetched as a Hugging Face model id",
            "give the model's folder (the demo's is .nightshift/demo-model, made by "
            "`nightshift demo init`), or run where the hub is reachable",
        )


def _in_hub_cache(name: str) -> bool | None:
    """Whether the hub's local cache holds the model's config; None: not a valid id."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(name, "config.json")
    except HFValidationError:
        return None
    return isinstance(found, str)


@functools.lru_cache(maxsize=1)
def _hub_unreachable() -> str | None:
    """Why the hub cannot be asked (offline mode, or no connection), or None. One probe
    of a few seconds per process; behind a proxy the probe is left to the proxy."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{variable} is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    endpoint = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT") or HUB)
    host, port = endpoint.hostname or "", endpoint.port or 443
    try:
        socket.create_connection((host, port), timeout=HUB_PROBE_S).close()
    except OSError:
        return f"{host} cannot be reached from this machine"
    return None


class AdapterError(ValueError):
    """One adapter's problem; ``subkey`` (its name) makes the key ``model.adapters.<name>``."""

    def __init__(self, subkey: str, problem: str, fix: str) -> None:
        super().__init__(f"{problem} ({fix})")
        self.subkey = subkey


def check_adapter(name: str, folder: str) -> dict[str, Any]:
    """The adapter's config, read as vLLM and ``running.lora`` will read it: there, a
    JSON object, its rank ``r`` a whole number."""
    config = Path(folder).expanduser() / "adapter_config.json"
    if not config.is_file():
        raise AdapterError(name, f"{folder} holds no adapter_config.json", ADAPTER_FIX)
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        problem = f"{config} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
        raise AdapterError(name, problem, SAVE_AGAIN) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AdapterError(name, f"cannot read {config}: {exc}", SAVE_AGAIN) from None
    if not isinstance(data, dict):
        raise AdapterError(name, f"{config} is not a JSON object", SAVE_AGAIN)
    rank = data.get("r", 8)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(
            name,
            f"{config} gives the rank r as {rank!r}, not a whole number of at least 1",
            'write the adapter\'s rank as a number, for example "r": 8',
        )
    return data


SAVE_AGAIN = "fix the file, or save the adapter again with PEFT's save_pretrained"
