"""Conversations become pieces column by column (``scheduling.render``).

The plan measures, dedups and orders millions of conversations, so the renderer checks
and lays them out with polars, one chat frame per distinct sequence of roles. These
tests hold it to what a row-by-row rendering gives: each record's pieces join to its
conversation in the template, the last record text is its last turn, and a record that
cannot run is named with the reason of its first bad turn.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import polars as pl
import pyarrow as pa

from nightshift.scheduling.render import ConversationRenderer

TURN = pa.struct([("role", pa.string()), ("content", pa.string())])


class Frames:
    """A chat template in miniature: tags around each turn; it refuses a conversation
    that opens with the assistant (as some real templates do)."""

    has_chat_template = True

    def __init__(self) -> None:
        self.asked: list[tuple] = []

    def conversation_frame(self, system, roles):
        self.asked.append((system, *roles))
        if roles[0] == "assistant":
            raise ValueError("the model's chat template refused the conversation: user first")
        head = f"[sys:{system}]" if system else ""
        closing = [f"</{r}>" for r in roles]
        opening = [f"<{r}>" for r in roles[1:]] + ["<assistant>"]
        return [head + f"<{roles[0]}>", *(c + o for c, o in zip(closing, opening, strict=True))]


def renderer(system: str | None = "Be brief.") -> ConversationRenderer:
    spec = SimpleNamespace(prompt=SimpleNamespace(messages_column="m", system=system))
    return ConversationRenderer(spec, Frames())  # type: ignore[arg-type]


def conversations(rows: list) -> pl.DataFrame:
    return pl.from_arrow(pa.table({"m": pa.array(rows, pa.list_(TURN))}))  # type: ignore[return-value]


def rendered(convo: list[dict], system: str | None) -> str:
    roles = [t["role"] for t in convo]
    frame = Frames().conversation_frame(None if "system" in roles else system, roles)
    return frame[0] + "".join(t["content"] + f for t, f in zip(convo, frame[1:], strict=True))


def mixed(count: int, seed: int = 7) -> list:
    """Conversations of one to five turns, some with their own system turn."""
    rng = random.Random(seed)
    rows = []
    for k in range(count):
        turns = rng.choice([1, 1, 2, 3, 5])
        roles = ["user" if t % 2 == 0 else "assistant" for t in range(turns)]
        if rng.random() < 0.2:
            roles = ["system", *roles]
        rows.append(
            [{"role": r, "content": f"{k}:{t} " * rng.randint(0, 3)} for t, r in enumerate(roles)]
        )
    return rows


def test_each_record_joins_to_its_conversation_with_its_last_turn_last():
    rows = mixed(500)
    pieces = renderer().pieces(conversations(rows))
    longest = max(len(r) for r in rows)
    assert len(pieces) == 2 * longest + 1
    for k, convo in enumerate(rows):
        row = [p[k] for p in pieces]
        assert "".join(row) == rendered(convo, "Be brief.")
        assert row[-2] == convo[-1]["content"]  # the last record text is the last turn
        assert all(piece == "" for piece in row[1 : len(row) - 2 * len(convo)])  # padding


def test_a_frame_is_asked_for_once_per_sequence_of_roles():
    frames = Frames()
    spec = SimpleNamespace(prompt=SimpleNamespace(messages_column="m", system=None))
    rows = mixed(2000)
    ConversationRenderer(spec, frames).pieces(conversations(rows))  # type: ignore[arg-type]
    distinct = {tuple(t["role"] for t in convo) for convo in rows}
    assert len(frames.asked) == len(distinct) < 20


def test_bad_conversations_among_good_ones_are_each_named_by_their_first_bad_turn():
    good = mixed(50)
    bad = {
        3: None,
        7: [],
        11: [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
        19: [{"role": "user", "content": None}],
        23: [None],
        31: [{"role": "assistant", "content": "I open."}],
        37: [{"role": None, "content": "who?"}],
    }
    rows = [bad.get(k, convo) for k, convo in enumerate(good)]
    problems = renderer().problems(conversations(rows))
    kinds = dict(enumerate(problems["reject_kind"].to_list()))
    reasons = dict(enumerate(problems["reason"].to_list()))
    assert {k: v for k, v in kinds.items() if v is not None} == {
        3: "null_field",
        7: "empty_conversation",
        11: "unknown_role",
        19: "bad_content",
        23: "unknown_role",
        31: "chat_template_refused",
        37: "unknown_role",
    }
    assert "turn 2 has role 'tool'" in reasons[11]
    assert reasons[19] == "turn 1's content is null, not text"
    assert "user first" in reasons[31]


def test_turns_with_other_fields_are_checked_one_by_one():
    named = pa.struct([("role", pa.string()), ("content", pa.string()), ("name", pa.string())])
    rows = [
        [{"role": "user", "content": "hi", "name": None}],
        [{"role": "user", "content": "hi", "name": "ann"}],
        [{"role": "user", "content": "hi", "name": ""}],
    ]
    frame = pl.from_arrow(pa.table({"m": pa.array(rows, pa.list_(named))}))
    problems = renderer().problems(frame)  # type: ignore[arg-type]
    assert problems["reject_kind"].to_list() == [None, "unsupported_field", None]


def test_other_arrow_shapes_of_a_conversation_column_render_alike():
    """A dictionary-encoded role, a fixed-size list of turns, and no rows at all."""
    rows = [[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]] * 3
    expected = renderer().pieces(conversations(rows))
    coded = pa.struct([("role", pa.dictionary(pa.int32(), pa.string())), ("content", pa.string())])
    for kind in (pa.list_(coded), pa.list_(TURN, 2)):
        frame = pl.from_arrow(pa.table({"m": pa.array(rows, kind)}))
        assert all(a.equals(b) for a, b in zip(renderer().pieces(frame), expected, strict=True))  # type: ignore[arg-type]
    named = pa.struct([("role", pa.string()), ("content", pa.int64())])
    empty = pl.from_arrow(pa.table({"m": pa.array([], pa.list_(named))}))
    assert renderer().problems(empty).height == 0  # type: ignore[arg-type]
