"""What each task kind asks of the engine and how its answers are read back.

A small registry keyed by ``task.kind``: each entry says which guided-decoding
constraint to use, which columns it adds to the output, and how to parse one answer.
An answer that does not parse is a per-record failure, kept with its text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from nightshift.engines.base import Constraint, Sampling
from nightshift.errors import RecordError
from nightshift.jobs.columns import TASK_COLUMNS
from nightshift.jobs.spec import ClassifyTask, ExtractTask, GenerateTask, JobSpec


@dataclass(frozen=True)
class TaskHandler:
    constraint: Constraint | None
    columns: dict[str, pa.DataType]
    min_tokens: int = 0  # an answer budget below this could cut a valid answer short

    def parse(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {}


class ClassifyHandler(TaskHandler):
    def parse(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        label = text.strip()
        if label not in self.constraint.choice:
            raise RecordError(f"answer {text[:80]!r} is not one of the labels")
        return {"label": label}


class ExtractHandler(TaskHandler):
    def parse(self, text: str, finish_reason: str | None) -> dict[str, Any]:
        import jsonschema

        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            hint = " (cut off by sampling.max_tokens)" if finish_reason == "length" else ""
            raise RecordError(f"answer is not valid JSON{hint}: {exc.msg}") from None
        try:
            jsonschema.validate(value, self.constraint.json_schema)
        except jsonschema.ValidationError as exc:
            raise RecordError(f"answer does not match task.schema: {exc.message}") from None
        compact = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return {"json": compact}


def _generate(task: GenerateTask) -> TaskHandler:
    return TaskHandler(constraint=None, columns=TASK_COLUMNS["generate"])


def _classify(task: ClassifyTask) -> TaskHandler:
    # Guided choice may spell a label in any tokenization, but every token is at least one
    # byte: the longest label's bytes plus an end token always suffice, and the answer
    # stops there, so the larger budget costs nothing.
    longest = max(len(label.encode()) for label in task.labels)
    return ClassifyHandler(
        Constraint(choice=tuple(task.labels)), TASK_COLUMNS["classify"], min_tokens=longest + 1
    )


def _extract(task: ExtractTask) -> TaskHandler:
    return ExtractHandler(Constraint(json_schema=task.json_schema), TASK_COLUMNS["extract"])


_HANDLERS = {"generate": _generate, "classify": _classify, "extract": _extract}


def handler_for(task: GenerateTask | ClassifyTask | ExtractTask) -> TaskHandler:
    return _HANDLERS[task.kind](task)


def answer_budget(spec: JobSpec) -> int:
    """Tokens reserved for each answer: sampling.max_tokens, raised where the task needs it."""
    return max(spec.sampling.max_tokens, handler_for(spec.task).min_tokens)


def sampling_for(spec: JobSpec, task: TaskHandler) -> Sampling:
    s = spec.sampling
    budget = answer_budget(spec)
    return Sampling(budget, s.temperature, s.top_p, s.seed, tuple(s.stop), task.constraint)


def shared_first_tokens(labels: list[str], encode) -> list[tuple[str, list[str]]]:
    """Labels an answer can begin with one same token: ``(token text, labels)`` each.

    Greedy guided choice commits to a first token, and any vocabulary token that starts
    two labels (a single letter always does, in a byte-level vocabulary) gathers both
    labels' probability: the label set ``billing, bug, ...`` answers ``billing`` far more
    often than it should. ``encode(text)`` is the tokenizer's ids of plain text; a prefix
    is a token when it encodes to one id. The longest such prefix is named per group.
    """
    groups: dict[str, list[str]] = {}
    for label in dict.fromkeys(labels):
        for k in range(1, min(len(label), 32) + 1):
            if len(encode(label[:k])) == 1:
                groups.setdefault(label[:k], []).append(label)
    longest: dict[tuple[str, ...], str] = {}
    for piece, members in groups.items():
        if len(members) > 1 and len(piece) > len(longest.get(tuple(members), "")):
            longest[tuple(members)] = piece
    return [(piece, list(members)) for members, piece in longest.items()]


def label_warnings(spec: JobSpec, encode) -> list[str]:
    """What ``jobs plan`` says about a classify job's labels under its tokenizer."""
    if spec.task.kind != "classify":
        return []
    return [
        f"task.labels: {', '.join(members)} can all start with the token {piece!r} under "
        "this model's tokenizer; guided choice commits to a first token, so their "
        "probabilities pool there and one of them is chosen far more often than it "
        "should be. Give labels that start differently (e.g. payment, defect, login, "
        "general instead of billing, bug, account, other)."
        for piece, members in shared_first_tokens(spec.task.labels, encode)
    ]
