"""What every batch format becomes: a records table and a list of bad lines.

A format parser turns one decoded JSON line into a ``Request`` or raises ``BadRequest``;
``convert`` does the rest the same way for every format: reads the file line by line
(never whole), reports broken JSON, missing, non-string and repeated ``custom_id`` with
the line number, applies the served-model rule, and writes the runnable requests to
Parquet in batches.

The records table's columns: ``custom_id`` (the job's id column), ``line`` (1-based line
number in the input), ``model`` (the name the answer echoes), ``messages`` (a list of
{role, content}) or ``prompt`` (raw text, /v1/completions), and ``sampling`` (JSON, the
per-record override of the job's sampling: ``input.sampling_column``).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from nightshift.batch.jsonshape import MAX_DEPTH, nesting_depth, skeleton

ID_COLUMN = "custom_id"
SAMPLING_COLUMN = "sampling"
# What the provider's answer body repeats of its request (an embedding's encoding, a
# Responses body's instructions and metadata): JSON, read back only by the writer.
ECHO_COLUMN = "echo"
# /v1/embeddings: a line's several inputs run as records "custom_id" NUL index (a real
# custom_id holding a NUL is refused in such files); the writer gathers them again.
INPUT_MARK = "\x00"
ADAPTER_COLUMN = "adapter"  # the LoRA adapter a request's model names (--adapter), or null
TURN = pa.struct([("role", pa.string()), ("content", pa.string())])
_BASE = [
    pa.field(ID_COLUMN, pa.string()),
    pa.field("line", pa.int64()),
    pa.field("model", pa.string()),
]
_TAIL = [
    pa.field(SAMPLING_COLUMN, pa.string()),
    pa.field(ECHO_COLUMN, pa.string()),
    pa.field(ADAPTER_COLUMN, pa.string()),
]
SCHEMAS = {
    "messages": pa.schema([*_BASE, pa.field("messages", pa.list_(TURN)), *_TAIL]),
    "prompt": pa.schema([*_BASE, pa.field("prompt", pa.string()), *_TAIL]),
}
WRITE_BATCH = 4096
# The sampling keys of the contract with the run path (input.sampling_column).
SAMPLING_KEYS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "n",
    "json_schema",
    "json_object",
    "logprobs",
    "top_logprobs",
    "reasoning_budget",
)
# The deepest a request line may nest: real requests (a JSON schema in response_format
# included) stay far below, and every later stage (pydantic, json.dumps of the sampling,
# a schema compiled for guided decoding) recurses once a level.
# A line is decoded as strict UTF-8 (json.loads on bytes would let the UTF-8 form of a
# surrogate through), so a lone surrogate can only come from a \uD800-\uDFFF escape:
# the escape is looked for first, the strings only then.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\\ud800-\\udfff]")
_SURROGATE_PROBLEM = (
    "holds a lone UTF-16 surrogate (a \\ud800-\\udfff escape outside a pair), which is "
    "not text; send valid Unicode"
)


class BadRequest(Exception):
    """One line is not a request nightshift can run; ``code`` and ``param`` follow the
    providers' error fields."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None):
        self.code, self.param = code, param
        super().__init__(message)


@dataclass(frozen=True)
class BadLine:
    line: int
    custom_id: str | None
    code: str
    message: str
    param: str | None = None


@dataclass
class Request:
    """One runnable request: ``messages`` or ``prompt``, and its sampling overrides."""

    model: str | None
    sampling: dict[str, Any]
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    echo: dict[str, Any] | None = None  # what the answer's body repeats (ECHO_COLUMN)
    inputs: list[str] | None = None  # /v1/embeddings: several texts, a record each


class LineParser(Protocol):
    def custom_id(self, line: dict[str, Any]) -> Any: ...
    def parse(self, line: dict[str, Any], number: int) -> Request: ...


@dataclass
class Conversion:
    """What ``convert`` found: counts, the bad lines, and the input's digest."""

    lines: int = 0
    records: int = 0
    shape: str | None = None  # "messages" or "prompt"; None when no line can run
    bad: list[BadLine] = field(default_factory=list)
    sha256: str = ""


def sampling_json(values: dict[str, Any]) -> str:
    """The per-record sampling value: set keys only (null means the job's), canonical."""
    unknown = set(values) - set(SAMPLING_KEYS)
    assert not unknown, unknown  # a parser bug, never a user's mistake
    kept = {k: v for k, v in values.items() if v is not None}
    return json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def numbered_lines(stream: BinaryIO, digest: Any = None) -> Iterator[tuple[int, bytes]]:
    """Each non-blank line with its 1-based number; every byte also goes to ``digest``.

    The one line splitter of batch files: lines end at ``\\n`` only (a lone ``\\r`` is
    JSON whitespace inside a line), so counts, line numbers and conversion agree."""
    for number, raw in enumerate(stream, start=1):
        if digest is not None:
            digest.update(raw)
        if raw.strip():
            yield number, raw


