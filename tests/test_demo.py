"""The demo model and data: built locally, deterministic, shaped like real tickets."""

from __future__ import annotations

import subprocess
import sys

import polars as pl

from nightshift.demo.model import build_model
from nightshift.demo.tickets import corpus, tickets, write_tickets


def test_tickets_are_deterministic_and_varied(tmp_path):
    assert list(tickets(300, seed=5)) == list(tickets(300, seed=5))
    paths = write_tickets(tmp_path, count=20_000, files=8)
    frame = pl.read_parquet(paths)
    assert len(paths) == 8 and len(frame) == 20_000
    assert frame["ticket_id"].n_unique() == 20_000
    lengths = frame["body"].str.len_chars()
    assert lengths.min() < 100 and lengths.max() > 10_000  # short ones and a long tail
    assert 0 < (lengths > 8_000).sum() < 400
    assert set(frame.columns) >= {"ticket_id", "subject", "body"}


def test_model_build_is_deterministic(models, tmp_path):
    again = build_model(tmp_path / "again", corpus())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (models["chat"] / name).read_bytes(), name


def test_only_the_engines_package_imports_vllm():
    code = (
        "import sys, nightshift.cli, nightshift.running.runner, nightshift.scheduling.dryrun;"
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
