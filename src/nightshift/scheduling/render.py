"""Records as prompt pieces: the one rendering the plan measures and the run sends.

A prompt is a row of pieces ``[t0, x1, t1, ..., xn, tn]`` (see
``PromptEncoder.encode_pieces``): even places are the chat template's own text, odd
places the record's text. Both prompt shapes become rows of one width per batch, one
polars column per place, so the plan can measure millions of them column by column:

* ``prompt.template``: the chat frame around the user message (none but BOS with
  ``prompt.chat_template: false``), the template's head, and one record text per field
  (its value and the literal after it), with an empty frame piece between fields;
* ``prompt.messages_column``: the chat template's text around each turn's content. A
  shorter conversation is padded with empty pieces after its first frame piece, so every
  row's last record text is its last turn.

A record that cannot become a prompt (a null field, a bad conversation) gets a
``reject_kind`` and a reason instead, and the job goes on without it.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import SpecError
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.prompts import PromptTemplate

ROLES = frozenset({"system", "user", "assistant"})
# reject kinds of a bad conversation (a null column value is "null_field", as for fields)
EMPTY, UNKNOWN_ROLE, BAD_CONTENT, REFUSED, UNSUPPORTED = (
    "empty_conversation",
    "unknown_role",
    "bad_content",
    "chat_template_refused",
    "unsupported_field",
)
TURN_FIELDS = frozenset({"role", "content"})
# A turn's other field holding one of these asks for nothing (a Parquet struct gives every
# turn each field of the column, null where a turn has none).
ABSENT: tuple = (None, "", [])


class TemplateRenderer:
    """``prompt.template`` (and ``prompt.system``) as pieces."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder) -> None:
        self.template = PromptTemplate(spec.prompt.template or "", spec.prompt.system)
        self.columns = self.template.columns
        if spec.prompt.chat_template:
            self.before, self.after = encoder.template_frame(spec.prompt.system)
        else:  # raw text: no chat frame around the template
            self.before, self.after = encoder.raw_frame()

    def problems(self, records: pl.DataFrame) -> pl.DataFrame:
        """Per record: ``reject_kind`` and ``reason`` (both null for a record that can run)."""
        missing = self.template.null_fields(records)
        return pl.DataFrame({"m": missing}).select(
            pl.when(pl.col("m").is_not_null()).then(pl.lit("null_field")).alias("reject_kind"),
            pl.format("field '{}' is null", "m").alias("reason"),
        )

    def pieces(self, records: pl.DataFrame) -> list[pl.Series]:
        """The pieces of records that can run, one column per place."""
        n = records.height
        frame = [pl.Series([text] * n, dtype=pl.String) for text in (self.before, self.after)]
        head = pl.Series([self.template.head] * n, dtype=pl.String)
        out = [frame[0], head]
        for texts in self.template.segment_texts(records):
            out += [pl.Series([""] * n, dtype=pl.String), texts]
        return [*out, frame[1]]


