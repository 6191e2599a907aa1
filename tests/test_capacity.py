"""The capacity planner: hand-computed arithmetic, the GPU table, the published figures,
a 70B plan from its config alone, and `jobs plan --gpu` through the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from nightshift.capacity.gpus import GPUS, GpuSpec, find_gpu, gpu_for_device
from nightshift.capacity.predict import (
    Batch,
    EngineSettings,
    Prediction,
    Workload,
    batch_that_fits,
    fixed_length_workload,
    predict,
)
from nightshift.capacity.published import FIGURES, LLAMA_3_8B, LLAMA_3_70B, error, predict_figure
from nightshift.capacity.roofline import (
    ARITHMETIC,
    BANDWIDTH,
    Hardware,
    decode_pass,
    hardware,
    roofline,
)
from nightshift.capacity.shape import model_shape
from nightshift.cli import app
from nightshift.errors import SpecError
from nightshift.scheduling.capacity import headline

from .conftest import spec_dict, write_records

runner = CliRunner()
HW = Hardware("test", 1, 80 * 2**30, bandwidth=1e12, flops=1e14, compute_dtype="bf16")
MIXTRAL = {
    **LLAMA_3_8B,
    "vocab_size": 32000,
    "model_type": "mixtral",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}


def test_roofline_is_the_larger_of_bytes_over_bandwidth_and_flops_over_throughput():
    slow_memory = roofline(2e9, 1e11, HW)  # 2 ms moving bytes, 1 ms computing
    assert slow_memory.seconds == pytest.approx(2e-3) and slow_memory.limit == BANDWIDTH
    slow_math = roofline(1e9, 5e11, HW)  # 1 ms moving bytes, 5 ms computing
    assert slow_math.seconds == pytest.approx(5e-3) and slow_math.limit == ARITHMETIC


def test_llama_3_8b_shape_parameters_and_kv_bytes():
    shape = model_shape(LLAMA_3_8B)
    # embeddings 128256*4096 twice (untied); per layer: attention 2*4096*4096 + 2*4096*1024,
    # gated MLP 3*4096*14336, two norms 2*4096; 32 layers; final norm 4096
    assert shape.parameters == 2 * 525_336_576 + 32 * (41_943_040 + 176_160_768 + 8192) + 4096
    assert shape.parameters == 8_030_261_248
    assert shape.kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert shape.kv_bytes_per_token(1) == 65_536
    assert shape.weight_bytes == 2


def test_decode_pass_by_hand():
    shape = model_shape(LLAMA_3_8B)
    weights = (8_030_261_248 - 525_336_576) * 2  # every matrix but the input lookup, bf16
    p = decode_pass(shape, HW, batch=4, context=1000, kv_bytes=131_072)
    assert p.bytes == weights + 4 * 1000 * 131_072
    per_record = 2 * (8_030_261_248 - 525_336_576) + 4 * 32 * 32 * 128 * 1000
    assert p.flops == 4 * per_record
    assert p.seconds == pytest.approx(p.bytes / 1e12) and p.limit == BANDWIDTH


def test_mixture_of_experts_counts_all_and_active_parameters():
    shape = model_shape(MIXTRAL)  # Mixtral-8x7B: 46.7B parameters, 12.9B active
    assert shape.parameters == pytest.approx(46.70e9, rel=2e-3)
    assert shape.active_parameters == pytest.approx(12.88e9, rel=2e-3)
    assert shape.weights_read_per_pass(1) < shape.weights_read_per_pass(256)


def test_batch_that_fits_by_hand():
    work = Workload(1000, 1000 * 1000, 0, 0.0, output_per_record=24)
    settings = EngineSettings("auto", 256, 8192, 0.9)
    # each record holds 1,024 tokens x 131,072 bytes = 128 MiB at its end; 10 GiB hold 80
    batch = batch_that_fits(work, settings, 10 * 2**30, 131_072)
    assert (batch.size, batch.fits, batch.limited_by) == (80, 80, "memory")
    roomy = batch_that_fits(work, settings, 100 * 2**30, 131_072)
    assert (roomy.size, roomy.limited_by) == (256, "engine.max_num_seqs")
    # a prefix served from cache is shared, so it does not count again
    shared = Workload(1000, 1000 * 1000, 1000 * 512, 0.0, output_per_record=24)
    assert batch_that_fits(shared, settings, 10 * 2**30, 131_072).tokens_per_record == 512


def test_cost_per_million_tokens_by_hand():
    work = Workload(1000, 900_000, 0, 0.0, output_per_record=100)  # 1M tokens in all
    batch = Batch(1, 1, "memory", 1.0, 1, 1.0)
    pass_ = roofline(1.0, 1.0, HW)
    p = Prediction(batch, pass_, pass_, prefill_s=1800, decode_s=1800, work=work)
    row = headline(p, usd_per_gpu_hour=2.5, gpus=2)
    assert row["wall_hours"] == 1 and row["usd"] == 5.0
    assert row["usd_per_million_tokens"] == pytest.approx(5.0)
    assert row["tokens_per_s"] == pytest.approx(1e6 / 3600)


def test_fp8_kv_cache_fits_twice_the_records():
    shape, work = model_shape(LLAMA_3_8B), fixed_length_workload(5000, 2000, 500)
    hw = Hardware("h100", 1, 79.6 * 2**30, 3.35e12 * 0.64, 989e12 * 0.54, "bf16")
    settings = EngineSettings("auto", 4096, 8192, 0.9)
    bf16, fp8 = predict(shape, hw, work, settings, 2), predict(shape, hw, work, settings, 1)
    assert fp8.batch.fits in (2 * bf16.batch.fits, 2 * bf16.batch.fits + 1)
    assert fp8.output_tokens_per_s > bf16.output_tokens_per_s
    assert bf16.binding == "memory capacity"


def test_gpu_table_is_sane_and_sourced():
    assert {"h100", "h200", "a100", "l4", "l40s"} <= set(GPUS)
    for name, gpu in GPUS.items():
        assert "https://www.nvidia.com/" in gpu.source, name
        assert 10 < gpu.memory_gib < 200 and 100 < gpu.bandwidth_gbs < 10_000
        if gpu.fp8_tflops:
            assert gpu.fp8_tflops == pytest.approx(2 * gpu.bf16_tflops, rel=0.02)
    assert GPUS["h200"].bandwidth_gbs > GPUS["h100"].bandwidth_gbs > GPUS["a100"].bandwidth_gbs
    assert find_gpu("H100") is GPUS["h100"]
    mine = GpuSpec(memory_gib=96, bandwidth_gbs=4000, bf16_tflops=989)
    assert find_gpu("gh200", {"GH200": mine}) is mine
    with pytest.raises(SpecError, match="--gpu"):
        find_gpu("tpu")


def test_published_figures_are_predicted_within_35_percent():
    assert len(FIGURES) >= 5 and len({f.gpu for f in FIGURES}) >= 4
    errors = {
        f"{f.model} {f.gpu} {f.input_tokens}/{f.output_tokens}": error(f, predict_figure(f))
        for f in FIGURES
    }
    assert all(abs(e) <= 0.35 for e in errors.values()), errors


def test_docs_table_matches_the_predictions():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "capacity.md").read_text()
    for f in FIGURES:
        p = predict_figure(f)
        assert f"| {p.output_tokens_per_s:,.0f} | {error(f, p):+.0%} |" in doc, f


def tokenizer_only(model: Path, where: Path) -> Path:
    """The demo model's tokenizer files, without its config or weights."""
    where.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (model / name).exists():
            shutil.copy(model / name, where / name)
    return where