def content_lines(content: bytes) -> Iterator[tuple[int, bytes]]:
    """``numbered_lines`` of a file held in memory."""
    return numbered_lines(io.BytesIO(content))


def load_line(raw: bytes) -> Any:
    """One line's JSON value, or ``BadRequest`` (``invalid_json``): a line that is not
    UTF-8, not JSON, or nested deeper than ``MAX_DEPTH`` (told before parsing, so no
    stage ever recurses deeply on it)."""
    if nesting_depth(skeleton(raw)) > MAX_DEPTH:
        raise BadRequest(f"not valid JSON: nested deeper than {MAX_DEPTH} levels", "invalid_json")
    try:
        text = raw.decode("utf-8").rstrip("\r\n")  # a mistake at its end is on this line
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at byte {exc.start + 1}"
        raise BadRequest(f"{problem}; save the file as UTF-8", "invalid_json") from None
    try:
        return json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise BadRequest(json_problem(exc, text), "invalid_json") from None
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"not valid JSON ({exc})"[:300], "invalid_json") from None


def json_problem(exc: json.JSONDecodeError, text: str) -> str:
    """A line's JSON mistake in plain words: what was expected, at which column, and the
    text there (the decoder's own message counts lines and characters of its input)."""
    what = exc.msg[0].lower() + exc.msg[1:]
    near = text[exc.pos : exc.pos + 20]
    if not near:
        return (
            f"not valid JSON: the line ends before its JSON does ({what} at column "
            f"{exc.colno}); is it cut short, or missing a closing }} or ]?"
        )
    return f"not valid JSON: {what} at column {exc.colno}, at {near!r}"


def lone_surrogate(value: Any, raw: bytes) -> str | None:
    """Where ``value`` (the JSON of ``raw``) holds a lone UTF-16 surrogate, which no
    text encoding can carry (the tokenizer, Parquet and the output file would each fail
    on it); None when nowhere."""
    if not _SURROGATE_ESCAPE.search(raw):
        return None
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str) and _LONE_SURROGATE.search(item):
            return where or "the line"
        if isinstance(item, dict):
            for key, inner in reversed(item.items()):
                if _LONE_SURROGATE.search(key):
                    return f"a key of {where or 'the line'}"
                stack.append((f"{where}.{key}" if where else key, inner))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", inner) for i, inner in reversed(list(enumerate(item))))
    return None


def convert(
    source: Path,
    parser: LineParser,
    served: list[str],
    out: Path,
    adapters: frozenset[str] = frozenset(),
) -> Conversion:
    """Read ``source`` line by line; write the runnable requests to ``out`` (Parquet).
    A request whose model is one of ``adapters`` runs under that LoRA adapter."""
    done = Conversion()
    seen: set[str] = set()
    writer: _Writer | None = None
    digest = hashlib.sha256()
    with open(source, "rb") as stream:
        for number, raw in numbered_lines(stream, digest):
            done.lines += 1
            outcome = _one_line(number, raw, parser, [*served, *sorted(adapters)], seen)
            if isinstance(outcome, BadLine):
                done.bad.append(outcome)
                continue
            custom_id, request = outcome
            shape = "messages" if request.messages is not None else "prompt"
            writer = writer or _Writer(out, shape, adapters)
            for record_id, one in split_inputs(custom_id, request):
                writer.add(record_id, number, one)
                done.records += 1
    done.sha256 = digest.hexdigest()
    if writer:
        writer.close()
        done.shape = writer.shape
    return done


def split_inputs(custom_id: str, request: Request) -> Iterator[tuple[str, Request]]:
    """A request's records: itself, or one per input of a several-input embeddings line."""
    if not request.inputs:
        yield custom_id, request
        return
    for index, text in enumerate(request.inputs):
        one = Request(request.model, request.sampling, prompt=text, echo=request.echo)
        yield f"{custom_id}{INPUT_MARK}{index}", one


def line_id(record_id: str) -> str:
    """The custom_id of the line a record comes from (``split_inputs``)."""
    return record_id.split(INPUT_MARK, 1)[0]


