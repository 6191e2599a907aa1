"""The base of every spec section: strict types, no unknown keys, bounded numbers."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

# Past this, a count or size is a typo, and engines and Arrow overflow on it (2**63).
MAX_INT = 2**31 - 1


class Section(BaseModel):
    # strict: "8" is not 8; forbid: a misspelt key is an error, not silently ignored;
    # no inf or nan: no setting means anything at infinity (an infinite lease never ends).
    model_config = ConfigDict(
        extra="forbid", strict=True, populate_by_name=True, allow_inf_nan=False
    )

    @field_validator("*")
    @classmethod
    def _int_in_range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise ValueError(f"{value} is out of range (at most {MAX_INT:,})")
        return value


def without_defaults(data: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """``data`` less the keys that hold their default, so a new key's default leaves the
    dump, and so the fingerprint of every spec that does not set it, as it was."""
    return {k: v for k, v in data.items() if k not in defaults or v != defaults[k]}
