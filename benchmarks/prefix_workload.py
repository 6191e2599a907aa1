"""The prefix-order workload: documents and questions, the random Llama that answers
them, the spec and input for each ``--shape``, and the block-granular optimum.

``benchmarks/prefix_order.py`` runs it through each side; ``batch_vs_runbatch.py``
shares its optimum. The model is built once in benchmarks/.cache/.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "benchmarks/.cache"
MODEL_DIR = CACHE / "prefix-order-llama-h512-l4"
SYSTEM = "Answer the question about the document in a few words."
TEMPLATE = "{document}\n\nQuestion: {question}"
SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
SHAPE = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "head_dim": 64}
HEADS = {"num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096}


def vocabulary() -> list[str]:
    rng = random.Random(0)
    words = {"".join(rng.choices(SYLLABLES, k=rng.randint(1, 4))) for _ in range(900)}
    return sorted(words)


def sentence(rng: random.Random, words: list[str]) -> str:
    return " ".join(rng.choices(words, k=rng.randint(6, 16))).capitalize() + "."


def build_model(directory: Path = MODEL_DIR) -> Path:
    """A random Llama (SHAPE, HEADS) with a chat template, saved in float32, built once."""
    if (directory / "config.json").exists():
        return directory
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from nightshift.demo.model import IM_END, train_tokenizer

    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / ".gitignore").write_text("*\n")
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    rng, words = random.Random(1), vocabulary()
    tokenizer = train_tokenizer(sentence(rng, words) for _ in range(5000))
    tokenizer.save_pretrained(staging)
    ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.convert_tokens_to_ids(IM_END),
    }
    config = LlamaConfig(
        vocab_size=len(tokenizer), tie_word_embeddings=True, **SHAPE, **HEADS, **ids
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).float().save_pretrained(staging)  # float32 weights
    GenerationConfig(**ids).save_pretrained(staging)
    staging.rename(directory)
    return directory


def make_rows(documents: int, questions: int, doc_tokens: int) -> list[dict]:
    """Rows in arrival order: question q of every document, then question q + 1."""
    from transformers import AutoTokenizer

    tokenizer, words, rng = AutoTokenizer.from_pretrained(MODEL_DIR), vocabulary(), random.Random(2)
    docs = []
    for _ in range(documents):
        text = sentence(rng, words)
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < doc_tokens:
            text += " " + sentence(rng, words)
        docs.append(text)
    asks = [
        [f"What does it say about {' and '.join(rng.sample(words, 2))}?" for _ in range(questions)]
        for _ in range(documents)
    ]
    return [
        {"id": f"d{d:03d}-q{q:02d}", "document": docs[d], "question": asks[d][q]}
        for q in range(questions)
        for d in range(documents)
    ]


def shaped(rows: list[dict], shape: str) -> list[dict]:
    """The records as the input of ``shape`` holds them (see the module docstring)."""
    if shape == "fields":
        return rows
    if shape == "column":
        return [{"id": r["id"], "prompt": TEMPLATE.format(**r)} for r in rows]
    return [{"id": r["id"], "messages": messages(r)[1:]} for r in rows]  # system: the spec's


def prompt_section(shape: str) -> dict:
    if shape == "messages":
        return {"system": SYSTEM, "messages_column": "messages"}
    return {"system": SYSTEM, "template": TEMPLATE if shape == "fields" else "{prompt}"}


def write_spec(tmp: Path, rows: list[dict], blocks: int, shape: str = "fields") -> Path:
    data = tmp / "records.parquet"
    pq.write_table(pa.Table.from_pylist(shaped(rows, shape)), data)
    spec = {
        "name": "prefix-order",
        "input": {"path": str(data), "id_column": "id"},
        "prompt": prompt_section(shape),
        "task": {"kind": "generate"},
        "model": {"path": str(MODEL_DIR), "max_model_len": 2048, "dtype": "float32"},
        "engine": {  # kv_cache_dtype: nightshift's default (fp8; auto where it cannot run)
            "enable_prefix_caching": True,
            "max_num_seqs": 256,
            "max_num_batched_tokens": 8192,
            "cpu_kv_cache_gib": 1,
            "extra": {"num_gpu_blocks_override": blocks, "enforce_eager": True},
        },
        "sampling": {"max_tokens": 8, "temperature": 0.0},
        "output": {"path": str(tmp / "nightshift-out")},
        "cost": {"gpu": "cpu", "gpus": 1, "usd_per_gpu_hour": 0.0},
    }
    path = tmp / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def token_ids(spec, rows: list[dict], shape: str = "fields") -> list[list[int]]:
    """nightshift's own token ids for ``rows`` (the one call that follows its encoder API)."""
    import polars as pl

    from nightshift.scheduling.plan import load_encoder
    from nightshift.scheduling.render import renderer_for
    from nightshift.scheduling.render import rows as piece_rows

    # Exactly as a run encodes them: piece by piece (see PromptEncoder.encode_pieces).
    encoder = load_encoder(spec)
    pieces = renderer_for(spec, encoder).pieces(pl.DataFrame(shaped(rows, shape)))
    return encoder.encode_pieces(piece_rows(pieces))


def messages(row: dict) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": TEMPLATE.format(**row)},
    ]


def chat_token_ids(rows: list[dict]) -> list[list[int]]:
    """The ids a chat endpoint builds: the chat template rendered, then encoded whole."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL_DIR)
    out = [
        tok.apply_chat_template(messages(r), tokenize=True, add_generation_prompt=True)
        for r in rows
    ]
    return [list(ids["input_ids"]) if hasattr(ids, "keys") else list(ids) for ids in out]


def optimum_cached(all_ids: list[list[int]], block: int) -> int:
    """Sum over prompts of the whole blocks shared with any earlier prompt (at most len - 1
    tokens, since one must be computed): what a perfect prefix cache of any size serves."""
    cached, total = set(), 0
    for ids in all_ids:
        key, hit = None, True
        for b in range(len(ids) // block):
            key = hash((key, tuple(ids[b * block : (b + 1) * block])))
            hit = hit and key in cached
            total += block if hit and (b + 1) * block <= len(ids) - 1 else 0
            cached.add(key)
    return total
