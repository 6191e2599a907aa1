"""Reasoning models: which markers delimit the thinking, and the answer split from it.

A reasoning model writes its thinking between two markers (``<think> ... </think>`` for
DeepSeek-R1 and Qwen3) and its answer after them. ``model.reasoning`` names the format
as vLLM's reasoning parser; vLLM uses it to cap the thinking (``thinking_token_budget``)
and to hold a guided answer's grammar back until the thinking ends. The offline engine
still returns thinking and answer as one text: ``Markers.split`` takes them apart by
token ids, so the answer columns never hold a line of thinking.

The markers of the common parsers are known here without importing vLLM (a fake-engine
job never pays for it); any other parser name is asked of vLLM's own registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nightshift.errors import SpecError

# parser name -> (start, end) marker, for the parsers nightshift's demo and docs name
KNOWN = {"deepseek_r1": ("<think>", "</think>"), "qwen3": ("<think>", "</think>")}
# the generation prompt's tail that may open (or close) the thinking
_PROMPT_TAIL = 16
REASONING_LENGTH = "reasoning_length"  # failure kind: thinking spent every token, no answer


@dataclass(frozen=True)
class Markers:
    """A model's thinking markers as text and as token id sequences."""

    start: str
    end: str
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]

    def open_after(self, prompt_ids: Sequence[int]) -> bool:
        """Whether the prompt leaves the thinking open (a template that opens it): the
        last marker in its tail is a start."""
        tail = list(prompt_ids[-_PROMPT_TAIL:])
        start, end = _last(tail, self.start_ids), _last(tail, self.end_ids)
        return start > end

    def split(self, token_ids: Sequence[int], text: str, open_: bool) -> Thought:
        """``text`` (the decoded ``token_ids``) as thinking and answer. ``open_``: the
        prompt left the thinking open, so the output starts inside it."""
        ids = list(token_ids)
        opens = ids[: len(self.start_ids)] == list(self.start_ids)
        if not (open_ or opens):
            return Thought(None, text, 0, False, 0)
        at = _first(ids, self.end_ids)
        if at < 0:  # never closed: every token was thinking, and there is no answer
            return Thought(_strip_start(text, self.start), "", len(ids), True, len(ids))
        reasoning, _, answer = text.partition(self.end)
        answer_at = at + len(self.end_ids)
        skip = len(self.start_ids) if opens else 0
        return Thought(_strip_start(reasoning, self.start), answer, at - skip, False, answer_at)


@dataclass(frozen=True)
class Thought:
    """One output taken apart: ``answer_at`` is the answer's first token's place."""

    reasoning: str | None
    answer: str
    reasoning_tokens: int
    unfinished: bool
    answer_at: int


def _strip_start(text: str, start: str) -> str:
    """The thinking as written, less an opening marker the model wrote itself."""
    return text.removeprefix(start)


def _first(ids: list[int], marker: tuple[int, ...]) -> int:
    n = len(marker)
    if n == 1:
        return ids.index(marker[0]) if marker[0] in ids else -1
    return next((i for i in range(len(ids) - n + 1) if tuple(ids[i : i + n]) == marker), -1)


def _last(ids: list[int], marker: tuple[int, ...]) -> int:
    n = len(marker)
    return max((i for i in range(len(ids) - n + 1) if tuple(ids[i : i + n]) == marker), default=-1)


def marker_texts(parser: str, tokenizer=None) -> tuple[str, str]:
    """The (start, end) markers the parser ``parser`` reads; SpecError for a name vLLM
    does not know."""
    if parser in KNOWN:
        return KNOWN[parser]
    try:
        from vllm.reasoning import ReasoningParserManager
    except ImportError:  # no vLLM here (a fake-engine job): only the known names
        names = ", ".join(KNOWN)
        raise SpecError("model.reasoning", f"{parser!r} is not known", f"one of {names}") from None
    try:
        parser_class = ReasoningParserManager.get_reasoning_parser(parser)
    except KeyError:
        names = ", ".join(sorted(ReasoningParserManager.list_registered()))
        raise SpecError(
            "model.reasoning", f"{parser!r} is not a vLLM reasoning parser", f"one of {names}"
        ) from None
    try:
        found = parser_class(tokenizer)
        return found.reasoning_start_str, found.reasoning_end_str
    except Exception as exc:  # each parser refuses a tokenizer in its own way
        raise SpecError("model.reasoning", _no_tokens(parser, str(exc)), _FIX) from None


_FIX = "name the model's own format, or remove model.reasoning for a model that does not reason"


def _no_tokens(parser: str, what: str) -> str:
    return f"the model's tokenizer lacks what the {parser} parser reads: {what}"


def markers_for(parser: str, tokenizer) -> Markers:
    """``parser``'s markers in ``tokenizer`` (a Hugging Face tokenizer); SpecError, one
    line, when the model has no such tokens."""
    start, end = marker_texts(parser, tokenizer)
    vocab = tokenizer.get_vocab()
    for marker in (start, end):
        if not marker or marker not in vocab:
            raise SpecError(
                "model.reasoning", _no_tokens(parser, f"no {marker or 'marker'!r} token"), _FIX
            )
    return Markers(start, end, (vocab[start],), (vocab[end],))


def thinking_allowance(budget: int | None) -> int:
    """Output tokens a record may spend thinking on top of its answer's max_tokens: the
    budget and its closing marker (one token, ``markers_for`` checks). None: no cap but
    max_tokens, which then holds the thinking and the answer together."""
    return budget + 1 if budget is not None else 0


def thinking_off(tokenizer) -> dict[str, bool]:
    """The chat template arguments that turn thinking off, where the template reads one
    (Qwen3's ``enable_thinking``; the demo's reasoning variant's); else none, and a budget
    of 0 closes the thinking at its first token instead."""
    template = getattr(tokenizer, "chat_template", None) or ""
    return {"enable_thinking": False} if "enable_thinking" in str(template) else {}


def detect_parser(model: Path) -> str | None:
    """``deepseek_r1`` for a model folder whose tokenizer has ``<think>`` and ``</think>``
    as tokens of their own (DeepSeek-R1 distills, Qwen3, the demo's reasoning variant),
    else None: a batch (which has no spec to name it) splits such a model's thinking
    from its answers as vLLM's server would with that parser."""
    import json

    try:
        data = json.loads((Path(model) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    added = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    return "deepseek_r1" if set(KNOWN["deepseek_r1"]) <= added else None
