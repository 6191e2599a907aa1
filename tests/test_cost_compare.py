"""The report's self-hosted cost beside providers' batch prices (reports.compare)."""

from __future__ import annotations

import pytest

from nightshift.engines.fake import FakeEngine
from nightshift.errors import SpecErrors
from nightshift.jobs.loading import validate_spec
from nightshift.jobs.spec import CostSpec
from nightshift.pipelines.direct import run_job
from nightshift.reports.compare import PUBLISHED, compare_section, hardware_note

from .conftest import spec_dict

TOKENS = {"prompt": 3_000_000, "prompt_cached": 1_000_000, "output": 500_000}


def test_defaults_are_the_published_batch_prices_with_their_source():
    section = compare_section(CostSpec(gpu="h100"), 2.0, 0.5, TOKENS, "1x NVIDIA H100 80GB")
    assert {p["provider"] for p in section["providers"]} == {"openai", "anthropic"}
    assert all("as of" in p["source"] for p in section["providers"])
    mini = next(p for p in section["providers"] if p["model"] == "gpt-4o-mini")
    # 2M computed prompt + 1M cached (as input: no cached batch price confirmed) + output
    assert mini["usd"] == pytest.approx((3e6 * 0.075 + 0.5e6 * 0.30) / 1e6)
    hosted = section["self_hosted"]
    assert hosted["input"] == pytest.approx(1.0 / 2e6 * 1e6)  # prefill share over computed
    assert hosted["output"] == pytest.approx(1.0 / 0.5e6 * 1e6)
    assert hosted["cached_input"] == 0.0
    assert section["hardware_note"] is None  # h100 priced, an H100 ran
    assert len(PUBLISHED) >= 4


def test_a_configured_table_replaces_the_defaults_and_a_cached_price_applies():
    cost = CostSpec.model_validate(
        {
            "compare": [
                {"provider": "acme", "model": "m", "input": 1, "cached_input": 0.1, "output": 2}
            ]
        }
    )
    section = compare_section(cost, 1.0, 0.5, TOKENS, "a CPU")
    (row,) = section["providers"]
    assert row["usd"] == pytest.approx((2e6 * 1 + 1e6 * 0.1 + 0.5e6 * 2) / 1e6)
    assert hardware_note(cost, "a CPU") == "priced as 1x h100; the engine ran on a CPU"


def test_a_misspelt_price_key_names_the_key(models, tmp_path):
    spec = spec_dict(models["chat"], tmp_path / "in", tmp_path / "out")
    spec["cost"]["compare"] = [{"provider": "x", "model": "m", "inptu": 1, "output": 2}]
    with pytest.raises(SpecErrors, match="cost.compare.0.inptu: unknown key"):
        validate_spec(spec)


def test_the_report_compares_and_says_what_hardware_ran(models, ticket_dir, tmp_path):
    spec = validate_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    outcome = run_job(spec, engine=FakeEngine(), progress=False)
    section = outcome.report["cost_compare"]
    assert section["tokens"]["prompt"] == outcome.report["tokens"]["prompt"]
    assert section["hardware_note"].startswith("priced as 1x h100; the engine ran on a CPU")
    page = (tmp_path / "out" / "report.md").read_text()
    assert "Against provider batch prices" in page
    assert "| openai batch | gpt-4o-mini |" in page
    assert "priced as 1x h100; the engine ran on a CPU" in page
