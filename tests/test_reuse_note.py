"""Prefix reuse 0% although every prompt shares a system prompt: the plan and the report
say why (the shared start is shorter than one KV block) and what would help."""

from __future__ import annotations

import json

from nightshift.jobs.loading import validate_spec
from nightshift.pipelines.direct import run_job
from nightshift.reports.report import summary_lines
from nightshift.scheduling.dryrun import plan_summary, summary_text

from .conftest import spec_dict

LONG_SYSTEM = " ".join(f"Rule {i}: label the ticket by what its sender needs." for i in range(40))


def job(models, ticket_dir, out, system: str) -> dict:
    prompt = {"system": system, "template": "Subject: {subject}\n\n{body}"}
    # the CPU build's 128-token blocks, on the fake engine
    return spec_dict(
        models["chat"],
        ticket_dir,
        out,
        prompt=prompt,
        engine={"block_size": 128},
        run={"engine": "fake"},
    )


def test_the_plan_says_a_shared_start_under_one_block_is_not_reused(models, ticket_dir, tmp_path):
    summary = plan_summary(validate_spec(job(models, ticket_dir, tmp_path / "o", "Label it.")))
    reuse = summary["prefix_reuse"]
    assert reuse["predicted"] == 0.0
    assert 0 < reuse["shared_start_tokens"] < 128
    text = summary_text(summary)
    assert f"share at most their first {reuse['shared_start_tokens']:,} tokens" in text
    assert "less than one 128-token KV block" in text
    assert "more tokens of fixed text" in text and "engine.block_size" in text
    # a system prompt longer than a block is reused, and nothing needs saying
    longer = plan_summary(validate_spec(job(models, ticket_dir, tmp_path / "p", LONG_SYSTEM)))
    assert longer["prefix_reuse"]["predicted"] > 0.3
    assert "why so little" not in summary_text(longer)


def test_the_report_says_why_the_cache_served_nothing(models, ticket_dir, tmp_path):
    out = tmp_path / "out"
    run_job(validate_spec(job(models, ticket_dir, out, "Label it.")), progress=False)
    report = json.loads((out / "report.json").read_text())
    reuse = report["prefix_reuse"]
    assert reuse["measured"] == 0.0 and "less than one 128-token KV block" in reuse["why_none"]
    assert any(
        line.startswith("  why so little: the prompts share")
        for line in summary_lines(report, str(out))
    )
    assert "Why the prefix cache served so little" in (out / "report.md").read_text()
