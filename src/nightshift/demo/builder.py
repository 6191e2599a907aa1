"""``nightshift demo init``: the demo model and tickets, built locally."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nightshift.demo.model import build_model
from nightshift.demo.tickets import corpus, write_tickets

MODEL_DIR = "demo-model"
PLAIN_MODEL_DIR = "demo-model-plain"  # the same model without a chat template


@dataclass(frozen=True)
class DemoPaths:
    model: Path
    plain_model: Path
    data: Path


def init_demo(model_root: Path, data_dir: Path, records: int = 20_000, files: int = 8) -> DemoPaths:
    model = build_model(model_root / MODEL_DIR, corpus())
    plain = build_model(model_root / PLAIN_MODEL_DIR, corpus(), chat=False)
    write_tickets(data_dir, records, files)
    return DemoPaths(model, plain, data_dir)
