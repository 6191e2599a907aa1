"""Write a batch's output (and errors) file from its bad lines and its job's answers.

Lines come in input order (a bad line where it stood); files are written whole to a
temp file and put in one step (``ObjectStore.put_file``: a rename locally, one PUT on
S3), so a reader sees the old file or the new one, never half; ERRORS before OUTPUT.
"""

from __future__ import annotations

import heapq
import io
import itertools
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from nightshift.batch.lineorder import FAILED, OK, in_order
from nightshift.batch.reasoning import thinking_tokens
from nightshift.batch.records import ECHO_COLUMN, ID_COLUMN, BadLine, line_id, read_lines
from nightshift.batch.results import (
    NOT_RUN,
    REJECT_CODES,
    Answer,
    Written,
    bad_line_answer,
    choices,
    dumps,
)
from nightshift.batch.shapes import Context, anthropic_line, openai_text
from nightshift.io.objectstore import open_store


def outcomes(
    records: Path | None, bad: list[BadLine], job: str | None, split: bool = True
) -> Iterator[tuple[int, str | None, str | None, Answer]]:
    """(line, custom_id, model, answer) for every non-blank input line, in line order,
    the job's answers streamed (``lineorder``): never all of them in memory. ``split``:
    the records are a /v1/embeddings file's, a several-input line one record per input
    (``records.split_inputs``); any other file's ids are the lines' own, byte for byte."""
    ran: Iterator[tuple[int, str | None, str | None, Answer]] = iter(())
    if records is not None:
        ran = _lines(_answered(records, job), split)
    refused = ((b.line, b.custom_id, None, bad_line_answer(b)) for b in bad)
    yield from heapq.merge(ran, refused, key=lambda item: item[0])


def _answered(records: Path, job: str | None) -> Iterator[tuple[dict[str, Any], Answer]]:
    """Each record's row (in line order) and its answer, or not-run."""
    answers = in_order(records, job)
    pending = next(answers, None)
    for position, record in enumerate(read_lines(records)):
        answer = None
        if pending is not None and pending[0] == position:
            answer = _answer(pending[1], pending[2])
            pending = next(answers, None)
        yield record, _echoed(answer, record)


def _answer(kind: int, row: dict[str, Any]) -> Answer:
    if kind == OK:
        return Answer(ok=True, row=row)
    if kind == FAILED:
        return Answer(False, status=500, code="server_error", message=row["error"])
    code, param = REJECT_CODES.get(row.get("reject_kind"), ("invalid_request", None))
    return Answer(False, code=code, message=row.get("reason") or "rejected", param=param)


def _lines(answered: Iterator[tuple[dict[str, Any], Answer]], split: bool):
    """(line, custom_id, model, answer) of each line that ran, its records gathered (a
    several-input embeddings line is one record per input, ``records.split_inputs``)."""
    for line, group in itertools.groupby(answered, key=lambda pair: pair[0]["line"]):
        group = list(group)
        first = group[0][0]
        custom_id = line_id(first[ID_COLUMN]) if split else first[ID_COLUMN]
        yield line, custom_id, first["model"], _gathered([a for _, a in group])


def _gathered(found: list[Answer]) -> Answer:
    """One line's answer from its records': the first failure, else one answer whose
    row sums their usage and lists their embeddings in input order."""
    failed = next((a for a in found if not a.ok), None)
    if len(found) == 1 or failed is not None:
        return failed or found[0]
    rows = [a.row for a in found]
    usage = {k: sum(r[k] or 0 for r in rows) for k in ("prompt_tokens", "output_tokens")}
    merged = {**rows[0], **usage, "cached_tokens": sum(r["cached_tokens"] or 0 for r in rows)}
    merged["embeddings"] = [r["embedding"] for r in rows]
    return Answer(True, row=merged, echo=found[0].echo)


def _echoed(answer: Answer | None, record: dict[str, Any]) -> Answer:
    """The record's answer (or not-run), with what its body repeats of the request."""
    answer = answer or _not_run()
    echo = record.get(ECHO_COLUMN)
    answer.echo = json.loads(echo) if echo else {}
    return answer


def _not_run() -> Answer:
    return Answer(False, status=500, code="not_run", message=NOT_RUN)


def write_outputs(
    ctx: Context,
    fmt: str,
    items: Iterator[tuple[int, str | None, str | None, Answer]],
    output_url: str,
    errors_url: str | None,
) -> Written:
    """Write OUTPUT (and, for OpenAI, ERRORS); the counts and usage they hold. OUTPUT is
    written straight into its store (``put_written``: no copy of a file of GBs)."""
    done = Written()
    with tempfile.TemporaryDirectory(prefix="nightshift-batch-out-") as tmp:
        err_path = Path(tmp, "errors.jsonl")

        def write(stream: BinaryIO) -> None:
            out = io.TextIOWrapper(stream, encoding="utf-8", newline="")
            with open(err_path, "w", encoding="utf-8", newline="") as err:
                _write_lines(ctx, fmt, _carried(items), out, err, done)
            out.detach()  # flushed; the stream is the store's to close
            # ERRORS first: OUTPUT is the sign the batch is done, so once it exists ERRORS
            # is whole too (a kill between the two leaves no OUTPUT; the rerun writes both).
            if errors_url is not None and fmt != "anthropic":
                put(err_path, errors_url)

        parent, _, name = output_url.rstrip("/").rpartition("/")
        try:
            open_store(parent or ".").put_written(name, write)
        except _ReadFailed as failed:  # not the store's to name as a write of OUTPUT
            raise failed.error from None
    return done


class _ReadFailed(Exception):
    """An OS error reading the job's answers, carried past the store's wrapping of the
    errors that writing OUTPUT raises."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


def _carried(items: Iterator[Any]) -> Iterator[Any]:
    try:
        yield from items
    except OSError as exc:
        raise _ReadFailed(exc) from exc


def _write_lines(ctx: Context, fmt: str, items, out: TextIO, err: TextIO, done: Written) -> None:
    for line, custom_id, model, answer in items:
        _count(done, answer)
        if not answer.ok and not answer.message.startswith("line "):
            answer.message = f"line {line}: {answer.message}"
        if fmt == "anthropic":
            out.write(dumps(anthropic_line(ctx, custom_id, line, model, answer)))
        else:
            target = out if answer.ok else err
            target.write(openai_text(ctx, custom_id, line, model, answer))


def _count(done: Written, answer: Answer) -> None:
    done.lines += 1
    if not answer.ok:
        done.failed += 1
        return
    row: dict[str, Any] = answer.row
    done.completed += 1
    done.input_tokens += row["prompt_tokens"] or 0
    done.output_tokens += row["output_tokens"] or 0
    done.cached_tokens += row["cached_tokens"] or 0
    done.reasoning_tokens += thinking_tokens(choices(row))


def put(path: Path, url: str) -> None:
    parent, _, name = url.rstrip("/").rpartition("/")
    open_store(parent or ".").put_file(name, path)