def plan_json(spec: Path, *args: str) -> dict:
    result = runner.invoke(app, ["jobs", "plan", str(spec), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_with_gpu_predicts_consistent_numbers(models, ticket_dir, tmp_path, write_spec):
    spec = write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"))
    c = plan_json(spec, "--gpu", "h100", "--output-tokens", "3")["capacity"]
    tokens = c["tokens"]["prompt"] + c["tokens"]["output"]
    assert c["tokens"]["output"] == 120 * 3 and c["output_tokens"]["source"] == "--output-tokens"
    assert c["wall_hours"] * 3600 == pytest.approx(tokens / c["tokens_per_s"])
    assert c["time_s"]["total"] == pytest.approx(c["time_s"]["prefill"] + c["time_s"]["decode"])
    assert c["usd"] == pytest.approx(c["wall_hours"] * 2.0 * 1)  # cost.usd_per_gpu_hour: 2.0
    assert c["usd_per_million_tokens"] == pytest.approx(c["usd"] / tokens * 1e6)
    assert c["binding_limit"] in {"arithmetic", "memory bandwidth", "memory capacity"}
    levers = {row["lever"]: row for row in c["levers"]}
    assert levers["as planned"]["tokens_per_s"] == c["tokens_per_s"]
    assert {"engine.kv_cache_dtype: auto", "engine.max_num_seqs: 256"} <= set(levers)
    assert c["gpu"]["source"].startswith("H100") and c["gpu"]["gpus"] == 1
    text = runner.invoke(app, ["jobs", "plan", str(spec), "--gpu", "l4", "--gpus", "2"]).output
    assert "capacity on 2 x l4" in text and "binding limit:" in text and "levers" in text


def test_a_70b_job_plans_from_its_config_alone(models, ticket_dir, tmp_path, write_spec):
    model = tokenizer_only(models["chat"], tmp_path / "llama-70b")
    config = {**LLAMA_3_70B, "architectures": ["LlamaForCausalLM"]}
    (model / "config.json").write_text(json.dumps(config))
    shape = model_shape(config)
    assert shape.parameters == pytest.approx(70.6e9, rel=1e-3)
    assert shape.kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680
    spec_data = spec_dict(model, ticket_dir, tmp_path / "out")
    spec_data["model"] = {"path": str(model), "max_model_len": 8192}
    spec = write_spec(spec_data)
    tp4 = ("--set", "engine.kv_cache_dtype=auto", "--set", "engine.tensor_parallel_size=4")
    c = plan_json(spec, "--gpu", "h100", "--gpus", "4", *tp4)["capacity"]
    assert c["model"]["kv_bytes_per_token"] == {"model_dtype": 327_680, "fp8": 163_840}
    assert c["model"]["weights_gib"] == pytest.approx(70.55e9 * 2 / 2**30, rel=1e-3)
    assert c["memory"]["kv_bytes_per_token"] == 327_680 and c["tokens_per_s"] > 0
    result = runner.invoke(app, ["jobs", "plan", str(spec), "--gpu", "h100", "--gpus", "1"])
    assert result.exit_code == 2 and "set engine.tensor_parallel_size to" in result.output


def test_gpu_without_a_model_config_names_model_path(models, ticket_dir, tmp_path, write_spec):
    model = tokenizer_only(models["chat"], tmp_path / "tokenizer-only")
    spec_data = spec_dict(model, ticket_dir, tmp_path / "out")
    spec = write_spec(spec_data)
    result = runner.invoke(app, ["jobs", "plan", str(spec), "--gpu", "h100"])
    assert result.exit_code == 2, result.output
    assert "model.path" in result.output and "config.json" in result.output
    spec = write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out"), "real.yaml")
    result = runner.invoke(app, ["jobs", "plan", str(spec), "--gpu", "tpu-v9"])
    assert result.exit_code == 2 and "--gpu: 'tpu-v9' is not a GPU" in result.output


def test_spec_overrides_gpus_and_efficiency(models, ticket_dir, tmp_path, write_spec):
    fast = {"memory_gib": 80.0, "bandwidth_gbs": 33500.0, "bf16_tflops": 9890.0}
    fast["fp32_tflops"] = 670.0  # the test model is float32: its FP32 units count
    capacity = {"gpus": {"h100x10": fast}, "bandwidth_efficiency": 0.5, "output_tokens": 4}
    capacity["step_overhead_s"] = 0  # the pure roofline scales with the GPU
    spec = write_spec(spec_dict(models["chat"], ticket_dir, tmp_path / "out", capacity=capacity))
    base = plan_json(spec, "--gpu", "h100")["capacity"]
    quick = plan_json(spec, "--gpu", "H100x10")["capacity"]
    assert quick["gpu"]["efficiency"]["bandwidth"] == 0.5
    assert quick["tokens_per_s"] == pytest.approx(10 * base["tokens_per_s"], rel=1e-6)
    assert base["output_tokens"] == {"per_record": 4, "source": "capacity.output_tokens"}


def test_float32_weights_run_on_the_fp32_units_not_the_tensor_cores():
    h100 = GPUS["h100"]
    fp32 = hardware("h100", h100, 1, 4, 0.64, 0.54)
    bf16 = hardware("h100", h100, 1, 2, 0.64, 0.54)
    assert fp32.compute_dtype == "fp32" and fp32.flops == pytest.approx(67e12 * 0.54)
    assert bf16.compute_dtype == "bf16" and bf16.flops / fp32.flops == pytest.approx(989 / 67)


def test_every_pass_pays_the_engines_step_cost():
    shape = model_shape(LLAMA_3_8B)
    bare = hardware("h200", GPUS["h200"], 1, 2, 0.64, 0.54)
    stepped = hardware("h200", GPUS["h200"], 1, 2, 0.64, 0.54, step_s=0.003)
    one, two = decode_pass(shape, bare, 1, 512, 131072), decode_pass(shape, stepped, 1, 512, 131072)
    assert two.seconds == pytest.approx(one.seconds + 0.003)
    assert two.as_dict()["step_s"] == 0.003


def test_gpus_are_data_parallel_workers_each_on_its_tensor_parallel_group():
    shape = model_shape(LLAMA_3_8B)
    hw = hardware("h100", GPUS["h100"], 1, 2, 0.64, 0.54, step_s=0.003)
    settings = EngineSettings("auto", 256, 8192, 0.9)
    work = fixed_length_workload(20_000, 512, 256)
    one = predict(shape, hw, work, settings, 2)
    four = predict(shape, hw, work, settings, 2, workers=4)
    assert four.batch.size == one.batch.size == 256  # each engine's own batch
    assert four.seconds == pytest.approx(one.seconds / 4, rel=0.01)
    assert four.tokens_per_s == pytest.approx(4 * one.tokens_per_s, rel=0.01)


def test_h100_and_h200_forms_are_matched_by_name_never_by_substring():
    assert gpu_for_device("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_for_device("NVIDIA H100 PCIe") == "h100-pcie"
    assert gpu_for_device("NVIDIA H100 NVL") == "h100-nvl"
    assert gpu_for_device("NVIDIA H200") == "h200"
    assert gpu_for_device("NVIDIA H200 NVL") == "h200-nvl"
    assert gpu_for_device("NVIDIA GH200 480GB") is None
    assert gpu_for_device("NVIDIA L40S") == "l40s" and gpu_for_device("NVIDIA L4") == "l4"
    assert GPUS["h100-pcie"].bandwidth_gbs < GPUS["h100"].bandwidth_gbs


def test_the_advice_follows_the_levers_table(models, tmp_path, write_spec):
    """40 short records under max_num_seqs 256: the batch is held by the records there
    are, and a larger max_num_seqs is no lever; with a batch held at 4 it is."""
    rows = [{"ticket_id": f"t{i}", "subject": "s", "body": f"body {i}"} for i in range(40)]
    inputs = write_records(tmp_path / "in" / "t.parquet", rows)
    spec = write_spec(spec_dict(models["chat"], inputs, tmp_path / "out"))
    seen = set()
    for seqs in (256, 4):
        c = plan_json(spec, "--gpu", "h100", "--set", f"engine.max_num_seqs={seqs}")["capacity"]
        if c["binding_limit"] != "memory bandwidth":
            continue
        base = c["tokens_per_s"]
        faster = [
            row for row in c["levers"]
            if row["lever"].startswith("engine.max_num_seqs:") and row["tokens_per_s"] > base * 1.02
        ]  # fmt: skip
        says_raise = c["advice"].startswith("raise engine.max_num_seqs")
        assert says_raise == bool(faster), (c["advice"], c["levers"])
        if not faster:
            assert "changes nothing here" in c["advice"]
        seen.add(says_raise)
    assert seen == {True, False}  # both cases met


def test_a_float32_checkpoint_under_dtype_auto_is_planned_in_bf16_as_vllm_runs_it():
    from nightshift.capacity.shape import gpu_dtype

    config = {"torch_dtype": "float32"}
    assert gpu_dtype(config, "auto") == "bfloat16"  # vLLM downcasts on a GPU
    assert gpu_dtype(config, "float32") == "float32"  # asked for: kept, at the FP32 rate
    assert gpu_dtype({"torch_dtype": "bfloat16"}, "auto") == "auto"
