"""Object keys as every store takes them: relative "/" paths that cannot climb out."""

from __future__ import annotations


def check_key(key: str) -> str:
    """A key is a relative "/" path without empty, "." or ".." parts."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if any(part in ("", ".", "..") for part in key.split("/")) or "\\" in key:
        raise ValueError(f"bad object key {key!r}: use a relative a/b/c path")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix: "" or the start of a key (it may end with "/")."""
    if prefix:
        check_key(prefix.removesuffix("/"))
    return prefix