def _one_line(
    number: int, raw: bytes, parser: LineParser, served: list[str], seen: set[str]
) -> BadLine | tuple[str, Request]:
    try:
        line = load_line(raw)
    except BadRequest as exc:
        return BadLine(number, None, exc.code, f"line {number}: {exc}")
    if not isinstance(line, dict):
        return BadLine(number, None, "invalid_json", f"line {number}: not a JSON object")
    custom_id = parser.custom_id(line)
    if custom_id is None:
        return BadLine(number, None, "missing_custom_id", f"line {number}: no custom_id", ID_COLUMN)
    if not isinstance(custom_id, str) or not custom_id:
        problem = f"line {number}: custom_id must be a non-empty string, got {custom_id!r}"
        return BadLine(number, None, "invalid_custom_id", problem, ID_COLUMN)
    if _LONE_SURROGATE.search(custom_id):  # never echoed: no output line could hold it
        problem = f"line {number}: custom_id {_SURROGATE_PROBLEM}"
        return BadLine(number, None, "invalid_custom_id", problem, ID_COLUMN)
    if custom_id in seen:
        problem = (
            f"line {number}: custom_id {custom_id!r} repeats an earlier line's; only the first runs"
        )
        return BadLine(number, custom_id, "duplicate_custom_id", problem, ID_COLUMN)
    seen.add(custom_id)
    try:
        _refuse_surrogates(line, raw)
        request = parser.parse(line, number)
        check_model(request.model, served)
    except BadRequest as exc:
        return BadLine(number, custom_id, exc.code, f"line {number}: {exc}", exc.param)
    if hasattr(parser, "accepted"):  # what the file's lines must share, from a line that runs
        parser.accepted()
    request.model = request.model or served[0]
    return custom_id, request


def _refuse_surrogates(line: dict[str, Any], raw: bytes) -> None:
    where = lone_surrogate(line, raw)
    if where is not None:
        param = None if where.startswith(("a key", "the line")) else where
        raise BadRequest(f"{where} {_SURROGATE_PROBLEM}", param=param)


def served_names(model: str, given: list[str] | None = None) -> list[str]:
    """The names a request's ``model`` may give for the base model: ``given``, else the
    model folder's name as the user typed it (``--model ./model`` serves ``model``, also
    where ./model links to a folder named otherwise: request files are written against
    the name typed), or the folder's own name for a path such as ``.``."""
    if given:
        return list(dict.fromkeys(given))
    path = Path(model).expanduser()
    return [path.name or path.resolve().name]


def check_model(model: Any, served: list[str]) -> None:
    """The model rule: a request names one of the served names, or none at all."""
    if model is None or (isinstance(model, str) and model in served):
        return
    names = ", ".join(repr(n) for n in served)
    raise BadRequest(
        f"model {model!r} is not served here (served: {names}); name one of those or "
        "leave model out (--served-model-name sets the names)",
        "model_not_found",
        "model",
    )


class _Writer:
    def __init__(self, out: Path, shape: str, adapters: frozenset[str] = frozenset()) -> None:
        self.shape, self.rows, self.adapters = shape, [], adapters
        self.schema = SCHEMAS[shape]
        self.writer = pq.ParquetWriter(out, self.schema, compression="zstd")

    def add(self, custom_id: str, number: int, request: Request) -> None:
        body = request.messages if self.shape == "messages" else request.prompt
        if body is None:  # a file mixing chat and completion requests: one endpoint rule
            raise AssertionError("the parser must refuse a second request shape")
        self.rows.append(
            {
                ID_COLUMN: custom_id,
                "line": number,
                "model": request.model,
                self.shape: body,
                SAMPLING_COLUMN: sampling_json(request.sampling),
                ECHO_COLUMN: json.dumps(request.echo, ensure_ascii=False) if request.echo else None,
                ADAPTER_COLUMN: request.model if request.model in self.adapters else None,
            }
        )
        if len(self.rows) >= WRITE_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()


def validated(model: type[BaseModel], data: dict[str, Any], prefix: str) -> Any:
    """``data`` as ``model``, or a ``BadRequest`` naming the first bad parameter."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join([*([prefix] if prefix else []), *map(str, first["loc"])])
        problem = "is required" if first["type"] == "missing" else first["msg"]
        if first["type"] == "extra_forbidden":
            problem = "is not a known field"
        raise BadRequest(f"{param}: {problem}", param=param or None) from None


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The records table's rows (for writing results), in line order, read a batch at a
    time (the prompts are not read)."""
    file = pq.ParquetFile(path)
    names = file.schema_arrow.names  # a batch converted before the echo column: none
    columns = [ID_COLUMN, "line", "model", SAMPLING_COLUMN]
    columns += [c for c in (ECHO_COLUMN,) if c in names]
    for batch in file.iter_batches(batch_size=WRITE_BATCH, columns=columns):
        yield from batch.to_pylist()
