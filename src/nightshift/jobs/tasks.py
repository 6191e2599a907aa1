"""What each task kind asks of the engine and how its answers are read back.

A small registry keyed by ``task.kind``: each entry says which guided-decoding
constraint to use, which columns it adds to the output, and how to parse one answer.
An answer that does not parse is a per-record failure, kept with its text.

Classify scores labels rather than generating one (``task.calibrate``, on by default):
the engine returns the log probability of each label's first token at the answer's
first place, and the label is the likeliest once the model's own leaning is taken out
(``LabelScoring``; the leaning is measured on a sample of the job's records, see
``running.calibration``). Greedy guided choice instead commits to the likeliest first
*token* among every prefix of every label: a small model's mass on a bare ``d`` picks
``defect`` for ticket after ticket. Labels whose first tokens coincide cannot be told
apart by their first token; they keep guided choice (``jobs plan`` warns).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from nightshift.engines.base import Constraint, EngineResult, Pooling, Sampling
from nightshift.engines.reasoning import REASONING_LENGTH, thinking_allowance
from nightshift.errors import RecordError, SpecError
from nightshift.jobs.columns import TASK_COLUMNS
from nightshift.jobs.labelling import LabelScoring, label_of, label_rows, scored_columns
from nightshift.jobs.spec import ClassifyTask, EmbedTask, ExtractTask, GenerateTask, JobSpec


@dataclass(frozen=True)
class TaskHandler:
    constraint: Constraint | None
    columns: dict[str, pa.DataType]
    min_tokens: int = 0  # an answer budget below this could cut a valid answer short

    def parse(
        self, text: str, finish_reason: str | None, scores: Sequence[float] | None = None
    ) -> dict[str, Any]:
        return {}

    def parse_result(self, result: EngineResult) -> dict[str, Any]:
        """The task's columns of one answer; ``RecordError`` when it is no valid answer
        (``reasoning_length``: a reasoning model thought until no token was left)."""
        if result.reasoning_unfinished and result.finish_reason != "length":
            raise RecordError(  # an end token inside the thinking: no answer either
                "no_answer: the model ended inside its reasoning, before any answer",
                "no_answer",
            )
        if result.reasoning_unfinished:
            raise RecordError(
                f"{REASONING_LENGTH}: the reasoning spent all {result.output_tokens} output "
                "tokens before any answer (set sampling.reasoning_budget, or raise "
                "sampling.max_tokens)",
                REASONING_LENGTH,
            )
        return self.parse(result.text, result.finish_reason, result.scores)

    def answer_columns(self, result: EngineResult) -> dict[str, Any]:
        """``parse_result`` as a run's row takes it: a task may leave some columns to
        ``finish_rows``, where a chunk of rows is done at once."""
        return self.parse_result(result)

    def finish_rows(self, rows: list[dict[str, Any]]) -> None:
        """Fill in what ``answer_columns`` left open in a chunk's rows (nothing here)."""

    def under(self, adapter: str | None) -> TaskHandler:
        """The handler that reads answers given under LoRA ``adapter`` (None: the base
        model): this one, but for classify calibrated per adapter."""
        return self


@dataclass(frozen=True)
class ClassifyHandler(TaskHandler):
    scoring: LabelScoring | None = None  # None: guided choice
    # calibrated per LoRA adapter: each adapter's handler (None: the base model's)
    adapters: Mapping[str | None, ClassifyHandler] | None = field(default=None, compare=False)

    def parse(
        self, text: str, finish_reason: str | None, scores: Sequence[float] | None = None
    ) -> dict[str, Any]:
        if self.scoring is None:
            label = text.strip()
            if label not in self.constraint.choice:
                raise RecordError(f"answer {text[:80]!r} is not one of the labels")
            return {"label": label, "confidence": None}
        if scores is None or len(scores) != len(self.scoring.labels):
            raise RecordError("the engine returned no score for each label")
        label, confidence = label_of(self.scoring, scores)
        # one scoring step ends at max_tokens 1, yet the label is whole: not cut off
        return {"label": label, "text": label, "confidence": confidence, "finish_reason": "stop"}

    def answer_columns(self, result: EngineResult) -> dict[str, Any]:
        """A scored answer is checked now and labelled with its chunk (``jobs.labelling``):
        any answer the check would not pass goes through ``parse_result`` (its error)."""
        scoring, scores = self.scoring, result.scores
        if (
            scoring is None
            or result.reasoning_unfinished
            or scores is None
            or len(scores) != len(scoring.labels)
            or not scoring.plain_prior
            or max(scores) == -math.inf  # with a plain leaning: every label impossible
        ):
            return self.parse_result(result)
        return scored_columns(scoring, scores)

    def finish_rows(self, rows: list[dict[str, Any]]) -> None:
        label_rows(rows)

    def calibrated(
        self,
        log_prior: Sequence[float],
        by_adapter: Mapping[str | None, Sequence[float]] | None = None,
    ) -> ClassifyHandler:
        """Labelling with the leaning ``log_prior`` divided out; ``by_adapter``: each
        adapter's own leaning, for its records (an adapter not in it: ``log_prior``)."""
        scoring = replace(self.scoring, log_prior=tuple(log_prior))
        job = replace(self, scoring=scoring, adapters=None)
        if not by_adapter:
            return job
        return replace(job, adapters={a: job.calibrated(p) for a, p in by_adapter.items()})

    def under(self, adapter: str | None) -> TaskHandler:
        return self if self.adapters is None else self.adapters.get(adapter, self)


