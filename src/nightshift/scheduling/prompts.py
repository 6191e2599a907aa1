"""Turn a record into the text of its prompt.

Record values are data, never templates: a ticket body containing ``{subject}`` or
``{{ bos_token }}`` reaches the model exactly as written. That is why the template is
parsed once and filled by concatenation, never by ``str.format`` on user data or Jinja.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nightshift.errors import RecordError


@dataclass(frozen=True)
class Messages:
    """The prompt as chat messages: an optional shared system text and the user text."""

    system: str | None
    user: str


class PromptTemplate:
    """A parsed ``prompt.template``: literal pieces and the columns between them."""

    def __init__(self, template: str, system: str | None = None) -> None:
        self.system = system
        self._pieces: list[tuple[str, str | None]] = [
            (literal, name) for literal, name, _, _ in string.Formatter().parse(template)
        ]
        self.columns: list[str] = list(
            dict.fromkeys(name for _, name in self._pieces if name is not None)
        )

    def render(self, record: Mapping[str, Any]) -> Messages:
        """Fill the template from ``record``; a missing or null column is a RecordError."""
        out: list[str] = []
        for literal, name in self._pieces:
            out.append(literal)
            if name is None:
                continue
            if name not in record:
                raise RecordError(f"missing field {name!r}", "missing_field")
            value = record[name]
            if value is None:
                raise RecordError(f"field {name!r} is null", "null_field")
            out.append(as_text(value))
        return Messages(self.system, "".join(out))


def as_text(value: Any) -> str:
    """A column value as prompt text: nested values as JSON, bytes as UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)
