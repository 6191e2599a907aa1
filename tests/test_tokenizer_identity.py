"""A tokenizer loaded again by its class (``engines.tokenizerid.TokenizerIdentity``), as an
encoding process loads the run's: the same ids and template without AutoTokenizer's
torch import, and AutoTokenizer again whenever the class would not give the same."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
import subprocess
import sys

from nightshift.engines.fastbpe import check_texts
from nightshift.engines.tokenizer import PromptEncoder
from nightshift.engines.tokenizerid import TokenizerIdentity


def test_the_same_tokenizer_by_its_class_without_torch(models):
    identity = PromptEncoder.load(str(models["chat"])).identity()
    code = (
        "import json, pickle, sys\n"
        "from nightshift.engines.tokenizer import PromptEncoder\n"
        "e = PromptEncoder.load(sys.argv[1], like=pickle.loads(bytes.fromhex(sys.argv[2])))\n"
        "from nightshift.engines.fastbpe import check_texts\n"
        "print(json.dumps(['torch' in sys.modules, e.encode_texts(check_texts()),"
        " e.hf_tokenizer.chat_template]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(models["chat"]), pickle.dumps(identity).hex()],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    torch, ids, template = json.loads(out.stdout.strip().splitlines()[-1])
    run = PromptEncoder.load(str(models["chat"]))
    assert not torch
    assert ids == run.encode_texts(check_texts())
    assert template == run.hf_tokenizer.chat_template


def test_a_tokenizer_that_differs_is_loaded_through_autotokenizer(models, tmp_path):
    identity = PromptEncoder.load(str(models["chat"])).identity()
    other = shutil.copytree(models["chat"], tmp_path / "other")
    template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    (other / "chat_template.jinja").write_text(template)
    assert identity.load(str(other)) is None  # same class, another template
    loaded = PromptEncoder.load(str(other), like=identity)
    assert loaded.hf_tokenizer.chat_template == template
    stranger = dataclasses.replace(identity, module="transformers_modules.mine.tokenization_mine")
    assert stranger.load(str(models["chat"])) is None  # a model's own code: no name
    assert TokenizerIdentity.of(loaded.hf_tokenizer).digest != identity.digest


def test_an_identity_edited_into_a_plan_by_hand_never_loads_anything_else(models):
    """A damaged or hostile plan.json entry: no model class's weights, no other package,
    no crash; ``load`` says None and the resume goes through AutoTokenizer."""
    real = PromptEncoder.load(str(models["chat"])).identity()
    wrong = [
        TokenizerIdentity("transformers.models.auto.configuration_auto", "AutoConfig", "x"),
        TokenizerIdentity("transformers.models.llama.modeling_llama", "LlamaForCausalLM", "x"),
        TokenizerIdentity("os", "system", real.digest),
        TokenizerIdentity(None, "x", "y"),  # type: ignore[arg-type]
        TokenizerIdentity(real.module, "NoSuchClass", real.digest),
        dataclasses.replace(real, digest="0" * 64),
    ]
    for identity in wrong:
        assert identity.load(str(models["chat"])) is None, identity
    assert real.load(str(models["chat"])) is not None
    encoder = PromptEncoder.load(str(models["chat"]), like=wrong[1])  # AutoTokenizer's
    assert encoder.encode_texts(check_texts()) == PromptEncoder.load(
        str(models["chat"])
    ).encode_texts(check_texts())
