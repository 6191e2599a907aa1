"""A reasoning model's figures in the report: its thinking, counted apart from the answer.

The thinking tokens are output tokens: generated and paid for like the answer's, so the
cost figures already price them as output (``cost.usd_per_million_tokens.output``); this
section says how many of the output tokens they were, how far the longest thought ran
against ``sampling.reasoning_budget``, and how many records thought until no token was
left and so have no answer (failed as ``reasoning_length``, never an empty answer).
"""

from __future__ import annotations

from typing import Any

from nightshift.engines.reasoning import REASONING_LENGTH
from nightshift.jobs.spec import JobSpec
from nightshift.running.totals import RunTotals


def reasoning_section(
    spec: JobSpec, markers: dict[int, dict[str, Any]], totals: RunTotals
) -> dict[str, Any] | None:
    """report.json's ``reasoning``, or None for a model that does not reason."""
    if not spec.model.reasoning:
        return None
    return {
        "parser": spec.model.reasoning,
        "budget": spec.sampling.reasoning_budget,
        "tokens": sum(m["tokens"].get("reasoning", 0) for m in markers.values()),
        "records_out_of_tokens": sum(
            m["records"].get(REASONING_LENGTH, 0) for m in markers.values()
        ),
        "this_run": {
            "tokens": totals.reasoning_tokens,
            "tokens_max_per_record": totals.reasoning_tokens_max,
        },
        "note": "reasoning tokens are output tokens, priced as output; records out of "
        f"tokens thought until none was left: failed/ rows of kind {REASONING_LENGTH}",
    }


def reasoning_lines(report: dict[str, Any]) -> list[str]:
    """The report's summary line on the thinking, for a reasoning model."""
    r = report.get("reasoning")
    if not r:
        return []
    budget = f"budget {r['budget']:,}" if r["budget"] is not None else "no budget"
    return [
        f"reasoning: {r['tokens']:,} of the output tokens (priced as output), at most "
        f"{r['this_run']['tokens_max_per_record']:,} per record ({budget}); "
        f"{r['records_out_of_tokens']:,} records out of tokens before answering"
    ]
