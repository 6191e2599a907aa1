"""The demo model's reasoning variant: think tokens, a template that opens thinking.

A reasoning model writes ``<think> ... </think>`` before its answer. The variant is the
tiny demo model with those two markers added to its tokenizer as single tokens (never
split by BPE, as Qwen3's and DeepSeek-R1's are) and a chat template whose generation
prompt ends inside an open ``<think>``: the model's first tokens are its reasoning.
``enable_thinking: false`` (what ``sampling.reasoning_budget: 0`` renders with) closes
the block in the prompt instead, so the answer comes at once. vLLM's ``deepseek_r1``
reasoning parser reads these markers (``model.reasoning: deepseek_r1``).

The weights are random, so the model never writes ``</think>`` itself: the budget
(``sampling.reasoning_budget``) is what ends its reasoning, as it would a real model's
that thinks too long.
"""

from __future__ import annotations

THINK_START, THINK_END = "<think>", "</think>"
PARSER = "deepseek_r1"  # vLLM's reasoning parser for <think> ... </think>
# ChatML like the demo model's, the assistant turn opening a thought.
REASONING_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)


def add_think_tokens(tokenizer) -> None:
    """Give ``tokenizer`` the think markers as single tokens and the reasoning template.

    They are added tokens that are not *skipped* as special (as Qwen3's): decoded text
    keeps them, which is where the reasoning parser and nightshift find the split."""
    from tokenizers import AddedToken

    markers = [AddedToken(t, special=False, normalized=False) for t in (THINK_START, THINK_END)]
    tokenizer.add_tokens(markers)
    tokenizer.chat_template = REASONING_TEMPLATE
