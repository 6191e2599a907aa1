"""A model folder's identity: a digest per file, cheap enough for a 140 GB model.

Every file that shapes the prompt (tokenizer, vocab, merges, chat template, configs,
remote code) and every other small file is hashed in full: an edited
``chat_template.jinja`` must stop a resume, or one output mixes two prompt formats.

Weights are too big to hash on every run, and their sizes do not change when a model is
fine-tuned, so they are sampled. A safetensors file: its JSON header (every tensor's
name, dtype, shape and offsets) and a 4 KiB slice from the middle of up to 64 tensors,
spread over the file. Any other large file (``.bin``, ``.pt``, ``.gguf``): 64 blocks of
64 KiB at fixed offsets. Both include the size. Training rewrites every tensor it
touches, so slices are enough to tell checkpoints apart; an edit of a single byte that no
slice covers is not seen (a file under 16 MiB is hashed whole). Reads per large file:
the header plus 256 KiB (safetensors) or 4 MiB (other formats): about 10 MB for a
140 GB model in 30 files.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

FULL_HASH_BYTES = 16 << 20  # files up to this size are hashed whole, whatever they are
# Hashed whole at any size: what the tokenizer, the template and the model code read.
PROMPT_FILES = (
    "tokenizer*",
    "vocab*",
    "merges*",
    "special_tokens_map*",
    "added_tokens*",
    "chat_template*",
    "*.jinja",
    "*.json",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.py",
)
# Not read by any loader: documentation, licences, git bookkeeping.
IGNORED_FILES = (".*", "*.md", "license*", "notice*", "use_policy*")
SAFETENSORS_HEADER_MAX = 100 << 20  # a larger header is not one: sample the file blindly
TENSOR_SLICES = 64
TENSOR_SLICE_BYTES = 4 << 10
BLOCKS = 64
BLOCK_BYTES = 64 << 10


def folder_identity(folder: Path, only: tuple[str, ...] | None = None) -> dict[str, str]:
    """File name -> digest, for every file of ``folder`` a model loader may read (the
    top level, where tokenizers, templates, configs and weights are looked for); with
    ``only`` (``PROMPT_FILES``: what picks and builds the tokenizer), those files alone,
    every one hashed whole and no weight read."""
    return {
        path.name: file_digest(path)
        for path in sorted(folder.iterdir())
        if path.is_file()
        and not _matches(path.name, IGNORED_FILES)
        and (only is None or _matches(path.name, only))
    }


def file_digest(path: Path) -> str:
    """``sha256:...`` for a file hashed whole, ``sampled:...`` for a large one."""
    size = path.stat().st_size
    with path.open("rb") as stream:
        if size <= FULL_HASH_BYTES or _matches(path.name, PROMPT_FILES):
            return "sha256:" + _hash_whole(stream)
        digest = hashlib.sha256(f"{size}:".encode())
        if not (path.suffix == ".safetensors" and _sample_safetensors(stream, size, digest)):
            _sample_blocks(stream, size, digest)
    return "sampled:" + digest.hexdigest()[:16]


def _hash_whole(stream: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := stream.read(1 << 20):
        digest.update(chunk)
    return digest.hexdigest()[:16]


def _matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name.lower(), pattern) for pattern in patterns)


def _sample_safetensors(stream: BinaryIO, size: int, digest: Any) -> bool:
    """Header and tensor slices into ``digest``; False if the file is no safetensors."""
    prefix = stream.read(8)
    if len(prefix) < 8:
        return False
    (length,) = struct.unpack("<Q", prefix)
    if length > min(SAFETENSORS_HEADER_MAX, size - 8):
        return False
    header = stream.read(length)
    try:
        tensors = json.loads(header)
        spans = sorted(
            (int(t["data_offsets"][0]), int(t["data_offsets"][1]))
            for k, t in tensors.items()
            if k != "__metadata__"
        )
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False
    if any(begin < 0 or end < begin for begin, end in spans):
        return False
    digest.update(header)
    step = max(1, len(spans) / TENSOR_SLICES)
    for i in range(min(len(spans), TENSOR_SLICES)):
        begin, end = spans[int(i * step)]
        middle = (begin + end) // 2
        start = max(begin, middle - TENSOR_SLICE_BYTES // 2)
        stream.seek(8 + length + start)
        digest.update(stream.read(min(TENSOR_SLICE_BYTES, end - start)))
    return True


def _sample_blocks(stream: BinaryIO, size: int, digest: Any) -> None:
    """Blocks at offsets that depend only on the size: the first, the last, evenly between."""
    last = max(0, size - BLOCK_BYTES)
    for i in range(BLOCKS):
        stream.seek(last * i // (BLOCKS - 1))
        digest.update(stream.read(BLOCK_BYTES))
