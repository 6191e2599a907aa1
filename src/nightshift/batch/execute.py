"""One batch record run as a nightshift job: the server's only call into ``run_batch``.

``run_batch`` (``nightshift batch run``) converts the provider file, runs it as a
resumable Prefect flow run in the batch's work folder and writes the provider's output
and errors files; run again on the same work folder it carries on where it stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nightshift.batch.lifecycle import DAY_S
from nightshift.batch.progress import EXPIRED_MESSAGE, LiveCounts, expired
from nightshift.batch.records import served_names
from nightshift.batch.store import BatchStore
from nightshift.errors import SpecErrors, UserError


class JobStopped(Exception):
    """The batch's job stopped before its end, and not for a cancel."""


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
    public_url: str | None = None  # the base of links handed out; else the bind address
    expire_after_s: int = DAY_S  # a batch's completion window (the providers': 24 hours)
    adapters: dict[str, str] = field(default_factory=dict)  # model name -> LoRA folder

    def model_names(self) -> list[str]:
        """The names a request's ``model`` may give (``/v1/models`` lists them): the
        base model's, then the adapters'."""
        return [*served_names(self.model, self.served_names), *self.adapters]


def check_settings(settings: ServeSettings) -> None:
    """Refuse, before anything listens, what would fail every batch: a missing model
    folder or adapter, a ``--set`` a batch does not take, and a job spec those make
    invalid (each one message naming the option)."""
    import tempfile

    from nightshift.batch.jobspec import job_spec
    from nightshift.batch.run import check_overrides, model_and_names
    from nightshift.io.objectstore import open_store

    names = settings.served_names or None
    model, _, adapters = model_and_names(settings.model, names, settings.adapters)
    check_overrides(settings.overrides)
    marker = {
        "input": "batch.jsonl",
        "shape": "messages",
        "endpoint": "/v1/chat/completions",
        "adapters": adapters,
    }
    with tempfile.TemporaryDirectory(prefix="nightshift-check-") as tmp:
        try:
            job_spec(open_store(tmp), marker, model, list(settings.overrides))
        except SpecErrors as exc:  # every batch's job would be refused: say it in one line
            raise UserError(f"--set {'; '.join(map(str, exc.errors))}") from None


def input_uri(batches: BatchStore, record: dict[str, Any]) -> str:
    if record["provider"] == "openai":
        return batches.file_uri(record["input_file_id"])
    return batches.store.uri(batches.input_key(record["id"]))


def errors_uri(batches: BatchStore, record: dict[str, Any]) -> str | None:
    """OpenAI batches have an errors file; Anthropic results hold errored requests too."""
    if record["provider"] != "openai":
        return None
    return batches.file_uri(record["error_file_id"])


def run_record(batches: BatchStore, record: dict[str, Any], settings: ServeSettings) -> dict:
    """Run (or resume) ``record``'s job; returns its counts and token usage."""
    from nightshift.batch.run import run_batch

    work = batches.work_uri(record["id"])
    with LiveCounts(batches, record, work):  # clients poll the record for progress
        outcome = run_batch(
            input_uri(batches, record),
            batches.file_uri(record["output_file_id"]),
            model=settings.model,
            errors_url=errors_uri(batches, record),
            fmt=record["provider"],
            served_names=settings.served_names or None,
            overrides=list(settings.overrides),
            work_url=work,
            progress=False,
            adapters=settings.adapters,
        )
    if outcome.stopped:
        current = batches.batch(record["id"]) or record
        if expired(current) and current["status"] != "cancelling":
            return write_partial(batches, record, expiring=True) | {"how": "expired"}
        if current["status"] != "cancelling":
            raise JobStopped(record["id"])  # a shutdown: the next start resumes it
        return write_partial(batches, record)
    return outcome_counts(outcome)


