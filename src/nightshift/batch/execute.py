"""One batch record run as a nightshift job: the server's only call into ``run_batch``.

``run_batch`` (``nightshift batch run``) converts the provider file, runs it as a
resumable Prefect flow run in the batch's work folder and writes the provider's output
and errors files; run again on the same work folder it carries on where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nightshift.batch.store import BatchStore


@dataclass
class ServeSettings:
    """What ``nightshift batch serve`` was started with (the key never leaves memory)."""

    model: str
    store: str
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = field(default=None, repr=False)
    served_names: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    max_bytes: int = 200 * 1024 * 1024
    max_lines: int = 50_000

    def model_names(self) -> list[str]:
        """The names a request's ``model`` may give (``/v1/models`` lists them)."""
        return self.served_names or [self.model.rstrip("/").rsplit("/", 1)[-1]]


def input_uri(batches: BatchStore, record: dict[str, Any]) -> str:
    if record["provider"] == "openai":
        return batches.file_uri(record["input_file_id"])
    return batches.store.uri(batches.input_key(record["id"]))


def run_record(batches: BatchStore, record: dict[str, Any], settings: ServeSettings) -> dict:
    """Run (or resume) ``record``'s job; returns its counts and token usage."""
    from nightshift.batch.run import run_batch

    outcome = run_batch(
        input_uri(batches, record),
        batches.file_uri(record["output_file_id"]),
        model=settings.model,
        errors_url=batches.file_uri(record["error_file_id"]),
        fmt=record["provider"],
        served_names=settings.served_names or None,
        overrides=list(settings.overrides),
        work_url=batches.work_uri(record["id"]),
        progress=False,
    )
    return outcome_counts(outcome)


def outcome_counts(outcome: Any) -> dict[str, int]:
    """``BatchOutcome`` as the plain numbers a batch record keeps."""
    usage = getattr(outcome, "usage", None)

    def tokens(name: str) -> int:
        value = getattr(usage, name, None) if usage is not None else None
        if value is None and isinstance(usage, dict):
            value = usage.get(name)
        return int(value or getattr(outcome, f"{name}_tokens", 0) or 0)

    return {
        "total": int(outcome.total),
        "completed": int(outcome.completed),
        "failed": int(outcome.failed),
        "input_tokens": tokens("input"),
        "output_tokens": tokens("output"),
        "cached_tokens": tokens("cached"),
    }
