"""The shipped configs hold no setting that is right on one platform only (DESIGN
invariant 13): people copy them for real jobs on GPUs, where float32 means no tensor
cores, eager mode no CUDA graphs, and the CPU's batch limits a quarter of an H100's."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nightshift.jobs.loading import validate_spec
from nightshift.jobs.platform import batch_limits, device_class

CONFIGS = sorted(Path(__file__).parent.parent.glob("configs/**/*.yaml"))
# Keys whose right value depends on the hardware: the platform picks them at run time.
PLATFORM_ONLY_ENGINE = {"max_num_seqs", "max_num_batched_tokens", "block_size"}
PLATFORM_ONLY_EXTRA = {"enforce_eager", "compilation_config", "num_gpu_blocks_override"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[1])))
def test_shipped_configs_hold_no_platform_only_setting(path):
    data = yaml.safe_load(path.read_text())
    if "model" not in data:  # a schedule file, not a job
        return
    assert data["model"].get("dtype", "auto") == "auto", f"{path}: model.dtype"
    engine = data.get("engine") or {}
    assert not PLATFORM_ONLY_ENGINE & set(engine), f"{path}: engine keys"
    assert not PLATFORM_ONLY_EXTRA & set(engine.get("extra") or {}), f"{path}: engine.extra"


def test_unset_batch_limits_are_the_engines_own_for_the_device(tmp_path):
    data = yaml.safe_load(Path(CONFIGS[0]).read_text())
    spec = validate_spec(data)
    assert spec.engine.max_num_seqs is None and spec.model.dtype == "auto"
    assert batch_limits(spec.engine, device_class(139.8, "H200")) == (1024, 16384)
    assert batch_limits(spec.engine, device_class(80.0, "A100 80GB")) == (256, 8192)
    assert batch_limits(spec.engine, "cpu") == (256, 4096)
    set_ = validate_spec({**data, "engine": {"max_num_seqs": 64}})
    assert batch_limits(set_.engine, "large-gpu") == (64, 16384)


def test_the_demo_ends_0_whatever_its_canary_measures():
    """`make demo` runs configs/classify.yaml: on a GPU its FP8 canary measures FP8
    attention, whose agreement no CPU run predicts; the demo accepts its own figure."""
    spec = validate_spec(
        yaml.safe_load((Path(__file__).parent.parent / "configs/classify.yaml").read_text())
    )
    assert spec.run.canary.accept
