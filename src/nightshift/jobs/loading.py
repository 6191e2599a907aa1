"""Read a job spec from YAML, apply ``--set`` overrides, and validate it.

Every failure becomes a ``SpecError`` naming the dotted key and what to do about it,
so the CLI can print one clear line per problem instead of a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from nightshift.errors import SpecError, SpecErrors
from nightshift.jobs.spec import JobSpec

# A hint per pydantic error type: what the user should do, not what went wrong.
_FIXES = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add this key",
    "int_type": "write a whole number without quotes",
    "float_type": "write a number without quotes",
    "bool_type": "write true or false without quotes",
    "string_type": "write text (quote it if YAML reads it as something else)",
    "list_type": "write a YAML list, for example [a, b]",
    "dict_type": "write a YAML mapping of key: value",
    "model_type": "write a YAML mapping of key: value",
    "union_tag_invalid": "use one of generate, classify, extract",
    "union_tag_not_found": "add kind: generate, classify or extract",
    "literal_error": "use one of the listed values",
}


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Load, override and validate a spec; raise ``SpecError(s)`` on any problem."""
    data = read_yaml(Path(path))
    for item in overrides or []:
        apply_override(data, item)
    return validate_spec(data)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError("", f"job spec {path} does not exist", "check the path")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError("", f"{path} is not valid YAML{where}", "fix the YAML syntax") from None
    if not isinstance(data, dict):
        raise SpecError("", f"{path} must be a YAML mapping of keys, got {type(data).__name__}")
    return data


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply one ``key.path=value`` override; the value is read as YAML (8 -> int)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise SpecError(
            "--set", f"{item!r} is not key.path=value", "for example sampling.max_tokens=16"
        )
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise SpecError(key, f"cannot set inside {where}, which is not a mapping")
        node = child
    try:
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        node[parts[-1]] = raw


def validate_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecErrors([_spec_error(err) for err in exc.errors()]) from None


def _spec_error(err: dict[str, Any]) -> SpecError:
    # Discriminated unions add the tag ("classify") to the location; users never wrote it.
    loc = [str(p) for p in err["loc"] if p not in ("generate", "classify", "extract")]
    key = ".".join(loc)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required key is missing"
    elif err["type"] in ("int_type", "float_type", "bool_type", "string_type") and "input" in err:
        message = f"{message}, got {err['input']!r}"
    return SpecError(key, message, _FIXES.get(err["type"], ""))
