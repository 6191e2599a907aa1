"""Read a job spec from YAML, apply ``--set`` overrides, and validate it.

Every failure becomes a ``SpecError`` naming the dotted key and what to do about it,
so the CLI can print one clear line per problem instead of a traceback.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nightshift.errors import SpecError, SpecErrors
from nightshift.jobs.secrets import looks_secret
from nightshift.jobs.spec import JobSpec
from nightshift.jobs.taskspec import ClassifyTask, EmbedTask, ExtractTask, GenerateTask

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
    "finite_number": "not .inf or .nan",
}


# task.kind -> its section: pydantic names the kind in an error's location
TASK_KINDS = {"generate": GenerateTask, "classify": ClassifyTask, "extract": ExtractTask,
              "embed": EmbedTask}  # fmt: skip


def load_spec(path: str | Path, overrides: list[str] | None = None) -> JobSpec:
    """Load, override and validate a spec; raise ``SpecError(s)`` on any problem."""
    data = read_yaml(Path(path))
    for item in overrides or []:
        apply_override(data, item)
    return validate_spec(data)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice (YAML would keep the last silently)."""


def _mapping_without_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            kind = "list" if isinstance(key, list) else "mapping"
            problem = f"the key {_short(key)} at line {line} is a {kind}"
            raise SpecError("", problem, "a key must be plain text; remove the [ ] or { }")
        if key in seen:
            raise SpecError(str(key), f"is given twice (again at line {line})", "keep one")
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates
)


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "does not exist"
        raise SpecError("", f"job spec {path} {problem}", "give the path of a YAML file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except UnicodeDecodeError:
        raise SpecError("", f"{path} is not UTF-8 text", "save the spec as UTF-8") from None
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
        # A mistyped secret (a space for the =) must not be echoed to the terminal.
        shown = (
            "an override that names a secret (not shown)"
            if any(map(looks_secret, re.split(r"[.\s:]+", item)))
            else repr(item)
        )
        raise SpecError(
            "--set", f"{shown} is not key.path=value", "for example sampling.max_tokens=16"
        )
    set_key(data, key.strip(), override_value(raw))


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` (``engine.max_num_seqs``) of the spec mapping ``data``."""
    parts = key.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise SpecError(key, f"cannot set inside {where}, which is not a mapping")
        node = child
    node[parts[-1]] = value


def override_value(raw: str) -> Any:
    """YAML-typed (``8`` is a number, ``[a, b]`` a list), but text stays exactly as typed:
    ``Use label #2`` is not cut at a YAML comment."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, str) or (value is None and raw.strip() not in ("null", "~")):
        return raw
    return value


def validate_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecErrors([_spec_error(err) for err in exc.errors()]) from None


def _spec_error(err: dict[str, Any]) -> SpecError:
    # Discriminated unions add the tag ("classify") to the location; users never wrote it.
    loc = [str(p) for i, p in enumerate(err["loc"]) if not _is_task_tag(err["loc"], i)]
    subkey = getattr(err.get("ctx", {}).get("error"), "subkey", None)
    if subkey:  # a validator of a whole mapping that names the key inside it
        loc.append(subkey)
    key = ".".join(loc)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown key"
        near = difflib.get_close_matches(loc[-1], _keys_beside(err["loc"]), n=1, cutoff=0.6)
        if near:  # a misspelling: name the key it most likely meant
            return SpecError(key, message, f"did you mean {'.'.join([*loc[:-1], near[0]])}?")
    elif err["type"] == "missing":
        message = "required key is missing"
    elif err["type"] in ("int_type", "float_type", "bool_type", "string_type") and "input" in err:
        message = f"{message}, got {err['input']!r}"
    return SpecError(key, message, _FIXES.get(err["type"], ""))


def _is_task_tag(loc: tuple, i: int) -> bool:
    return i > 0 and loc[i - 1] == "task" and loc[i] in TASK_KINDS


def _keys_beside(loc: tuple) -> list[str]:
    """The keys the spec takes where the last part of ``loc`` was written."""
    model: type[BaseModel] = JobSpec
    for i, part in enumerate(loc[:-1]):
        if _is_task_tag(loc, i):
            model = TASK_KINDS[part]
            continue
        fields = {f.alias or n: f for n, f in model.model_fields.items()}
        found = _models_in(fields[part].annotation) if part in fields else []
        if len(found) == 1:
            model = found[0]
        elif part != "task":  # the task's kind comes next in the location
            return []
    return [f.alias or n for n, f in model.model_fields.items()]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The spec sections an annotation may hold (``X | None``, a union of tasks)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]
