"""The batch file ``batch_vs_runbatch.py`` sends both ways: N ``/v1/chat/completions``
requests for the demo model, each with one of S long shared system texts (interleaved
at random through the file) and a distinct demo ticket; a share ask for a JSON schema.
Deterministic, and its block-granular prefix-cache optimum."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "benchmarks/.cache/batch-demo-model"
LABELS = ["billing", "bug", "feature_request", "account", "other"]
SCHEMA = {
    "type": "object",
    "properties": {"category": {"enum": LABELS}, "urgent": {"type": "boolean"}},
    "required": ["category", "urgent"],
    "additionalProperties": False,
}
BLOCK = 128  # KV block size of vLLM's CPU build: prefix-cache hits come in whole blocks


def build_model(directory: Path = MODEL_DIR) -> Path:
    """The demo model (nightshift.demo.model, a chat template), built once."""
    if (directory / "config.json").exists():
        return directory
    from nightshift.demo.model import build_model as build
    from nightshift.demo.tickets import corpus

    directory.parent.mkdir(parents=True, exist_ok=True)
    (directory.parent / ".gitignore").write_text("*\n")
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    build(staging, corpus())
    staging.rename(directory)
    return directory


def system_texts(count: int, tokens: int, model: Path) -> list[str]:
    """``count`` distinct instructions of at least ``tokens`` tokens each."""
    from transformers import AutoTokenizer

    from nightshift.demo.tickets import CATEGORIES, FILLER

    tokenizer, rng = AutoTokenizer.from_pretrained(model), random.Random(5)
    pool = [s for group in CATEGORIES.values() for s in group] + FILLER
    texts = []
    for i in range(count):
        text = f"Policy {i}: label each support ticket. Examples follow."
        while len(tokenizer(text, add_special_tokens=False)["input_ids"]) < tokens:
            text += f" Example: {rng.choice(pool)} Label: {rng.choice(LABELS)}."
        texts.append(text)
    return texts


def request_line(i: int, system: str, ticket: dict, model: str, args) -> dict:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Ticket {i}: {ticket['subject']}\n\n{ticket['body']}"},
        ],
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
    }
    every = round(1 / args.schema_share) if args.schema_share else 0
    if every and i % every == 0:
        body["max_tokens"] = args.schema_max_tokens
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "ticket", "schema": SCHEMA, "strict": True},
        }
    url = "/v1/chat/completions"
    return {"custom_id": f"req-{i:06d}", "method": "POST", "url": url, "body": body}


def write_input(path: Path, model: Path, args) -> dict:
    """The batch file; returns what it holds."""
    from nightshift.demo.tickets import tickets

    systems = system_texts(args.systems, args.system_tokens, model)
    rng = random.Random(9)
    order = [i % args.systems for i in range(args.requests)]
    rng.shuffle(order)  # every system text's records interleaved through the file
    lines = [
        request_line(i, systems[s], {**t, "body": t["body"][: args.body_chars]}, model.name, args)
        for i, (s, t) in enumerate(zip(order, tickets(args.requests, seed=3), strict=True))
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    schema = sum("response_format" in line["body"] for line in lines)
    return {"requests": len(lines), "json_schema_requests": schema, "bytes": path.stat().st_size}


def read_lines(path: Path) -> list[dict]:
    return (
        []
        if not path.exists()
        else [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    )


def optimum_cached(path: Path, model: Path, block: int = BLOCK) -> int:
    """What a perfect prefix cache serves over the requests' chat prompts, in any order
    (``prefix_workload.optimum_cached`` on their token ids)."""
    from prefix_workload import optimum_cached as optimum_of_ids
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [
        tokenizer.apply_chat_template(
            line["body"]["messages"], tokenize=False, add_generation_prompt=True
        )
        for line in read_lines(path)
    ]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return optimum_of_ids(ids, block)
