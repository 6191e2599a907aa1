"""AutoTokenizer's pick for a model folder, remembered between runs
(``scheduling.tokenizermemo``): a second fresh run loads the same tokenizer by its class,
without torch; edited prompt files, a damaged memo or an unwritable cache all load
through AutoTokenizer and lose nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from nightshift.engines.fastbpe import check_texts
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.jobs.loading import validate_spec
from nightshift.scheduling import tokenizermemo
from nightshift.scheduling.plan import load_encoder

from .conftest import spec_dict

LOAD = (
    "import json, sys, yaml\n"
    "from nightshift.jobs.loading import validate_spec\n"
    "from nightshift.scheduling.plan import load_encoder\n"
    "from nightshift.engines.fastbpe import check_texts\n"
    "e = load_encoder(validate_spec(yaml.safe_load(open(sys.argv[1]))))\n"
    "print(json.dumps(['torch' in sys.modules, e.encode_texts(check_texts()),"
    " type(e.hf_tokenizer).__name__]))\n"
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(tokenizermemo.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def _spec(model, tmp_path):
    return validate_spec(spec_dict(model, tmp_path / "in", tmp_path / "out"))


def _load_in_a_process(spec_path, cache):
    env = {**os.environ, tokenizermemo.CACHE_ENV: str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(spec_path)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_run_of_a_folder_loads_its_tokenizer_without_autotokenizer(
    models, tmp_path, cache
):
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec_dict(models["chat"], tmp_path, tmp_path / "o")))
    first = _load_in_a_process(spec_path, cache)
    assert first[0]  # AutoTokenizer picked the class, and imported torch to do it
    assert len(list((cache / "tokenizers").glob("*.json"))) == 1
    second = _load_in_a_process(spec_path, cache)
    assert not second[0]
    assert second[1:] == first[1:]  # the same class, the same ids


def test_edited_prompt_files_are_never_taken_for_the_remembered_tokenizer(models, tmp_path, cache):
    folder = shutil.copytree(models["chat"], tmp_path / "model")
    first = load_encoder(_spec(folder, tmp_path))
    assert tokenizermemo.recall(str(folder), False) == first.identity()
    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    (folder / "chat_template.jinja").write_text(template)
    assert tokenizermemo.recall(str(folder), False) is None  # other files: another entry
    edited = load_encoder(_spec(folder, tmp_path))
    assert edited.hf_tokenizer.chat_template == template
    assert tokenizermemo.recall(str(folder), False) == edited.identity() != first.identity()


@pytest.mark.parametrize("damage", ["not json", "wrong digest", "not a tokenizer"])
def test_a_damaged_memo_loads_through_autotokenizer_and_is_written_again(
    models, tmp_path, cache, damage
):
    spec = _spec(models["chat"], tmp_path)
    real = load_encoder(spec)
    [entry] = (cache / "tokenizers").glob("*.json")
    known = json.loads(entry.read_text())
    entry.write_text(
        {
            "not json": "{",
            "wrong digest": json.dumps({**known, "digest": "0" * 64}),
            "not a tokenizer": json.dumps({**known, "module": "os", "name": "system"}),
        }[damage]
    )
    again = load_encoder(spec)
    assert again.encode_texts(check_texts()) == real.encode_texts(check_texts())
    assert json.loads(entry.read_text()) == known


def test_a_cache_that_cannot_be_written_loses_nothing(models, tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(tokenizermemo.CACHE_ENV, str(blocked))
    encoder = load_encoder(_spec(models["chat"], tmp_path))
    plain = PromptEncoder.load(str(models["chat"]))
    assert encoder.encode_texts(check_texts()) == plain.encode_texts(check_texts())
    assert tokenizermemo.recall(str(models["chat"]), False) is None


def test_remote_code_and_hub_ids_are_never_remembered(models, cache):
    identity = PromptEncoder.load(str(models["chat"])).identity()
    tokenizermemo.remember(str(models["chat"]), True, identity)
    tokenizermemo.remember("HuggingFaceTB/SmolLM2-135M-Instruct", False, identity)
    assert not cache.exists()
    assert tokenizermemo.recall(str(models["chat"]), True) is None
