"""Spec validation: every user mistake names its key and says how to fix it."""

from __future__ import annotations

import copy

import pytest

from nightshift.errors import SpecError, SpecErrors
from nightshift.jobs.loading import apply_override, load_spec, validate_spec
from nightshift.jobs.spec import ClassifyTask, ExtractTask

from .conftest import spec_dict

BASE = spec_dict("model-dir", "data/*.parquet", "out/x")


def errors_for(data: dict) -> list[SpecError]:
    with pytest.raises(SpecErrors) as caught:
        validate_spec(data)
    return caught.value.errors


def with_change(path: str, value, delete: bool = False) -> dict:
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    if delete:
        del node[last]
    else:
        node[last] = value
    return data


def test_valid_spec_loads_with_defaults():
    spec = validate_spec(copy.deepcopy(BASE))
    assert isinstance(spec.task, ClassifyTask)
    assert spec.engine.kv_cache_dtype == "fp8"
    assert spec.engine.enable_prefix_caching is True
    assert spec.template_columns() == ["subject", "body"]


def test_unknown_key_is_named_with_its_path():
    [err] = errors_for(with_change("sampling.max_tokenz", 8))
    assert err.key == "sampling.max_tokenz"
    assert "unknown key" in str(err) and "did you mean sampling.max_tokens?" in str(err)


def test_unknown_top_level_section():
    [err] = errors_for(with_change("outptu", {"path": "x"}))
    assert err.key == "outptu"


def test_missing_field_is_named():
    [err] = errors_for(with_change("input.id_column", None, delete=True))
    assert err.key == "input.id_column"
    assert "missing" in str(err)


def test_wrong_type_is_named_with_the_value_given():
    [err] = errors_for(with_change("sampling.max_tokens", "eight"))
    assert err.key == "sampling.max_tokens"
    assert "'eight'" in str(err) and "whole number" in str(err)


def test_strict_types_do_not_coerce_quoted_numbers():
    [err] = errors_for(with_change("engine.max_num_seqs", "256"))
    assert err.key == "engine.max_num_seqs"


def test_several_problems_are_reported_together():
    data = with_change("sampling.max_tokens", "x")
    data["output"]["colour"] = "blue"
    keys = {e.key for e in errors_for(data)}
    assert keys == {"sampling.max_tokens", "output.colour"}


def test_unknown_task_kind_lists_the_choices():
    [err] = errors_for(with_change("task", {"kind": "summarise"}))
    assert err.key == "task"
    assert "generate, classify, extract" in str(err)


def test_classify_needs_distinct_labels():
    [err] = errors_for(with_change("task.labels", ["a", "a"]))
    assert err.key == "task.labels"


def test_extract_schema_must_be_a_valid_json_schema():
    [err] = errors_for(with_change("task", {"kind": "extract", "schema": {"type": "nope"}}))
    assert err.key == "task.schema"
    assert "not a valid JSON schema" in str(err)


def test_extract_schema_is_read_from_the_schema_key():
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    spec = validate_spec(with_change("task", {"kind": "extract", "schema": schema}))
    assert isinstance(spec.task, ExtractTask) and spec.task.json_schema == schema


def test_template_without_fields_is_rejected():
    [err] = errors_for(with_change("prompt.template", "no fields at all"))
    assert err.key == "prompt.template"


def test_template_with_a_stray_brace_says_how_to_escape():
    [err] = errors_for(with_change("prompt.template", "Subject: {subject"))
    assert err.key == "prompt.template" and "{{" in str(err)


def test_max_tokens_must_leave_room_for_a_prompt():
    errors = errors_for(with_change("sampling.max_tokens", 4096))
    assert "model.max_model_len" in str(errors[0])


def test_engine_extra_passes_anything_through():
    spec = validate_spec(with_change("engine.extra", {"num_gpu_blocks_override": 100}))
    assert spec.engine.extra == {"num_gpu_blocks_override": 100}


def test_set_overrides_parse_values_as_yaml(write_spec):
    path = write_spec(copy.deepcopy(BASE))
    spec = load_spec(
        path,
        [
            "sampling.max_tokens=16",
            "sampling.temperature=0.5",
            "output.path=elsewhere",
            "engine.extra.enforce_eager=false",
        ],
    )
    assert spec.sampling.max_tokens == 16 and spec.sampling.temperature == 0.5
    assert spec.output.path == "elsewhere"
    assert spec.engine.extra["enforce_eager"] is False


def test_set_override_without_equals_is_an_error():
    with pytest.raises(SpecError) as caught:
        apply_override({}, "sampling.max_tokens")
    assert caught.value.key == "--set"


def test_set_override_of_an_unknown_key_is_caught_by_validation(write_spec):
    path = write_spec(copy.deepcopy(BASE))
    with pytest.raises(SpecErrors) as caught:
        load_spec(path, ["sampling.top_q=0.9"])
    assert caught.value.errors[0].key == "sampling.top_q"


def test_missing_spec_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML at line"):
        load_spec(bad)


