"""``nightshift batch run``: a provider batch file through a nightshift job, and back.

The work folder (default ``OUTPUT.nightshift/`` beside OUTPUT, local or S3) holds::

    WORK/input/records.parquet   the runnable requests (``batch.records``)
    WORK/input/bad-lines.json    the lines that cannot run, each with its problem
    WORK/job.yaml                the job spec that runs them (for reading; rebuilt each run)
    WORK/batch.json              the input's digest, format, served names, created time
                                 and the destinations it may replace (those it wrote);
                                 written last: no batch.json, no conversion
    WORK/job/                    the job's output: plan, checkpoints, markers, report

The input is converted once; a rerun finds batch.json, checks the input is the same
file (else refuses), and resumes the job, which skips what it committed. Once the job is
done, OUTPUT (and ERRORS) are written whole from its committed answers, so a finished
batch run again rewrites the same bytes. A rerun replaces only destinations batch.json
names; given another OUTPUT or ERRORS, it writes a new file but never replaces one.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nightshift.batch.anthropic import AnthropicParser
from nightshift.batch.destinations import (
    check_destination,
    check_work,
    claimed,
    default_errors_url,
    distinct,
    legacy_claims,
)
from nightshift.batch.jobspec import JOB_DIR, RECORDS, job_spec
from nightshift.batch.openai import EMBEDDINGS, OpenAIParser
from nightshift.batch.output import outcomes, write_outputs
from nightshift.batch.records import (
    BadLine,
    BadRequest,
    convert,
    load_line,
)
from nightshift.batch.records import served_names as base_names  # a parameter's name here
from nightshift.batch.results import Written
from nightshift.batch.shapes import Context
from nightshift.errors import ObjectNotFound, OutputExistsError, SpecError, UserError
from nightshift.io.objectstore import ObjectStore, file_sha256, open_store

MARKER = "batch.json"
BAD_LINES = "input/bad-lines.json"
SETTABLE_KEYS = ("model.max_model_len", "model.dtype", "cache.path")  # cache: answers only
SETTABLE_SECTIONS = ("engine.", "plan.", "run.", "cost.")


@dataclass
class BatchOutcome:
    """What a ``run_batch`` call did: requests (every non-blank input line) completed and
    failed, their tokens, the files written, the work folder and the job's report (None
    when no line could run). ``stopped``: a graceful stop; nothing written, rerun."""

    total: int = 0
    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of output_tokens: a reasoning model's thinking
    output: str = ""
    errors: str | None = None
    work: str = ""
    report: dict[str, Any] | None = None
    stopped: bool = False
    format: str = ""


def run_batch(
    input_url: str,
    output_url: str,
    *,
    model: str,
    errors_url: str | None = None,
    fmt: str = "auto",
    served_names: list[str] | None = None,
    overrides: list[str] | None = None,
    work_url: str | None = None,
    progress: bool = False,
    adapters: dict[str, str] | None = None,
) -> BatchOutcome:
    """Run one batch file to its output (and errors) file; rerun to resume. A request
    whose ``model`` is a key of ``adapters`` runs under that LoRA adapter (a folder)."""
    model_path, served, adapters = model_and_names(model, served_names, adapters)
    check_overrides(overrides or [])
    work_url = _checked_work_url(output_url, errors_url, work_url)
    work = open_store(work_url)
    with tempfile.TemporaryDirectory(prefix="nightshift-batch-") as folder:
        tmp = Path(folder)
        source = _local_input(input_url, tmp)
        marker = _found(work, source, fmt, served, input_url, work_url, adapters)
        fmt = marker["format"] if marker else _detect(source, input_url, fmt)
        errors_url = _errors_url(fmt, errors_url, output_url)
        given = {"OUTPUT": output_url, "--errors": errors_url}
        claims = _claim(work, marker, given, input_url, work_url)
        if marker is None:
            marker = _convert(work, source, fmt, served, input_url, tmp, claims, adapters)
        outcome = BatchOutcome(output=output_url, errors=errors_url, work=work_url)
        outcome.format = marker["format"]
        if marker["records"]:
            outcome.report = _run_job(work, marker, model_path, overrides or [], progress, tmp)
            if outcome.report.get("stopped"):
                outcome.stopped = True
                return outcome
        done = _write_files(work, marker, output_url, errors_url, tmp)
    return _with_counts(outcome, done)


def model_and_names(
    model: str, served_names: list[str] | None, adapters: dict[str, str] | None
) -> tuple[Path, list[str], dict[str, str]]:
    """The model's folder, the names a request's ``model`` may give for it
    (``records.served_names``), and the adapters checked against those names."""
    served = base_names(model, served_names)
    return _model_folder(model), served, check_adapters(adapters or {}, served)


def _checked_work_url(output_url: str, errors_url: str | None, work_url: str | None) -> str:
    """The work folder (``OUTPUT.nightshift`` unless given), once OUTPUT, ERRORS and it
    are checked as places this run may write: before any conversion starts."""
    for option, url in (("OUTPUT", output_url), ("--errors", errors_url)):
        if url is not None:
            check_destination(option, url)
    work_url = (work_url or f"{output_url.rstrip('/')}.nightshift").rstrip("/")
    check_work(work_url)
    return work_url


def _with_counts(outcome: BatchOutcome, done: Written) -> BatchOutcome:
    """``outcome`` with the request counts and tokens of the files written."""
    outcome.total, outcome.completed, outcome.failed = done.lines, done.completed, done.failed
    outcome.input_tokens, outcome.output_tokens = done.input_tokens, done.output_tokens
    outcome.cached_tokens, outcome.reasoning_tokens = done.cached_tokens, done.reasoning_tokens
    return outcome


def _write_files(
    work: ObjectStore, marker: dict, output_url: str, errors_url: str | None, tmp: Path
) -> Written:
    bad = [BadLine(**b) for b in json.loads(work.get_bytes(BAD_LINES))]
    records, job = None, None
    if marker["records"]:
        records, job = work.download(RECORDS, tmp / "records.parquet"), work.uri(JOB_DIR)
    ctx = Context(marker["sha256"], marker["created"], marker["endpoint"])
    answered = outcomes(records, bad, job, split=marker["endpoint"] == EMBEDDINGS)
    return write_outputs(ctx, marker["format"], answered, output_url, errors_url)


def check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in SETTABLE_KEYS or key.startswith(SETTABLE_SECTIONS):
            continue
        raise SpecError(
            "--set",
            f"{key or repr(item)} cannot be set for a batch",
            "batch run takes model.max_model_len, model.dtype, cache.path, engine.*, plan.*, "
            "run.* and cost.*; "
            "each request carries its own sampling",
        )


def _model_folder(model: str) -> Path:
    path = Path(model).expanduser()
    if not path.is_dir():
        problem = "is a file" if path.exists() else "does not exist"
        raise UserError(f"--model: {model} {problem}; give the folder of a local model")
    return path.resolve()


def _local_input(input_url: str, tmp: Path) -> Path:
    if input_url.startswith("s3://"):
        parent, _, name = input_url.rpartition("/")
        try:
            return open_store(parent).download(name, tmp / "input.jsonl")
        except ObjectNotFound:
            raise UserError(f"INPUT: {input_url} does not exist") from None
        except ValueError:  # a key no store takes (a backslash, an empty part)
            raise UserError(f"INPUT: {input_url} names no object") from None
    path = Path(input_url).expanduser()
    if not path.is_file():
        raise UserError(
            f"INPUT: {input_url} {'is a directory' if path.is_dir() else 'does not exist'}"
        )
    return path


def _found(
    work: ObjectStore,
    source: Path,
    fmt: str,
    served: list[str],
    input_url: str,
    work_url: str,
    adapters: dict[str, str],
) -> dict[str, Any] | None:
    """The work folder's batch.json, checked against this run (same input and settings);
    None for a new batch."""
    try:
        marker = json.loads(work.get_bytes(MARKER))
    except ObjectNotFound:
        return None
    _same_batch(marker, file_sha256(source), fmt, served, input_url, work_url)
    if sorted(marker.get("adapters") or {}) != sorted(adapters):
        raise UserError(
            f"--adapter: this batch was read with adapters {sorted(marker.get('adapters') or {})}; "
            f"remove {work_url} (or give another OUTPUT) to start a new batch"
        )
    marker["adapters"] = adapters  # the folders may move; their content is fingerprinted
    return marker


def check_adapters(adapters: dict[str, str], served: list[str]) -> dict[str, str]:
    """--adapter NAME=PATH: each a folder with adapter_config.json, named apart from
    the served names; the folders as absolute paths."""
    found = {}
    for name, path in adapters.items():
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise UserError(f"--adapter {name}={path}: no adapter_config.json in that folder")
        if name in served:
            raise UserError(f"--adapter {name}: the name is the base model's; pick another")
        found[name] = str(folder.resolve())
    return found


def _claim(
    work: ObjectStore, marker: dict | None, given: dict, input_url: str, work_url: str
) -> list[str]:
    """The destinations this batch may write (refusing an existing file it never wrote),
    recorded in its marker before anything is written there; a new batch's go into the
    marker its conversion writes."""
    if given["--errors"] is not None:
        check_destination("--errors", given["--errors"])  # the default one too
    distinct(input_url, given["OUTPUT"], given["--errors"])
    wrote = [] if marker is None else marker.get("destinations", legacy_claims(work_url))
    claims = claimed(wrote, given, work_url)
    if marker is not None and claims != marker.get("destinations"):
        marker["destinations"] = claims
        work.put_bytes(MARKER, json.dumps(marker, indent=2).encode())
    return claims


def _convert(
    work: ObjectStore,
    source: Path,
    fmt: str,
    served: list[str],
    input_url: str,
    tmp: Path,
    claims: list[str],
    adapters: dict[str, str],
) -> dict[str, Any]:
    """Convert a new batch's input into the work folder; its batch.json, written last."""
    digest = file_sha256(source)
    parser = _parser(fmt)
    done = convert(source, parser, served, tmp / "records.parquet", frozenset(adapters))
    if done.sha256 != digest:
        raise UserError(f"INPUT: {input_url} changed while it was read; run again")
    if done.records:
        work.put_file(RECORDS, tmp / "records.parquet")
    work.put_bytes(BAD_LINES, json.dumps([b.__dict__ for b in done.bad], indent=1).encode())
    marker = {
        "input": input_url,
        "sha256": digest,
        "format": parser.format,
        "endpoint": getattr(parser, "endpoint", None) or "anthropic",
        # /v1/embeddings: the one vector size its lines ask for (None: the model's)
        "dimensions": (getattr(parser, "dimensions", None) or (None,))[0],
        "shape": done.shape,
        "served": served,
        "lines": done.lines,
        "records": done.records,
        "bad_lines": len(done.bad),
        "created": int(time.time()),
        "destinations": claims,  # the files this batch may replace: those it writes
        "adapters": adapters,  # --adapter: request model names that run a LoRA adapter
    }
    work.put_bytes(MARKER, json.dumps(marker, indent=2).encode())
    return marker


