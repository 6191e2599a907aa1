"""Synthetic support tickets: deterministic, varied in length, a few very long.

Bodies are stitched from per-category sentences, with lengths drawn from a long-tailed
distribution so that planning, batching and over-length rejects all have work to do.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

CATEGORIES = {
    "billing": [
        "I was charged twice for my subscription this month.",
        "The invoice shows a plan I never signed up for.",
        "My card was declined although the balance is fine.",
        "Please refund the last payment, it was a mistake.",
        "The VAT number on my receipts is wrong.",
    ],
    "bug": [
        "The export button does nothing when I click it.",
        "The app crashes every time I open the settings page.",
        "Search results show items that were deleted weeks ago.",
        "Uploading a file over 10 MB fails with error 500.",
        "The dashboard chart is blank after the last update.",
    ],
    "feature_request": [
        "It would be great to schedule reports every morning.",
        "Could you add a dark mode to the mobile app?",
        "We need single sign-on with our identity provider.",
        "Please let us export data as Parquet as well as CSV.",
        "An API endpoint for bulk updates would save us hours.",
    ],
    "account": [
        "I cannot log in since I changed my email address.",
        "Please transfer ownership of the workspace to my colleague.",
        "Two-factor codes never arrive on my new phone.",
        "How do I delete my account and all my data?",
        "My team members cannot see the shared projects.",
    ],
    "other": [
        "Where can I find your office opening hours?",
        "Do you offer discounts for non-profit organisations?",
        "I just wanted to say the new release is excellent.",
        "Is there a status page for planned maintenance?",
        "Who should I contact about a partnership?",
    ],
}
FILLER = [
    "I have tried clearing the cache and logging out and in again.",
    "This has been going on for about a week now.",
    "Our whole team is affected, about twenty people.",
    'Here is what the log says: {"code": 42, "detail": "see {ticket}"}.',
    "We are on the business plan, renewed in March.",
    "I attached a screenshot to my previous message.",
    "Thanks in advance for looking into this.",
    "The problem happens on both Chrome and Firefox.",
]


def _body(rng: random.Random, category: str) -> str:
    # Long tail: most tickets are a few sentences, about 1 in 200 runs to thousands of words.
    sentences = max(1, int(rng.lognormvariate(1.6, 0.8)))
    if rng.random() < 0.005:
        sentences = rng.randint(250, 400)
    pool = CATEGORIES[category] + FILLER
    return " ".join(rng.choice(pool) for _ in range(sentences))


def tickets(count: int, seed: int = 7) -> Iterator[dict]:
    rng = random.Random(seed)
    names = list(CATEGORIES)
    for i in range(count):
        category = rng.choice(names)
        yield {
            "ticket_id": f"T{i:07d}",
            "subject": rng.choice(CATEGORIES[category])[:48],
            "body": _body(rng, category),
            "customer_tier": rng.choice(["free", "pro", "business"]),
            "true_category": category,
        }


def write_tickets(
    directory: Path, count: int = 20_000, files: int = 8, seed: int = 7
) -> list[Path]:
    """Write ``count`` tickets into ``files`` Parquet files; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.parquet"):
        old.unlink()
    rows = list(tickets(count, seed))
    per_file = -(-count // files)
    paths = []
    for index in range(files):
        part = rows[index * per_file : (index + 1) * per_file]
        if not part:
            break
        path = directory / f"tickets-{index:03d}.parquet"
        pq.write_table(pa.Table.from_pylist(part), path)
        paths.append(path)
    return paths


def corpus(lines: int = 4000, seed: int = 11) -> Iterator[str]:
    """Text to train the demo tokenizer on."""
    rng = random.Random(seed)
    every = [s for pool in CATEGORIES.values() for s in pool] + FILLER
    for _ in range(lines):
        yield " ".join(rng.choice(every) for _ in range(rng.randint(1, 6)))