def test_shipped_configs_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs"
    specs = {p.name: load_spec(p) for p in sorted(root.glob("*.yaml"))}
    assert "classify.yaml" in specs
    classify = specs["classify.yaml"]
    assert classify.input.path == "data/demo/tickets/*.parquet"
    assert classify.engine.kv_cache_dtype == "fp8" and classify.engine.enable_prefix_caching


def test_kept_columns_may_not_be_written_under_one_name():
    [err] = errors_for(with_change("input.keep_columns", ["subject", "text", "input_text"]))
    assert err.key == "input.keep_columns" and "input_text would be written twice" in str(err)
    assert validate_spec(with_change("input.keep_columns", ["text"])).input.keep_columns == ["text"]


def test_empty_placeholder_is_refused():
    [err] = errors_for(with_change("prompt.template", "Subject: {} {body}"))
    assert err.key == "prompt.template" and "empty {} placeholder" in str(err)


def setting(path: str, value) -> dict:
    """BASE with ``path`` set, its sections created where BASE has none."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return data


def test_a_secret_in_engine_extra_is_refused_without_echoing_it():
    [error] = errors_for(with_change("engine.extra", {"hf_token": "hf_abc123"}))
    assert error.key == "engine.extra.hf_token"
    assert "HF_TOKEN" in str(error) and "hf_abc123" not in str(error)
    nested = {"model_loader_extra_config": {"s3SecretAccessKey": "zzz"}}
    [error] = errors_for(with_change("engine.extra", nested))
    assert error.key == "engine.extra.model_loader_extra_config.s3SecretAccessKey"
    assert "set it in the environment" in str(error) and "zzz" not in str(error)


@pytest.mark.parametrize(
    "key",
    [
        "hf_token",
        "HF_TOKEN",
        "api_key",
        "apiKey",
        "access_token",
        "db_password",
        "auth",
        "client_secret",
        "credentials",
        "aws_secret_access_key",
        "private_key",
    ],
)
def test_secret_like_names(key):
    from nightshift.jobs.secrets import looks_secret

    assert looks_secret(key)


def test_vllm_settings_that_mention_tokens_are_not_secrets():
    extra = {
        "long_prefill_token_threshold": 4,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "speculative_config": {"num_speculative_tokens": 2},
        "max_logprobs": 5,
    }
    assert validate_spec(with_change("engine.extra", extra)).engine.extra == extra


def test_a_yaml_key_that_is_a_list_is_named(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("name: x\n? [a, b]\n: 1\n")
    with pytest.raises(SpecError, match=r"the key \['a', 'b'\] at line 2 is a list"):
        load_spec(path)


@pytest.mark.parametrize(
    "key", ["sampling.max_tokens", "model.max_model_len", "plan.shard_records", "sampling.seed"]
)
def test_numbers_past_any_sane_size_are_refused(key):
    [error, *_] = errors_for(setting(key, 2**63))
    assert error.key == key and "out of range" in str(error)


@pytest.mark.parametrize(
    "key, value",
    [
        ("run.lease_s", float("inf")),
        ("run.chunk_seconds", float("nan")),
        ("run.retry_delay_s", [10.0, float("inf")]),
        ("cost.usd_per_gpu_hour", float("inf")),
        ("cost.expected_tokens_per_s", float("inf")),
        ("sampling.temperature", float("inf")),
    ],
)
def test_infinite_or_nan_settings_are_refused(key, value):
    [error] = errors_for(setting(key, value))
    assert error.key.startswith(key) and "finite" in str(error) and ".inf" in str(error)


def test_retry_delays_are_a_non_empty_list_of_non_negative_seconds():
    assert errors_for(setting("run.retry_delay_s", [-1.0]))[0].key == "run.retry_delay_s.0"
    assert errors_for(setting("run.retry_delay_s", []))[0].key == "run.retry_delay_s"


def test_an_infinite_gpu_in_the_capacity_section_is_refused():
    gpu = {"memory_gib": float("inf"), "bandwidth_gbs": 1.0, "bf16_tflops": 1.0}
    [error] = errors_for(setting("capacity.gpus", {"x": gpu}))
    assert error.key == "capacity.gpus.x.memory_gib" and "finite" in str(error)


def test_a_mistyped_secret_override_is_not_echoed():
    with pytest.raises(SpecError) as caught:
        apply_override({}, "engine.extra.hf_token hf_abc123")
    assert caught.value.key == "--set" and "hf_abc123" not in str(caught.value)


@pytest.mark.parametrize(
    ("path", "meant"),
    [
        ("sampling.max_tokns", "sampling.max_tokens"),
        ("task.lables", "task.labels"),
        ("engine.max_num_seq", "engine.max_num_seqs"),
        ("modle", "model"),
    ],
)
def test_a_misspelt_key_names_the_key_it_meant(path, meant):
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = node.get(meant.rsplit(".", 1)[-1], 1)
    errors = errors_for(data)
    assert [(e.key, e.fix) for e in errors if e.key == path] == [(path, f"did you mean {meant}?")]


def test_a_key_like_none_is_only_told_to_go():
    [err] = errors_for(with_change("sampling.zzz", 1))
    assert (err.key, err.fix) == ("sampling.zzz", "remove it or check its spelling")
