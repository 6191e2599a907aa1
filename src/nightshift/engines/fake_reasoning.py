"""The fake engine's thinking (``Sampling.reasoning``): some tokens of made-up thought,
then the answer, as a reasoning model's output comes back from ``engines.vllm_outputs``.

Each prompt wants its own length of thought (4 to 32 tokens, fixed per prompt), so a
small ``reasoning_budget`` cuts some records' thinking and not others'. As vLLM's
``thinking_token_budget`` does, a budget ends the thinking (with its closing marker, one
token) and the answer follows; without one, a record whose thought outlasts max_tokens
has no answer at all (``reasoning_unfinished``), as a real model's would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from nightshift.engines.base import Choice, Sampling
from nightshift.engines.fake_answers import _digest

AnswerOf = Callable[[list[int], Sampling, int], Choice]  # the fake's own answer to a prompt


def thought_length(seed: int) -> int:
    """How many tokens a prompt's thought runs to, unbudgeted."""
    return 4 + seed % 29


def think_then_answer(answer: AnswerOf, ids: list[int], sampling: Sampling, draw: int) -> Choice:
    """One choice of a reasoning model: thinking up to the budget, then ``answer``'s."""
    wants = thought_length(_digest([*ids, -7]))
    budget = sampling.reasoning_budget
    thinks = wants if budget is None else min(wants, budget)
    words = " ".join(f"r{(wants * 31 + i) % 997}" for i in range(min(thinks, sampling.max_tokens)))
    if thinks + 1 >= sampling.max_tokens:  # no token left for the closing marker: no answer
        spent = sampling.max_tokens
        return Choice(
            "",
            "length",
            spent,
            reasoning=words,
            reasoning_tokens=min(thinks, spent),
            reasoning_unfinished=True,
        )
    plain = replace(sampling, reasoning=False, max_tokens=sampling.max_tokens - thinks - 1)
    said = answer(ids, plain, draw)
    return replace(
        said,
        output_tokens=said.output_tokens + thinks + 1,
        reasoning=words,
        reasoning_tokens=thinks,
    )
