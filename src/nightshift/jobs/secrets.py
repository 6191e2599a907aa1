"""Secrets stay out of the spec.

The spec is written into ``plan/plan.json``, ``report.json`` and a Prefect flow run's
parameters, and it is fingerprinted, so a token there would be stored in plain text and
rotating it would stop the run from resuming. A key that looks like a secret is refused
with a pointer to the environment variable that carries it instead.
"""

from __future__ import annotations

import re
from typing import Any

# Words that name a secret anywhere in a key, and words that do only as its last word
# (``hf_token`` is a secret, ``long_prefill_token_threshold`` a vLLM setting).
_SECRET_WORDS = {"secret", "secrets", "password", "passwd", "credential", "credentials"}
_SECRET_LAST_WORDS = {"token", "auth", "authorization", "apikey", "bearer"}
_KEY_WORDS = {"api", "access", "private", "secret"}  # api_key, access_key, private_key
# Known secrets and the environment variable their library reads instead.
_ENVIRONMENT = {"hf_token": "HF_TOKEN"}


class SecretKeyError(ValueError):
    """A secret-like key in a free-form map; ``subkey`` is its dotted path inside it."""

    def __init__(self, subkey: str) -> None:
        self.subkey = subkey
        name = subkey.rsplit(".", 1)[-1]
        variable = _ENVIRONMENT.get(name.lower())
        where = f"set {variable} in the environment" if variable else "set it in the environment"
        super().__init__(
            f"looks like a secret, and the spec is written in plain text into plan.json, "
            f"report.json and the Prefect run's parameters; remove it and {where} instead "
            "(the engine reads it from there)"
        )


def refuse_secrets(mapping: dict[str, Any], prefix: str = "") -> None:
    """Raise ``SecretKeyError`` for the first secret-like key in ``mapping``, nested
    mappings and lists included. Only keys are looked at: a value is never echoed."""
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if isinstance(key, str) and looks_secret(key):
            raise SecretKeyError(path)
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, dict):
                refuse_secrets(child, f"{path}.")


def looks_secret(key: str) -> bool:
    words = [w.lower() for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", key)]
    if not words:
        return False
    if _SECRET_WORDS.intersection(words) or words[-1] in _SECRET_LAST_WORDS:
        return True
    return words[-1] == "key" and len(words) > 1 and words[-2] in _KEY_WORDS
