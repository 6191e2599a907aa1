"""``jobs tune --grid``: every combination of the ``--try`` values, not each value alone.

Two batch limits interact (the token budget decides how many prompts one step admits,
the sequence cap how many stay in the batch), so the best pair is often one that no
single change from the job reaches: ``--try engine.max_num_seqs=16,64,256 --try
engine.max_num_batched_tokens=1024,8192 --grid`` measures all six pairs.
"""

from __future__ import annotations

import itertools

from nightshift.errors import SpecError
from nightshift.jobs.loading import override_value
from nightshift.tuning.candidates import Candidate, split_values

# A grid this large would run for hours: the user narrows it (or drops --grid).
MOST_POINTS = 64


def try_axes(tries: list[str]) -> list[tuple[str, list[str]]]:
    """``--try key=v1,v2`` as (key, values as typed); a key given twice adds its values."""
    axes: dict[str, list[str]] = {}
    for item in tries:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SpecError(
                "--try", f"{item!r} is not key=v1,v2", "e.g. engine.max_num_seqs=64,128"
            )
        values = axes.setdefault(key, [])
        values += [v for v in split_values(raw) if v not in values]
    return list(axes.items())


def grid_candidates(tries: list[str]) -> list[Candidate]:
    """One candidate per combination of the ``--try`` values, named by its values
    (``max_num_seqs=64 max_num_batched_tokens=8192``)."""
    axes = try_axes(tries)
    if not axes:
        raise SpecError("--grid", "needs --try values to combine", "add --try KEY=V1,V2")
    points = 1
    for _, values in axes:
        points *= len(values)
    if points > MOST_POINTS:
        raise SpecError(
            "--grid",
            f"{points} combinations, over the {MOST_POINTS} a tune runs",
            "try fewer values per key",
        )
    found = []
    for combination in itertools.product(*(values for _, values in axes)):
        pairs = list(zip((key for key, _ in axes), combination, strict=True))
        name = " ".join(f"{key.split('.')[-1]}={value}" for key, value in pairs)
        found.append(Candidate(name, {key: override_value(value) for key, value in pairs}))
    return found
