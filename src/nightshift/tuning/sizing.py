"""How much of the job ``jobs tune`` runs per candidate, and which records.

A candidate's batch limits only show on a sample that has several batches of work: on
a sample smaller than the batch, ``max_num_seqs`` 128 and 512 run the very same batch
(the whole sample) and differ by noise alone. So each *round* (one pass of a sample
through a candidate's engine) is sized from the largest ``engine.max_num_seqs`` tried
(``ROUND_FACTOR`` batches of it) and the largest ``engine.max_num_batched_tokens``
(``ROUND_FACTOR`` full steps), and after the run a candidate whose engine reached a
batch over ``1/ROUND_FACTOR`` of the round is *not measurable on this sample*: it is
shown, never chosen. Each candidate runs ``ROUNDS`` rounds on other records (runs of
consecutive records in plan order, spread over the job, so prefix groups stay whole),
so its spread is measured too.

Cost: the aim is a candidate's rounds together within ``COST_AIM`` of the job's
generation time; a sample for large limits on a small job cannot be, and the tune
says so (``sample.cost``) instead of shrinking the sample until nothing binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from nightshift.jobs.spec import JobSpec
from nightshift.tuning.sample import default_size, write_sample

ROUNDS = 2  # rounds per candidate: two measurements give a spread, each on other records
ROUND_FACTOR = 2  # a round holds at least this many of the largest batch tried
WINDOWS = 4  # runs of consecutive records in plan order per round
COST_AIM = 0.10  # of the job's generation time, for one candidate's rounds together
MOST_SHARE = 0.5  # of the job's records one candidate's rounds may take at most, by default


@dataclass(frozen=True)
class Sizing:
    """The rounds' size and what the job holds."""

    per_round: int  # records in each round
    rounds: int
    job_records: int
    job_tokens: int
    needed: int  # records a round needs for the largest limits tried to bind
    disjoint: bool  # rounds on other records (else the same records, a fresh engine each)

    @property
    def whole_job(self) -> bool:
        return self.per_round >= self.job_records


def size_rounds(
    job_records: int,
    job_tokens: int,
    limits: list[tuple[int, int]],
    rounds: int = ROUNDS,
    size: int | None = None,
) -> Sizing:
    """Rounds for candidates whose (max_num_seqs, max_num_batched_tokens) are ``limits``:
    ``size`` records each when the user says so, else what the largest limits need, from
    the default share of the job up to ``MOST_SHARE`` of it over all rounds."""
    mean = job_tokens / max(job_records, 1)
    seqs = max((s for s, _ in limits), default=1)
    budget = max((b for _, b in limits), default=1)
    needed = max(ROUND_FACTOR * seqs, math.ceil(ROUND_FACTOR * budget / max(mean, 1.0)))
    if size is None:
        cap = max(default_size(job_records), int(job_records * MOST_SHARE / rounds))
        size = max(default_size(job_records), min(needed, cap))
    per_round = max(1, min(size, job_records))
    return Sizing(
        per_round,
        rounds,
        job_records,
        job_tokens,
        min(needed, job_records),
        per_round * rounds <= job_records,
    )


def not_measurable(sizing: Sizing, batch_reached: int | None) -> str | None:
    """Why a candidate's speed on these rounds says nothing about the full job (None:
    it does): its engine's batch took more than ``1/ROUND_FACTOR`` of a round, so the
    round ran out of work where the job would not have."""
    if sizing.whole_job or not batch_reached:
        return None
    if batch_reached * ROUND_FACTOR <= sizing.per_round:
        return None
    return (
        f"not measurable on this sample: the batch reached {batch_reached} of a round's "
        f"{sizing.per_round} records (a round needs {ROUND_FACTOR}x the batch; --sample "
        f"{batch_reached * ROUND_FACTOR} or more)"
    )


