"""Provider batch lines for reasoning models: the thinking settings in, the thinking out.

In: OpenAI chat's ``reasoning_effort``, the Responses API's ``reasoning.effort`` and
Anthropic's ``thinking.budget_tokens`` become the record's ``reasoning_budget``
(``input.sampling_column``). The providers count the thinking inside the line's token
limit (``max_completion_tokens``, ``max_output_tokens``, Anthropic's ``max_tokens``);
nightshift's ``max_tokens`` is the answer's own, so the limit is split: the budget (at
most the limit less two tokens) and its closing marker come off it, the answer gets the
rest. An effort names no number of tokens; ``EFFORT_BUDGETS`` says what each one buys.

Out: each provider's own shape for an answer's thinking: ``message.reasoning_content``
(vLLM's and DeepSeek's chat field), a ``reasoning`` output item before the Responses
message, a ``thinking`` content block before Anthropic's text; and the reasoning tokens in
each usage's details.
"""

from __future__ import annotations

from typing import Any

from nightshift.batch.records import BadRequest

# reasoning_effort -> thinking tokens; none: thinking off (the template's where it can)
EFFORT_BUDGETS = {"none": 0, "minimal": 256, "low": 1024, "medium": 4096, "high": 16384}


def effort_budget(effort: str | None, limit: int | None, param: str) -> dict[str, Any]:
    """The sampling keys for an effort (none: nothing), within the line's ``limit``."""
    if effort is None:
        return {}
    if effort not in EFFORT_BUDGETS:
        names = ", ".join(EFFORT_BUDGETS)
        raise BadRequest(f"{param} {effort!r} is not one of {names}", param=param)
    if effort == "none":  # thinking off: nothing to take from the limit
        return {"reasoning_budget": 0}
    return within(limit, EFFORT_BUDGETS[effort])


def within(limit: int | None, budget: int) -> dict[str, Any]:
    """``reasoning_budget`` and the answer's ``max_tokens`` out of a provider's ``limit``
    on thinking and answer together (None: the job's answer budget, the thinking on top)."""
    if limit is None:
        return {"reasoning_budget": budget}
    budget = max(0, min(budget, limit - 2))  # at least one answer token after the marker
    return {"reasoning_budget": budget, "max_tokens": max(1, limit - budget - 1)}


def anthropic_thinking(thinking: Any, max_tokens: int | None) -> dict[str, Any]:
    """``params.thinking``: ``{type: enabled, budget_tokens}`` or ``{type: disabled}``."""
    where = "params.thinking"
    if thinking is None:
        return {}
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind == "disabled" and set(thinking) == {"type"}:
        return {"reasoning_budget": 0}
    budget = thinking.get("budget_tokens") if kind == "enabled" else None
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise BadRequest(
            f"{where}: give {{type: enabled, budget_tokens: N}} (N at least 1) or "
            "{type: disabled}",
            param=f"{where}.budget_tokens",
        )
    if max_tokens is not None and budget >= max_tokens:
        raise BadRequest(
            f"{where}.budget_tokens ({budget}) must be less than params.max_tokens "
            f"({max_tokens}), which holds the thinking and the answer",
            param=f"{where}.budget_tokens",
        )
    return within(max_tokens, budget)


def thinking_tokens(choices: list[dict[str, Any]]) -> int:
    """An answer's thinking tokens, over its choices: the line's own, as its other counts
    are (a dedup copy's row counts none, but its choices are its original's)."""
    return sum(reasoning_of(c)[1] for c in choices)


def reasoning_of(choice: dict[str, Any]) -> tuple[str | None, int]:
    """A choice's thinking and its tokens (None, 0: the model did not think)."""
    return choice.get("reasoning"), int(choice.get("reasoning_tokens") or 0)


def chat_message_reasoning(choice: dict[str, Any]) -> dict[str, Any]:
    """The chat message's ``reasoning_content``, as vLLM's server writes it."""
    text, _ = reasoning_of(choice)
    return {"reasoning_content": text} if text is not None else {}


def response_reasoning_items(digest: str, choice: dict[str, Any]) -> list[dict[str, Any]]:
    """The Responses output's ``reasoning`` item, before its message (none: no thinking)."""
    text, _ = reasoning_of(choice)
    if text is None:
        return []
    return [
        {
            "id": f"rs_{digest}",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "status": "completed",
        }
    ]


def thinking_blocks(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic's ``thinking`` content block, before the text (none: no thinking). The
    signature is empty: it vouches for thinking Anthropic made, which this is not."""
    text, _ = reasoning_of(choice)
    return [{"type": "thinking", "thinking": text, "signature": ""}] if text is not None else []