@dataclass(frozen=True)
class EmbedHandler(TaskHandler):
    """An embed job's vector: ``embedding``, a fixed-size list of float32 of the model's
    embedding size (``embed.dimensions`` where set)."""

    dimension: int = 0

    def parse_result(self, result: EngineResult) -> dict[str, Any]:
        vector = result.embedding
        if vector is None:
            raise RecordError("the engine returned no embedding")
        if len(vector) != self.dimension:
            raise RecordError(
                f"the engine returned {len(vector)} dimensions, not the model's {self.dimension}"
            )
        return {"embedding": vector, "text": None, "finish_reason": "stop"}


class ExtractHandler(TaskHandler):
    def parse(
        self, text: str, finish_reason: str | None, scores: Sequence[float] | None = None
    ) -> dict[str, Any]:
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


Encode = Callable[[str], list[int]]  # a tokenizer's ids of plain text


def _classify(task: ClassifyTask, encode: Encode | None = None) -> TaskHandler:
    scoring = label_scoring(task, encode) if encode is not None else None
    if scoring is not None:
        return ClassifyHandler(None, TASK_COLUMNS["classify"], min_tokens=1, scoring=scoring)
    # Guided choice may spell a label in any tokenization, but every token is at least one
    # byte: the longest label's bytes plus an end token always suffice, and the answer
    # stops there, so the larger budget costs nothing.
    longest = max(len(label.encode()) for label in task.labels)
    return ClassifyHandler(
        Constraint(choice=tuple(task.labels)), TASK_COLUMNS["classify"], min_tokens=longest + 1
    )


def label_scoring(task: ClassifyTask, encode: Encode) -> LabelScoring | None:
    """How the labels are scored, or None when they are generated by guided choice:
    ``task.calibrate`` off, or two labels starting with one same token."""
    if not task.calibrate:
        return None
    tokens = tuple(first_token(label, encode) for label in task.labels)
    if None in tokens or len(set(tokens)) < len(tokens):
        return None
    return LabelScoring(tuple(task.labels), tokens)


def labels_by(spec: JobSpec) -> dict[str, str]:
    """plan.json's record of how a classify job's labels are made, fixed by its first
    plan: ``score`` (``task.calibrate``, where the labels' first tokens differ) or
    ``guided choice``. A plan without it (older nightshift) keeps guided choice, so one
    output never mixes the two."""
    if spec.task.kind != "classify":
        return {}
    return {"labels_by": "score" if spec.task.calibrate else "guided choice"}


def label_encoder(spec: JobSpec, encoder) -> Encode:
    """Plain text's token ids as the answer's first place sees a label: right after the
    chat template's assistant header, or, for raw text (``prompt.chat_template: false``),
    after the template's last character, a space before it unless that is whitespace."""
    space = not spec.prompt.chat_template and not (spec.prompt.template or " ")[-1:].isspace()
    return lambda text: encoder.encode_texts([f" {text}" if space else text])[0]


def first_token(label: str, encode: Encode) -> int | None:
    ids = encode(label)
    return ids[0] if ids else None


def _extract(task: ExtractTask) -> TaskHandler:
    return ExtractHandler(Constraint(json_schema=task.json_schema), TASK_COLUMNS["extract"])


def _embed(task: EmbedTask, dimension: int | None) -> TaskHandler:
    # without the dimension (planning, the cache's scope) the column's size is unknown
    vector = pa.list_(pa.float32(), dimension) if dimension else pa.list_(pa.float32())
    return EmbedHandler(None, {"embedding": vector}, dimension=dimension or 0)


_HANDLERS = {"generate": _generate, "classify": _classify, "extract": _extract}


def handler_for(
    task: GenerateTask | ClassifyTask | ExtractTask | EmbedTask,
    encode: Encode | None = None,
    dimension: int | None = None,
) -> TaskHandler:
    """The task's handler; ``encode`` (the model's tokenizer) lets classify score its
    labels, which needs their token ids; without it classify generates by guided choice.
    ``dimension``: an embed job's vector size (``embedding_dimension``)."""
    if task.kind == "classify":
        return _classify(task, encode)
    if task.kind == "embed":
        return _embed(task, dimension)
    return _HANDLERS[task.kind](task)