class ConversationRenderer:
    """``prompt.messages_column`` as pieces, each conversation in the model's chat template
    with the generation prompt appended. ``prompt.system`` is the first turn of a
    conversation that has no system turn; a conversation's own system turn wins."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder) -> None:
        if not encoder.has_chat_template:
            raise SpecError(
                "prompt.messages_column",
                "the model's tokenizer has no chat template to render conversations with",
                "give a chat model (or model.tokenizer with a chat template), or use "
                "prompt.template",
            )
        self.column = spec.prompt.messages_column or ""
        self.columns = [self.column]
        self.system = spec.prompt.system
        self.encoder = encoder

    def problems(self, records: pl.DataFrame) -> pl.DataFrame:
        """Per record: ``reject_kind`` and ``reason``. Columnar checks pass the usual
        conversation; only the rest are checked one by one, for the exact reason."""
        column = records[self.column]
        doubtful = (~self._plainly_fine(column)).arg_true()
        checked = [self._check(turns) for turns in column.gather(doubtful).to_list()]
        blank = pl.Series([None] * column.len(), dtype=pl.String)
        return pl.DataFrame(
            {
                "reject_kind": blank.scatter(doubtful, [k for k, _ in checked]),
                "reason": blank.clone().scatter(doubtful, [r for _, r in checked]),
            }
        )

    def _plainly_fine(self, column: pl.Series) -> pl.Series:
        """Conversations of plain turns (only text ``role`` and ``content`` fields) whose
        every turn has a known role and text, in an order the chat template renders."""
        dtype = column.dtype
        inner = dtype.inner if isinstance(dtype, pl.List) else None
        fields = {f.name: f.dtype for f in inner.fields} if isinstance(inner, pl.Struct) else {}
        if fields != {"role": pl.String, "content": pl.String}:
            return pl.Series([False] * column.len(), dtype=pl.Boolean)  # each checked alone
        turn = pl.element()
        good_turn = (
            turn.struct.field("role").is_in(sorted(ROLES))
            & turn.struct.field("content").is_not_null()
        )
        frame = pl.DataFrame({"t": column}).select(
            (pl.col("t").list.len() > 0)
            .and_(pl.col("t").list.eval(good_turn.fill_null(False)).list.all())
            .fill_null(False)
            .alias("ok"),
            _roles("t"),
        )
        refused = [k for k in frame.filter("ok")["_roles"].unique() if self._refuses(k)]
        return frame["ok"] & ~frame["_roles"].is_in(refused)

    def _refuses(self, roles: str) -> bool:
        try:
            self._frame(roles.split(ROLE_JOIN))
        except ValueError:
            return True
        return False

    def _check(self, turns: list[dict[str, Any]] | None) -> tuple[str | None, str | None]:
        if turns is None:
            return "null_field", f"field '{self.column}' is null"
        if not turns:
            return EMPTY, f"{self.column} holds no turns"
        for k, turn in enumerate(turns, start=1):
            role = (turn or {}).get("role")
            if role not in ROLES:
                return UNKNOWN_ROLE, f"turn {k} has role {role!r}; roles are " + ", ".join(
                    sorted(ROLES)
                )
            content = turn.get("content")
            if not isinstance(content, str):
                what = "null" if content is None else f"of type {type(content).__name__}"
                return BAD_CONTENT, f"turn {k}'s content is {what}, not text"
            extra = _extra_field(turn)
            if extra is not None:
                return UNSUPPORTED, (
                    f"turn {k} has {extra!r}, which nightshift cannot honour: the chat "
                    "template renders each turn's role and content only (leave it out, or "
                    "put it in the content)"
                )
        try:
            self._frame([t["role"] for t in turns])
        except ValueError as exc:
            return REFUSED, str(exc)
        return None, None

    def _frame(self, roles: list[str]) -> list[str]:
        """The chat template's text around each turn of a conversation of these roles."""
        system = self.system if "system" not in roles else None
        return self.encoder.conversation_frame(system, roles)

    def pieces(self, records: pl.DataFrame) -> list[pl.Series]:
        """Column by column: each distinct sequence of roles has its frame rendered once;
        conversations of each length are laid out together, then put back in order."""
        column = records[self.column]
        if column.is_empty():
            return []
        if isinstance(column.dtype, pl.Array):  # a fixed-size list of turns
            column = column.cast(pl.List(column.dtype.inner))
        frame = pl.DataFrame({"t": column}).with_row_index("_i")
        frame = frame.with_columns(pl.col("t").list.len().alias("_n"), _roles("t"))
        frames = {k: self._frame(k.split(ROLE_JOIN)) for k in frame["_roles"].unique()}
        width = 2 * int(frame["_n"].max()) + 1  # type: ignore[arg-type]
        laid = [_laid_out(part, frames, width) for _, part in frame.group_by("_n")]
        rows = pl.concat(laid).sort("_i")
        return [rows[f"_{j}"] for j in range(width)]


ROLE_JOIN = "\n"  # no role holds it (roles are checked before a frame is asked for)


def _roles(column: str) -> pl.Expr:
    """A conversation's roles as one text, the key of its chat frame."""
    roles = pl.col(column).list.eval(pl.element().struct.field("role").cast(pl.String))
    return roles.list.join(ROLE_JOIN).alias("_roles")


def _laid_out(part: pl.DataFrame, frames: dict[str, list[str]], width: int) -> pl.DataFrame:
    """Conversations of one length as ``width`` pieces each: the first frame piece, empty
    padding, then each turn's content and the frame text after it."""
    turns = int(part["_n"][0])
    keys = part["_roles"]

    def frame_piece(k: int) -> pl.Series:
        texts = {key: frames[key][k] for key in keys.unique()}
        return keys.replace_strict(texts, return_dtype=pl.String)

    contents = part["t"].list
    row = [frame_piece(0), *[pl.repeat("", part.height, eager=True)] * (width - 2 * turns - 1)]
    for k in range(1, turns + 1):
        row += [contents.get(k - 1).struct.field("content").cast(pl.String), frame_piece(k)]
    columns = {f"_{j}": piece.cast(pl.String) for j, piece in enumerate(row)}
    return pl.DataFrame({"_i": part["_i"], **columns})


def _extra_field(turn: dict[str, Any]) -> str | None:
    """The first field of ``turn`` besides role and content that holds something (a
    ``name``, ``tool_calls``...): rendering would drop it, so its record is rejected."""
    for key, value in turn.items():
        if key not in TURN_FIELDS and value not in ABSENT:
            return key
    return None


Renderer = TemplateRenderer | ConversationRenderer


def renderer_for(spec: JobSpec, encoder: PromptEncoder) -> Renderer:
    if spec.prompt.messages_column is not None:
        return ConversationRenderer(spec, encoder)
    return TemplateRenderer(spec, encoder)


def rows(pieces: list[pl.Series]) -> list[list[str]]:
    """Column-wise pieces as one row of pieces per prompt (for the encoder)."""
    return [list(row) for row in zip(*(p.to_list() for p in pieces), strict=True)]


def prompt_text(pieces: list[pl.Series]) -> pl.Series:
    """Each prompt's whole text, its pieces joined."""
    return pl.DataFrame(pieces, schema=[f"_{k}" for k in range(len(pieces))]).select(
        pl.concat_str(pl.all()).alias("text")
    )["text"]
