"""The tokenizer class AutoTokenizer picked for a model folder, remembered across runs.

``AutoTokenizer`` imports torch and transformers' model registry only to pick a class:
4-5 s of every fresh ``jobs run`` on 2 cores, where the fake engine or a resume needs
neither (``engines.tokenizerid``). Its pick depends on nothing but the folder's prompt
files (tokenizer, vocab, template, configs) and the transformers version, so the
identity a run's AutoTokenizer gave is kept under a digest of exactly those, in
``NIGHTSHIFT_CACHE_DIR`` (default ``$XDG_CACHE_HOME/nightshift``, else
``~/.cache/nightshift``). The next run of the same files loads that class directly and
keeps it only if it gives the same ids, template and specials as before
(``TokenizerIdentity.load``); anything else loads through AutoTokenizer and is
remembered afresh. A hub id, remote code, or a cache that cannot be read or written
just loads through AutoTokenizer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from importlib.metadata import version
from pathlib import Path

from nightshift.engines.tokenizerid import TokenizerIdentity
from nightshift.jobs.modelfiles import PROMPT_FILES, folder_identity

CACHE_ENV = "NIGHTSHIFT_CACHE_DIR"


def cache_dir() -> Path:
    """Where nightshift keeps what it remembers between runs on this host."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "nightshift"


def recall(source: str, trust_remote_code: bool) -> TokenizerIdentity | None:
    """The identity remembered for the model folder ``source``; None if none is."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        path = _entry(source, trust_remote_code)
        if path is not None and path.is_file():
            return TokenizerIdentity.in_plan({"tokenizer": json.loads(path.read_text())})
    return None


def remember(source: str, trust_remote_code: bool, identity: TokenizerIdentity) -> None:
    """Keep ``identity`` for the model folder ``source`` (written whole or not at all)."""
    with contextlib.suppress(OSError, ValueError):
        path = _entry(source, trust_remote_code)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")  # hosts sharing a home
        partial.write_text(json.dumps(identity.as_plan()["tokenizer"]))
        partial.replace(path)


def _entry(source: str, trust_remote_code: bool) -> Path | None:
    """The cache file for a local folder's prompt files; None for a hub id or remote
    code (whose class has no importable name)."""
    folder = Path(source)
    if trust_remote_code or not folder.is_dir():
        return None
    files = folder_identity(folder, only=PROMPT_FILES)
    key = json.dumps([version("transformers"), files], sort_keys=True)
    return cache_dir() / "tokenizers" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
