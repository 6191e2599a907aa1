"""``nightshift demo init``: the demo models and tickets, built locally."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nightshift.demo.model import build_model
from nightshift.demo.smollm2 import build_smollm2
from nightshift.demo.tickets import corpus, write_tickets

MODEL_DIR = "demo-model"  # tiny, random: for tests and benchmarks, where speed matters
PLAIN_MODEL_DIR = "demo-model-plain"  # the same model without a chat template
REASONING_MODEL_DIR = "demo-model-reasoning"  # the same with think tokens (demo.reasoning)
REAL_MODEL_DIR = "smollm2-135m-instruct"  # a real instruct model: the demo's answers
DEMO_RECORDS = 400  # what `make demo` classifies on the real model in minutes on 2 cores


@dataclass(frozen=True)
class DemoPaths:
    model: Path
    plain_model: Path
    reasoning_model: Path
    real_model: Path | None
    data: Path


def init_demo(
    model_root: Path,
    data_dir: Path,
    records: int = DEMO_RECORDS,
    files: int = 8,
    real: bool = True,
) -> DemoPaths:
    model = build_model(model_root / MODEL_DIR, corpus())
    plain = build_model(model_root / PLAIN_MODEL_DIR, corpus(), chat=False)
    thinking = build_model(model_root / REASONING_MODEL_DIR, corpus(), reasoning=True)
    real_model = build_smollm2(model_root / REAL_MODEL_DIR) if real else None
    write_tickets(data_dir, records, files)
    return DemoPaths(model, plain, thinking, real_model, data_dir)