def write_partial(
    batches: BatchStore, record: dict[str, Any], expiring: bool = False
) -> dict[str, int]:
    """A cancelled or expired batch's results: every line its job answered (committed
    shards and the checkpoints of the one it stopped in, as the providers return the
    work already done) and the bad lines; for the requests it never ran, none when
    cancelled, a ``batch_expired`` error each when expired. ``run_batch`` writes results
    only once a job is done, so this is its last step, given the answers so far."""
    import json
    import tempfile
    from pathlib import Path

    from nightshift.batch.openai import EMBEDDINGS
    from nightshift.batch.output import outcomes, write_outputs
    from nightshift.batch.records import BadLine
    from nightshift.batch.run import BAD_LINES, JOB_DIR, MARKER, RECORDS
    from nightshift.batch.shapes import Context
    from nightshift.io.objectstore import open_store

    work = open_store(batches.work_uri(record["id"]))
    marker = json.loads(work.get_bytes(MARKER))
    bad = [BadLine(**b) for b in json.loads(work.get_bytes(BAD_LINES))]
    left = [0]  # the requests never run
    with tempfile.TemporaryDirectory(prefix="nightshift-cancel-") as tmp:
        records = work.download(RECORDS, Path(tmp, "r.parquet")) if marker["records"] else None
        ctx = Context(marker["sha256"], marker["created"], marker["endpoint"])
        split = marker["endpoint"] == EMBEDDINGS
        ran = outcomes(records, bad, work.uri(JOB_DIR), split=split)
        done = write_outputs(
            ctx,
            marker["format"],
            _kept(ran, expiring, left),
            batches.file_uri(record["output_file_id"]),
            errors_uri(batches, record),
        )
    counts = outcome_counts(done) | {"total": record["request_counts"]["total"]}
    return counts | ({"expired": left[0]} if expiring else {})


def _kept(items: Iterator[tuple], expiring: bool, left: list[int]) -> Iterator[tuple]:
    """The lines a stopped batch's results hold: the answered ones, and when it expired,
    a ``batch_expired`` line for each request not run (counted in ``left``)."""
    for item in items:
        if not _not_run(item[3]):
            yield item
            continue
        left[0] += 1
        if expiring:
            yield (*item[:3], _expired_answer())


def _not_run(answer: Any) -> bool:
    return not answer.ok and answer.code == "not_run"


def _expired_answer() -> Any:
    from nightshift.batch.results import Answer

    return Answer(False, status=500, code="batch_expired", message=EXPIRED_MESSAGE)


def outcome_counts(outcome: Any) -> dict[str, int]:
    """``BatchOutcome`` (or ``write_outputs``' counts) as the numbers a record keeps."""
    names = ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens")
    counts = {name: int(getattr(outcome, name)) for name in names}
    counts["reasoning_tokens"] = int(getattr(outcome, "reasoning_tokens", 0))  # of output
    total = outcome.total if hasattr(outcome, "total") else outcome.lines
    return {"total": int(total), **counts}


def input_problems(batches: BatchStore, record: dict[str, Any]) -> list[dict[str, Any]]:
    """Why an OpenAI batch's input cannot run at all (OpenAI fails such a batch while
    validating, with ``errors``): an empty file, a file with no JSON line, or a file
    whose requests are for another endpoint than the batch's. Single bad lines are not
    problems here: they get their lines in the errors file."""
    from nightshift.batch.openai import OpenAIParser
    from nightshift.batch.records import BadRequest, content_lines, load_line

    if record["provider"] != "openai":
        return []
    parser, lines, objects = OpenAIParser(), 0, 0
    for number, raw in content_lines(batches.file_content(record["input_file_id"])):
        lines += 1
        try:  # the loader conversion uses: a line too deep for it is no object here either
            line = load_line(raw)
        except BadRequest:
            continue
        if not isinstance(line, dict):
            continue
        objects += 1
        try:
            parser.parse(line, number)
        except BadRequest:
            continue
        if parser.endpoint is not None:  # the endpoint the file's requests are run as
            if parser.endpoint == record["endpoint"]:
                return []
            message = (
                f"line {number}: url {parser.endpoint!r} does not match the batch's "
                f"endpoint {record['endpoint']!r}; every request must be for it"
            )
            return [_problem("mismatched_endpoint", message, number, "url")]
    if lines == 0:
        message = "the input file is empty: a batch needs at least one request"
        return [_problem("empty_file", message)]
    if objects == 0:
        message = "the input file is not JSONL: no line is a JSON object"
        return [_problem("invalid_json_line", message, 1)]
    return []


def _problem(code: str, message: str, line: int | None = None, param: str | None = None):
    return {"code": code, "message": message, "line": line, "param": param}
