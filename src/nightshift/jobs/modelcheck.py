"""The model folders a spec names, checked before anything is planned.

A mistyped ``model.path`` or a broken LoRA adapter would otherwise surface at engine
start, after the plan, as a traceback from transformers or vLLM. Here each is one line
naming its key (``model.path``, ``model.adapters.<name>``) and the fix: an adapter when
the spec loads (``jobs.modelspec``), the model's folder before planning.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nightshift.errors import SpecError

# A name that starts so is a folder, never a hub id (the hub refuses them anyway).
PATH_STARTS = (".", "/", "~")
MODEL_FIX = "run `nightshift demo init` for the demo model, or give a model folder or HF id"
ADAPTER_FIX = "give a LoRA adapter folder in the PEFT layout (adapter_config.json and its weights)"


def check_model_folders(path: str, tokenizer: str | None) -> None:
    """Refuse a model or tokenizer named as a folder (``./my-model``) that is not there.
    Run before planning, not when the spec loads: a spec may be checked where its model
    is not (the shipped configs on a fresh clone)."""
    for key, name in (("model.path", path), ("model.tokenizer", tokenizer)):
        if name and name.startswith(PATH_STARTS) and not Path(name).expanduser().is_dir():
            raise SpecError(key, f"model folder {name} does not exist", MODEL_FIX)


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
