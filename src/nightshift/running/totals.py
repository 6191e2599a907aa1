"""What a run counted, filled in as records are answered: records, tokens, finish reasons."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class RunTotals:
    """What a run counted, filled in as it goes."""

    input_records: int = 0
    ok: int = 0
    rejected: int = 0
    failed: int = 0
    prompt_tokens: int = 0
    prompt_tokens_cached: int = 0
    output_tokens: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    reasoning_tokens: int = 0  # model.reasoning: of output_tokens, the thinking
    reasoning_tokens_max: int = 0  # the most one record thought (its budget bounds it)

    def count(self, row: dict, ok: bool) -> None:
        """Count one answered (or failed) record from its output row."""
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        self.prompt_tokens += row.get("prompt_tokens") or 0
        self.prompt_tokens_cached += row.get("cached_tokens") or 0
        self.output_tokens += row.get("output_tokens") or 0
        if row.get("finish_reason"):
            self.finish_reasons[row["finish_reason"]] += 1
        thought = row.get("reasoning_tokens") or 0
        self.reasoning_tokens += thought
        self.reasoning_tokens_max = max(self.reasoning_tokens_max, thought)

    @property
    def all_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens
