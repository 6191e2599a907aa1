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
        checked = [self._check(c) for c in records[self.column].to_list()]
        return pl.DataFrame(
            {"reject_kind": [k for k, _ in checked], "reason": [r for _, r in checked]},
            schema={"reject_kind": pl.String, "reason": pl.String},
        )

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
            self._frame(turns)
        except ValueError as exc:
            return REFUSED, str(exc)
        return None, None

    def _frame(self, turns: list[dict[str, Any]]) -> list[str]:
        roles = [t["role"] for t in turns]
        system = self.system if "system" not in roles else None
        return self.encoder.conversation_frame(system, roles)

    def pieces(self, records: pl.DataFrame) -> list[pl.Series]:
        rows = []
        for turns in records[self.column].to_list():
            frame = self._frame(turns)
            row = [frame[0]]
            for content, after in zip((t["content"] for t in turns), frame[1:], strict=True):
                row += [content, after]
            rows.append(row)
        width = max((len(r) for r in rows), default=1)
        padded = [[r[0], *[""] * (width - len(r)), *r[1:]] for r in rows]
        return [pl.Series(column, dtype=pl.String) for column in zip(*padded, strict=True)]


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
