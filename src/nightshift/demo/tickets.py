"""Synthetic support tickets with ground truth: deterministic, varied, a few very long.

Each ticket has a true label (``true_label``, a column the prompt never reads) among four
categories whose names start with distinct first tokens in the demo model's tokenizer
(``payment, defect, login, general``): guided choice commits to a first token, so labels
that share one pool their probability there (``jobs plan`` warns about such label sets).

A body is stitched from sentences of its category, several phrasings each, with filler,
greetings and sloppy typing as noise. About one ticket in eight also mentions another
category (a charge that failed *because* of an error, a login problem after paying);
its label stays what the customer most needs acted on, the subject's category. A few
tickets are hand-written borderline cases (``AMBIGUOUS``). Lengths follow a long-tailed
distribution, so planning, batching and over-length rejects all have work to do.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

LABELS = ("payment", "defect", "login", "general")
LABEL_COLUMN = "true_label"  # not "label": that name is nightshift's classify output column
CATEGORIES = {
    "payment": [
        "I was charged twice for my subscription this month.",
        "The invoice shows a plan I never signed up for.",
        "My card was declined although the balance is fine.",
        "Please refund the last payment, it was a mistake.",
        "The VAT number on my receipts is wrong.",
        "Why did my monthly price go up without any notice?",
        "I cancelled last week but you billed me again today.",
        "Can I pay by bank transfer instead of credit card?",
        "We need a copy of every invoice from last year for our accountant.",
        "The discount code was not applied to my order.",
        "You took money from my account twice for one renewal.",
        "How do I change the credit card you charge each month?",
    ],
    "defect": [
        "The export button does nothing when I click it.",
        "The app crashes every time I open the settings page.",
        "Search results show items that were deleted weeks ago.",
        "Uploading a file over 10 MB fails with error 500.",
        "The dashboard chart is blank after the last update.",
        "The page freezes and then shows a white screen.",
        "Saving a report loses every change I made.",
        "Dates in the calendar view are shifted by one day.",
        "Notifications arrive three times for the same event.",
        "The mobile app closes as soon as I take a photo.",
        "The PDF export cuts off the last column of the table.",
        "Sync has been stuck at 99 percent since yesterday.",
    ],
    "login": [
        "I cannot log in since I changed my email address.",
        "The password reset link in your email has expired.",
        "Two-factor codes never arrive on my new phone.",
        "My account is locked after too many sign-in attempts.",
        "Please transfer ownership of the workspace to my colleague.",
        "How do I delete my account and all my data?",
        "My team members cannot see the shared projects.",
        "I forgot my password and the recovery email goes nowhere.",
        "Single sign-on sends me back to the login page every time.",
        "Please merge my two accounts into one.",
        "A new colleague never received the invitation to join our team.",
        "It says my username does not exist, but I have used it for years.",
    ],
    "general": [
        "Where can I find your office opening hours?",
        "Do you offer discounts for non-profit organisations?",
        "I just wanted to say the new release is excellent.",
        "Is there a status page for planned maintenance?",
        "Who should I contact about a partnership?",
        "Could you add a dark mode to the mobile app?",
        "Do you have a roadmap for the next year?",
        "Are you hiring engineers in Berlin?",
        "Can I get a printed manual for the product?",
        "We would love to see an API for bulk updates some day.",
        "Do you plan to open a data centre in Canada?",
        "Thanks for the great webinar last Tuesday.",
    ],
}
SUBJECTS = {
    "payment": [
        "Double charge",
        "Refund request",
        "Invoice question",
        "Billing issue",
        "Charged again",
        "Card declined",
        "Price change",
    ],
    "defect": [
        "App crashes",
        "Export broken",
        "Error 500",
        "Bug report",
        "Blank dashboard",
        "Something is broken",
        "Sync stuck",
    ],
    "login": [
        "Cannot log in",
        "Password reset",
        "Locked out",
        "2FA not working",
        "Account access",
        "Team permissions",
        "Delete my account",
    ],
    "general": [
        "Question",
        "Partnership",
        "Feedback",
        "Opening hours",
        "Feature idea",
        "Just saying thanks",
        "Roadmap",
    ],
}
VAGUE_SUBJECTS = ["Help", "Urgent", "Hello", "Issue", "Support request", "(no subject)"]
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
GREETINGS = ["Hi team,", "Hello,", "Dear support,", "hey", "Good morning,"]
SIGN_OFFS = ["Best regards, Anna", "Thanks, Tom", "Sent from my phone", "Cheers", "-- Maria"]
# Borderline tickets, each with the label a careful human would give (the need behind it).
AMBIGUOUS = [
    ("Payment failed", "The payment page shows error 500 when I try to pay.", "defect"),
    ("Charged but locked out", "You charged my card but I cannot sign in to use it.", "login"),
    ("Refund?", "The export has been broken for a month, I want my money back.", "payment"),
    ("Invoices", "Could you add a button to download all invoices at once?", "general"),
    ("Login slow", "The login page takes two minutes to load and then times out.", "defect"),
    ("New plan", "Which plan do I need to add ten more team members?", "payment"),
]


def _sloppy(rng: random.Random, text: str) -> str:
    """Noise as people type it: all lower case, no full stops, or a doubled letter."""
    roll = rng.random()
    if roll < 0.1:
        return text.lower()
    if roll < 0.15:
        return text.replace(".", "")
    if roll < 0.2 and len(text) > 8:
        k = rng.randrange(1, len(text) - 1)
        return text[:k] + text[k] + text[k:]
    return text


def _body(rng: random.Random, category: str) -> str:
    # Long tail: most tickets are a few sentences, about 1 in 200 runs to thousands of words.
    sentences = max(1, int(rng.lognormvariate(1.6, 0.8)))
    if rng.random() < 0.005:
        sentences = rng.randint(250, 400)
    own = CATEGORIES[category]
    # The first sentence always says what the ticket is about; the rest mixes in filler.
    parts = [rng.choice(own)]
    parts += [rng.choice(own + FILLER) for _ in range(sentences - 1)]
    if rng.random() < 0.125:  # also mentions another category, in passing
        other = rng.choice([c for c in CATEGORIES if c != category])
        parts.insert(rng.randint(1, len(parts)), "Also, " + rng.choice(CATEGORIES[other]).lower())
    if rng.random() < 0.3:
        parts.insert(0, rng.choice(GREETINGS))
    if rng.random() < 0.3:
        parts.append(rng.choice(SIGN_OFFS))
    return _sloppy(rng, " ".join(parts))


def _ticket(rng: random.Random) -> tuple[str, str, str]:
    """(subject, body, true label) of one ticket."""
    if rng.random() < 0.03:
        subject, body, label = rng.choice(AMBIGUOUS)
        return subject, body, label
    label = rng.choice(LABELS)
    vague = rng.random() < 0.15
    subject = rng.choice(VAGUE_SUBJECTS if vague else SUBJECTS[label])
    return subject, _body(rng, label), label


def tickets(count: int, seed: int = 7) -> Iterator[dict]:
    rng = random.Random(seed)
    for i in range(count):
        subject, body, label = _ticket(rng)
        yield {
            "ticket_id": f"T{i:07d}",
            "subject": subject,
            "body": body,
            "customer_tier": rng.choice(["free", "pro", "business"]),
            "true_category": label,  # kept for older readers: the same as true_label
            LABEL_COLUMN: label,
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
    every += [s for pool in SUBJECTS.values() for s in pool] + GREETINGS + SIGN_OFFS
    for _ in range(lines):
        yield " ".join(rng.choice(every) for _ in range(rng.randint(1, 6)))
