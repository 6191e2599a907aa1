"""The self-hosted cost per million tokens beside providers' batch-tier prices.

``cost.compare`` replaces the table; unset, it is ``PUBLISHED`` below. The self-hosted
figures come from the report's own cost section: input is the prefill share of the cost
over the prompt tokens the engine computed (a prefix-cache hit skips prefill, so cached
tokens add nothing beyond the GPU hours already counted), output is the decode share over
output tokens. A provider is priced on the same tokens, cached ones at its cached price.
"""

from __future__ import annotations

from typing import Any

from nightshift.capacity.gpus import local_gpu_names
from nightshift.jobs.spec import CostSpec, ProviderPrice

PRICES_AS_OF = "2026-12-01"
# USD per million tokens, batch tier (half the standard price at both providers).
# OpenAI: the Batch API column of https://openai.com/api/pricing/ as reproduced by
# aicosthub.com and apicalculators.com (2026); the provider's page itself was not reached
# from here. OpenAI's cached-input price under Batch was not confirmed: charged as input.
# Anthropic: https://docs.anthropic.com/en/docs/build-with-claude/batch-processing (50% off
# input and output), the prices as reproduced by dev.to posts (2026); its cache-read price
# (0.1x input) halved under Batch was not confirmed against the page: treat it as such.
_OPENAI = f"openai.com/api/pricing, Batch API, as of {PRICES_AS_OF} (unconfirmed at source)"
_ANTHROPIC = (
    "docs.anthropic.com batch-processing, Message Batches, as of "
    f"{PRICES_AS_OF} (unconfirmed at source)"
)
PUBLISHED = [
    ProviderPrice(provider="openai", model="gpt-4o-mini", input=0.075, output=0.30, source=_OPENAI),
    ProviderPrice(provider="openai", model="gpt-4.1", input=1.00, output=4.00, source=_OPENAI),
    ProviderPrice(provider="openai", model="gpt-4o", input=1.25, output=5.00, source=_OPENAI),
    ProviderPrice(
        provider="anthropic",
        model="claude-haiku-4.5",
        input=0.50,
        cached_input=0.05,
        output=2.50,
        source=_ANTHROPIC,
    ),
    ProviderPrice(
        provider="anthropic",
        model="claude-sonnet-4.6",
        input=1.50,
        cached_input=0.15,
        output=7.50,
        source=_ANTHROPIC,
    ),
]


def prices(cost: CostSpec) -> list[ProviderPrice]:
    return PUBLISHED if cost.compare is None else cost.compare


def compare_section(
    cost: CostSpec, usd_total: float, share: float, tokens: dict[str, int], ran_on: str
) -> dict[str, Any]:
    """``cost_compare`` of report.json (or of ``jobs plan``'s estimate): the self-hosted
    row, each provider's row and what the same tokens would have cost there."""
    prompt, cached, output = tokens["prompt"], tokens["prompt_cached"], tokens["output"]
    computed = max(0, prompt - cached)
    self_hosted = {
        "input": _per_million(usd_total * share, computed),
        "cached_input": 0.0,
        "output": _per_million(usd_total * (1 - share), output),
        "usd": usd_total,
    }
    rows = []
    for p in prices(cost):
        cached_price = p.input if p.cached_input is None else p.cached_input
        usd = (computed * p.input + cached * cached_price + output * p.output) / 1e6
        rows.append({**p.model_dump(), "cached_input": cached_price, "usd": usd})
    return {
        "priced_as": f"{cost.gpus}x {cost.gpu}",
        "priced": cost.usd_per_gpu_hour > 0,  # unpriced: no self-hosted figures to compare
        "ran_on": ran_on,
        "hardware_note": hardware_note(cost, ran_on),
        "self_hosted": self_hosted,
        "providers": rows,
        "tokens": {"prompt": prompt, "prompt_cached": cached, "output": output},
        "prices_as_of": PRICES_AS_OF,
    }


def _per_million(usd: float, tokens: int) -> float:
    return usd / tokens * 1e6 if tokens else 0.0


def hardware_note(cost: CostSpec, ran_on: str) -> str | None:
    """Says so when the priced GPU is not what ran ("priced as 1x h100; the engine ran on
    a CPU"); None when they match."""
    if cost.gpu.lower() in ran_on.lower():
        return None
    return f"priced as {cost.gpus}x {cost.gpu}; the engine ran on {ran_on}"


def engine_hardware(engine_name: str | None, devices: int = 0) -> str:
    """What the engine ran on, in words: the fake engine ran no model; vLLM ran on the
    ``devices`` GPUs placement gave it (named by nvidia-smi, never torch.cuda: CUDA
    initialised in nightshift's own process makes vLLM spawn every later engine), else
    on a CPU."""
    if engine_name in (None, "fake"):
        return "a CPU (the fake engine: no model ran)"
    names = local_gpu_names() if devices else []
    return f"{devices}x {names[0]}" if names else "a CPU"


def compare_lines(section: dict[str, Any]) -> list[str]:
    """The comparison as a markdown table, with the hardware note and the sources."""
    s = section["self_hosted"]
    mine = (
        f"| self-hosted | {section['priced_as']} | {s['input']:.4f} | {s['cached_input']:.4f} "
        f"| {s['output']:.4f} | {s['usd']:.4f} |"
    )
    if section.get("priced") is False:  # $0 would read as free
        unset = "not priced (cost.usd_per_gpu_hour)"
        mine = f"| self-hosted | {section['priced_as']} | {unset} | | | |"
    lines = [
        "| who | model | input $/1M | cached input $/1M | output $/1M | these tokens $ |",
        "|---|---|---|---|---|---|",
        mine,
    ]
    for p in section["providers"]:
        lines.append(
            f"| {p['provider']} batch | {p['model']} | {p['input']:.4f} | "
            f"{p['cached_input']:.4f} | {p['output']:.4f} | {p['usd']:.4f} |"
        )
    if section["hardware_note"]:
        lines += ["", f"Note: {section['hardware_note']}."]
    sources = sorted({p["source"] for p in section["providers"]})
    lines += ["", *(f"Prices: {src}." for src in sources)]
    return lines