def _errors_url(fmt: str, errors_url: str | None, output_url: str) -> str | None:
    if fmt != "anthropic":
        return errors_url or default_errors_url(output_url)
    if errors_url:
        raise UserError(
            "--errors: an Anthropic batch's results hold every request, errored ones too, "
            "in OUTPUT; leave --errors out"
        )
    return None


def _same_batch(
    marker: dict, digest: str, fmt: str, served: list[str], input_url: str, work_url: str
) -> None:
    start_over = f"remove {work_url} (or give another OUTPUT) to start a new batch"
    if marker["sha256"] != digest:
        raise UserError(
            f"INPUT: {input_url} is not the file this batch started from "
            f"({marker['input']}, sha256 {marker['sha256'][:12]}...): it changed since; "
            f"{start_over}"
        )
    if fmt not in ("auto", marker["format"]):
        raise UserError(f"--format {fmt}: this batch was read as {marker['format']}; {start_over}")
    if served != marker["served"]:
        raise UserError(
            f"--served-model-name: this batch was checked against {marker['served']}; {start_over}"
        )


def _detect(source: Path, input_url: str, fmt: str) -> str:
    """The format of a new batch's input: ``fmt``, or told from its first request line."""
    found, anything = None, False
    with open(source, "rb") as stream:
        for raw in stream:
            anything = anything or bool(raw.strip())
            try:  # the loader conversion uses: a line too deep is no request here either
                line = load_line(raw)
            except BadRequest:
                continue
            if isinstance(line, dict) and "params" in line:
                found = found or "anthropic"
            elif isinstance(line, dict) and ("body" in line or "url" in line):
                found = found or "openai"
            if found and fmt == "auto":
                break
    if not anything:
        raise UserError(f"INPUT: {input_url} holds no request lines (it is empty)")
    if fmt != "auto":
        return fmt
    if found is None:
        raise UserError(
            f"INPUT: {input_url}: no line is a batch request (a JSON object with body and "
            "url, or params); is it a JSONL batch file? --format names its format"
        )
    return found


def _parser(fmt: str) -> OpenAIParser | AnthropicParser:
    if fmt == "openai":
        return OpenAIParser()
    if fmt == "anthropic":
        return AnthropicParser()
    raise UserError(f"--format {fmt!r}: use openai, anthropic or auto")


def _run_job(
    work: ObjectStore, marker: dict, model: Path, overrides: list[str], progress: bool, tmp: Path
) -> dict[str, Any]:
    from nightshift.pipelines.local import run_flow_once

    spec = job_spec(work, marker, model, overrides)
    text = yaml.safe_dump(spec, sort_keys=False)
    work.put_bytes("job.yaml", text.encode())
    path = tmp / "job.yaml"
    path.write_text(text)
    try:
        return run_flow_once(str(path), None, progress=progress)
    except OutputExistsError as exc:  # its advice names jobs run's options: say ours
        changed = re.search(r"\(([^()]*) changed\)", str(exc))
        what = f" ({changed.group(1)} changed)" if changed else ""
        raise UserError(
            f"this batch started with other settings{what}; rerun it with the --set it "
            f"started with, or remove {work.root} to start it over"
        ) from None