def round_ids(order: pl.DataFrame, sizing: Sizing) -> list[list]:
    """Each round's record ids: ``WINDOWS`` runs of consecutive records in plan order,
    spread over the job; round r takes the r-th run of each stretch, so rounds share no
    record (when the job is large enough; else every round runs the same records)."""
    ids = order["record_id"].to_list()
    total, per_round = len(ids), sizing.per_round
    if not sizing.disjoint:
        return [_windows(ids, per_round)] * sizing.rounds
    windows = min(WINDOWS, per_round)
    each = -(-per_round // windows)
    stretch = total // windows
    found = []
    for r in range(sizing.rounds):
        picked: list = []
        for w in range(windows):
            start = w * stretch + r * each
            end = total if w == windows - 1 else (w + 1) * stretch  # the stretch's own end
            picked += ids[start : min(start + each, end)]
        found.append(picked[:per_round])
    return found


def _windows(ids: list, size: int) -> list:
    windows = min(WINDOWS, size)
    each, picked, total = -(-size // windows), [], len(ids)
    for w in range(windows):
        start = (total - each) * w // max(1, windows - 1) if windows > 1 else 0
        picked += ids[max(0, start) : max(0, start) + each]
    return list(dict.fromkeys(picked))[:size]


def job_order(spec: JobSpec) -> pl.DataFrame:
    """The job's runnable records in plan order, with their prompt tokens."""
    from nightshift.scheduling.plan import build_plan, load_encoder

    plan = build_plan(spec, load_encoder(spec), progress=False)
    return plan.records.filter(pl.col("record_id").is_not_null()).sort("position")


def write_rounds(spec: JobSpec, rounds: list[list], folder: Path) -> list[Path]:
    """Each round's input rows as a Parquet file (one file when rounds share records)."""
    paths: list[Path] = []
    for r, ids in enumerate(rounds):
        if r and ids is rounds[0]:
            paths.append(paths[0])
            continue
        paths.append(write_sample(spec, ids, folder / f"round-{r + 1}.parquet"))
    return paths


# An unset limit is the engine's own choice for the hardware (vLLM's CPU and smaller
# GPUs: 256 sequences, 8192 tokens); the measured batch decides measurability anyway.
UNSET_SEQS, UNSET_TOKENS = 256, 8192


def limits_of(spec: JobSpec) -> tuple[int, int]:
    """The (max_num_seqs, max_num_batched_tokens) a candidate's spec runs with."""
    e = spec.engine
    return e.max_num_seqs or UNSET_SEQS, e.max_num_batched_tokens or UNSET_TOKENS


def sample_summary(sizing: Sizing) -> dict:
    """tune.json's ``sample``: the rounds and what the job holds."""
    records = sizing.per_round * (sizing.rounds if sizing.disjoint else 1)
    return {
        "records": records,
        "per_round": sizing.per_round,
        "rounds": sizing.rounds,
        "rounds_on_other_records": sizing.disjoint,
        "job_records": sizing.job_records,
        "job_prompt_tokens": sizing.job_tokens,
        "share": round(records / max(sizing.job_records, 1), 4),
        "needed_per_round": sizing.needed,
    }


def sample_cost(entries: list[dict], job: dict | None, job_records: int) -> dict:
    """Each candidate's rounds (generation seconds) against the job's generation time
    predicted from the job's own rounds (its first round's wait before the first answer,
    once, and its records at the median round's pace), and the whole tune's; the aim is
    ``COST_AIM``."""
    if job is None or not job.get("records_per_s"):
        return {}
    wait = (job.get("rounds_wait_s") or [0.0])[0]
    predicted = wait + job_records / job["records_per_s"]
    ran = [e for e in entries if "error" not in e]
    shares = {e["name"]: round(e["generate_s"] / predicted, 4) for e in ran}
    worst = max(shares.values())
    return {
        "job_generate_s_predicted": round(predicted, 2),
        "share_per_candidate": shares,
        "share_all_candidates": round(sum(e["generate_s"] for e in ran) / predicted, 4),
        "aim": COST_AIM,
        "within_aim": worst <= COST_AIM,
    }
