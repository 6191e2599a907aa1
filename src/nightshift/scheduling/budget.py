"""Token budgets: whether a record's prompt and answer fit the model's context."""

from __future__ import annotations


def over_length_reason(prompt_tokens: int, max_tokens: int, max_model_len: int) -> str | None:
    """Why a prompt cannot run, or None when prompt plus answer fit the context."""
    if prompt_tokens + max_tokens <= max_model_len:
        return None
    return (
        f"prompt is {prompt_tokens} tokens; with {max_tokens} answer tokens it exceeds "
        f"model.max_model_len {max_model_len}"
    )