def embedding_dimension(spec: JobSpec) -> int:
    """An embed job's vector size: ``embed.dimensions`` where the model supports it (as
    vLLM decides: ``matryoshka_dimensions`` or ``is_matryoshka`` in its config.json),
    else the model's hidden size (vLLM's pooling runner returns the last hidden state)."""
    # vLLM imports torch, and AutoConfig with it, anyway; the fake engine need not
    plain = _plain_config(spec.model.path) if spec.run.engine == "fake" else None
    config = plain or _auto_config(spec.model.path)
    size = int(config["hidden_size"])
    wanted = spec.embed.dimensions if spec.embed is not None else None
    if not wanted:
        return size
    allowed = config.get("matryoshka_dimensions")
    if not (allowed or config.get("is_matryoshka")):
        raise SpecError(
            "embed.dimensions",
            f"{spec.model.path} is not trained for shortened (Matryoshka) embeddings",
            f"remove embed.dimensions (its vectors have {size})",
        )
    if not 1 <= wanted <= size or (allowed and wanted not in allowed):
        sizes = ", ".join(map(str, allowed)) if allowed else f"1 to {size}"
        raise SpecError("embed.dimensions", f"{wanted} is not a size this model gives", sizes)
    return wanted


def _plain_config(model: str) -> dict[str, Any] | None:
    """A local model's config.json as read, where it names ``hidden_size`` itself and
    holds no sub-model's config (a composite model's saved config names its parts):
    what AutoConfig reads for it, without its import of torch (3 s of a fake-engine
    run's start on 2 cores); None where AutoConfig is to decide."""
    from nightshift.engines.tokenizer import model_source

    try:
        config = json.loads((Path(model_source(model)) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or type(config.get("hidden_size")) is not int:
        return None
    return None if any(_sub_model(k, v) for k, v in config.items()) else config


def _sub_model(key: str, value: Any) -> bool:
    """A composite model's part, whose hidden size ``get_text_config`` would take."""
    if key in ("decoder", "generator", "text_encoder"):
        return value is not None
    return key.endswith("_config") and isinstance(value, dict) and "quantization" not in key


def _auto_config(model: str) -> dict[str, Any]:
    from transformers import AutoConfig

    from nightshift.engines.tokenizer import model_source

    try:
        config = AutoConfig.from_pretrained(model_source(model))
    except (OSError, ValueError) as exc:  # no such folder or id, or no config.json in it
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(
            "model.path",
            f"cannot read the model's config from {model!r}: {first}",
            "give a local model folder or a model id this machine can reach",
        ) from None
    text = getattr(config, "get_text_config", lambda: config)()
    size = text.get("hidden_size") if isinstance(text, dict) else getattr(text, "hidden_size", None)
    if not isinstance(size, int):
        raise SpecError(
            "model.path",
            f"the config.json of {model!r} gives no hidden size for its vectors",
            "give an embedding model's folder (its config.json names hidden_size)",
        )
    return {
        "hidden_size": size,
        "matryoshka_dimensions": getattr(config, "matryoshka_dimensions", None),
        "is_matryoshka": getattr(config, "is_matryoshka", False),
    }


def answer_budget(spec: JobSpec) -> int:
    """Tokens reserved for each answer: sampling.max_tokens, raised where the task needs
    it, plus a reasoning model's thinking budget (it is output too); none for an embed
    job, which reads its prompt and writes nothing."""
    if spec.task.kind == "embed":
        return 0
    answer = max(spec.sampling.max_tokens, handler_for(spec.task).min_tokens)
    return answer + thinking_allowance(spec.sampling.reasoning_budget)


def sampling_for(spec: JobSpec, task: TaskHandler) -> Sampling:
    s = spec.sampling
    if isinstance(task, EmbedHandler):
        e = spec.embed
        return Sampling(1, pooling=Pooling(e.normalize, e.dimensions) if e else Pooling())
    scoring = getattr(task, "scoring", None)
    thinks = {"reasoning": bool(spec.model.reasoning), "reasoning_budget": s.reasoning_budget}
    if scoring is not None and spec.model.reasoning:
        # the scores are read at the answer's first place, after the thinking; the
        # labels guide the answer, so it is one of them whatever the scores say
        guided = Constraint(choice=scoring.labels)
        tokens = scoring.tokens
        return Sampling(answer_budget(spec), 0.0, constraint=guided, score_tokens=tokens, **thinks)
    if scoring is not None:  # one greedy step, for the label tokens' scores only
        return Sampling(1, 0.0, score_tokens=scoring.tokens)
    budget = answer_budget(spec)
    stop = tuple(s.stop)
    return Sampling(budget, s.temperature, s.top_p, s.seed, stop, task.constraint, **thinks)


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
    if spec.task.kind != "classify" or label_scoring(spec.task, encode) is not None:
        return []  # scored labels: only their (distinct) first tokens count
    return [
        f"task.labels: {', '.join(members)} can all start with the token {piece!r} under "
        "this model's tokenizer, so they are generated by guided choice (they cannot be "
        "scored by their first tokens); guided choice commits to a first token, so their "
        "probabilities pool there and one of them is chosen far more often than it "
        "should be. Give labels that start differently (e.g. payment, defect, login, "
        "general instead of billing, bug, account, other)."
        for piece, members in shared_first_tokens(spec.task.labels, encode)
    ]
