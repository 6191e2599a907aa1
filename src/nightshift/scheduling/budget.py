"""Token budgets: whether a record's prompt and answer fit the model's context."""

from __future__ import annotations

import polars as pl


def over_length_reason(
    prompt_tokens: int, max_tokens: int, max_model_len: int, whose: str | None = None
) -> str | None:
    """Why a prompt cannot run, or None when prompt plus answer fit the context;
    ``whose`` names where the answer budget came from (a record's own max_tokens)."""
    if prompt_tokens + max_tokens <= max_model_len:
        return None
    budget = f"{max_tokens} answer tokens" + (f" ({whose})" if whose else "")
    return (
        f"prompt is {prompt_tokens} tokens; with {budget} it exceeds "
        f"model.max_model_len {max_model_len}"
    )


class TailEstimate:
    """Prompt tokens of a record's own text, estimated from its UTF-8 bytes.

    Exact counts cost a tokenizer pass per record; most records are nowhere near the
    context limit, and their length only orders them. So a sample is measured exactly
    to learn bytes per token, and each record gets ``ceil(bytes / ratio)``. A byte-level
    tokenizer never makes more tokens than bytes (+1 for a seam), so ``upper`` is a safe
    bound: a record whose bound could exceed the limit is measured exactly. The sample
    also checks that bound, and when a tokenizer breaks it, every record is measured.
    """

    def __init__(self, sample_bytes: list[int], sample_tokens: list[int]) -> None:
        total_bytes, total_tokens = sum(sample_bytes), sum(sample_tokens)
        self.bytes_per_token = total_bytes / total_tokens if total_tokens else 1.0
        self.bound_holds = all(t <= b + 1 for b, t in zip(sample_bytes, sample_tokens, strict=True))

    def estimate(self, text_bytes: pl.Expr) -> pl.Expr:
        return (text_bytes / self.bytes_per_token).ceil().cast(pl.Int64)

    def upper(self, text_bytes: pl.Expr) -> pl.Expr:
        return text_bytes.cast(pl.Int64) + 1
