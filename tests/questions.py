"""The planner's workload: documents asked several questions each, arriving interleaved
(the fixture ``questions_input``, which conftest shares, and the job over it)."""

from __future__ import annotations

import pytest

from nightshift.jobs.loading import validate_spec

BLOCK = 16
DOCUMENTS, QUESTIONS = 6, 5
WORDS = [
    "the",
    "order",
    "of",
    "records",
    "is",
    "a",
    "performance",
    "setting",
    "for",
    "every",
    "prefix",
    "cache",
]


def document(d: int) -> str:
    words = [WORDS[(d * 7 + i * 3) % len(WORDS)] for i in range(60 + 25 * d)]
    return f"Document {d}: " + " ".join(words)


@pytest.fixture
def questions_input(tmp_path):
    """Every document's question q arrives before any document's question q + 1."""
    from .conftest import write_records  # conftest imports this module: not at its top

    rows = [
        {"qid": f"d{d}-q{q}", "document": document(d), "question": f"What about {q}? " * (q + 1)}
        for q in range(QUESTIONS)
        for d in range(DOCUMENTS)
    ]
    write_records(tmp_path / "in" / "a.parquet", rows[:13])
    write_records(tmp_path / "in" / "b.parquet", rows[13:])
    return tmp_path / "in"


def questions_spec(models, input_path, out, **overrides):
    from .conftest import spec_dict

    spec = spec_dict(
        models["chat"],
        input_path,
        out,
        input={"path": str(input_path), "id_column": "qid"},
        prompt={"system": "Answer briefly.", "template": "{document}\n\nQuestion: {question}"},
        task={"kind": "generate"},
        engine={"block_size": BLOCK, "max_num_seqs": 8},
        **overrides,
    )
    return validate_spec(spec)
