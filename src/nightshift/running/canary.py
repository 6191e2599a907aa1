"""The canary's verdict: whether a job runs one, and whether its figure lets the job on.

The canary itself (two runs of a sample, ``pipelines.canary``) is measured once per
output and kept in ``plan/canary.json``; every later run, a resume or another worker,
judges by that measure under its own ``run.canary`` keys, so ``--set
run.canary.accept=true`` after a stop lets the job on without measuring again. A
figure is judged by its 95% Wilson interval against ``run.canary.min_agreement``
(``decide``); where that straddles the bar at the sample's cap, by the figure itself.
"""

from __future__ import annotations

import logging
from typing import Any

from nightshift.errors import CanaryFailedError, RecordError
from nightshift.intervals import describe
from nightshift.io.outputs import JobOutput
from nightshift.jobs.reference import KV, answer_changing
from nightshift.jobs.spec import JobSpec
from nightshift.running.cached import RunCache

NOTHING = "nothing to compare"
SAMPLED = "the answers are sampled (temperature above 0, no seed): no two runs agree"
NONE_DETERMINISTIC = (
    "no record's answers are deterministic (input.sampling_column: temperature above 0, "
    "no seed): no two runs agree"
)
log = logging.getLogger(__name__)


def canary_wanted(spec: JobSpec) -> bool:
    """``run.canary.enabled``, or (unset) whether the job uses a setting that may change
    its answers."""
    enabled = spec.run.canary.enabled
    return bool(answer_changing(spec)) if enabled is None else enabled


def nothing_to_compare_yet(spec: JobSpec) -> str | None:
    """Why the canary would compare nothing, as far as the spec alone says (cheap): the
    answers are sampled (two runs of a sample differ whatever the setting), or the fake
    engine's FP8 KV cache changes no answer unless a test says so."""
    from nightshift.engines.fake import fp8_changes

    if spec.input.sampling_column is None and not job_deterministic(spec):
        return SAMPLED
    only_kv = set(answer_changing(spec)) <= {KV}  # the fake's FP8 is all it can vary
    if spec.run.engine == "fake" and only_kv and not fp8_changes():
        return "the fake engine's FP8 KV cache changes no answer (NIGHTSHIFT_FAKE_FP8_CHANGES)"
    return None


def job_deterministic(spec: JobSpec) -> bool:
    """Whether the job's own sampling answers a prompt the same every time (temperature
    0 or a seed; a classify job's scoring step always does), as dedup decides."""
    from nightshift.jobs.sampling import deterministic
    from nightshift.jobs.tasks import handler_for, sampling_for

    return deterministic(sampling_for(spec, handler_for(spec.task)))


def deterministic_ids(spec: JobSpec, ids: list) -> list:
    """Those of ``ids`` whose record's own sampling (``input.sampling_column`` over the
    job's) answers the same every time: temperature 0 or a seed."""
    import pyarrow.compute as pc

    from nightshift.io.inputs import open_input
    from nightshift.jobs.sampling import SamplingColumn, deterministic

    id_column, column = spec.input.id_column, spec.input.sampling_column
    table = open_input(spec.input.path, spec.output.path).to_table(
        columns=[id_column, column], filter=pc.field(id_column).isin(ids)
    )
    samplings, keep = SamplingColumn(spec), set()
    for record, text in zip(table[id_column].to_pylist(), table[column].to_pylist(), strict=True):
        try:
            if deterministic(samplings.sampling(text)):
                keep.add(record)
        except RecordError:  # rejected at planning: not in the sample anyway
            continue
    return [i for i in ids if i in keep]


def comparable_ids(spec: JobSpec, ids: list) -> tuple[list, str | None]:
    """Those of ``ids`` whose answers two runs can agree on (the job's sampling, and each
    record's own), and why there are none, when none are (``jobs tune`` compares these)."""
    if spec.input.sampling_column is not None:
        found, why = deterministic_ids(spec, ids), NONE_DETERMINISTIC
    else:
        found, why = (list(ids) if job_deterministic(spec) else []), SAMPLED
    return found, (why if ids and not found else None)


def canary_pending(spec: JobSpec, overwrite: bool, new_run: bool) -> bool:
    """Whether a run of ``spec`` measures a canary before its shards (one read): its
    engines then start one after the other, never two on one GPU at once."""
    if not canary_wanted(spec) or nothing_to_compare_yet(spec):
        return False
    kept = JobOutput(spec.output.path).plans.canary()
    return overwrite or new_run or kept is None or measure_again(kept)


def measure_again(kept: dict[str, Any]) -> bool:
    """Whether a kept canary compared nothing because this machine's engine fell back
    from FP8: another run (another machine, a fixed driver) measures it again, so a
    job never goes on with FP8 unchecked because one start could not hold it."""
    return kept.get("status") == NOTHING and bool(kept.get("measure_again"))


# What one measure of the canary says against a bar (``decide``).
ABOVE, BELOW, MORE = "at or above", "below", "undecided"


def decide(ci: tuple[float, float] | list | None, min_agreement: float) -> str:
    """``ABOVE`` when the agreement's 95% interval lies at or above the bar (its lower
    bound >= ``min_agreement``), ``BELOW`` when it lies wholly under it (upper bound <
    the bar), ``MORE`` when it straddles the bar: the sample cannot tell."""
    if ci is None:
        return MORE
    if ci[0] >= min_agreement:
        return ABOVE
    return BELOW if ci[1] < min_agreement else MORE


def clears(spec: JobSpec, kept: dict[str, Any]) -> bool:
    """Whether the kept figure clears the job's current ``run.canary.min_agreement``: by
    its interval, or by the point value where the interval straddles the bar (the
    sample reached its cap, or another run's bar is judged by this measure)."""
    agreement = kept.get("agreement")
    if agreement is None:
        return True  # nothing compared: no figure to hold the job back
    bar = spec.run.canary.min_agreement
    verdict = decide(kept.get("agreement_ci"), bar)
    return verdict == ABOVE or (verdict == MORE and agreement >= bar)


def below(spec: JobSpec, kept: dict[str, Any]) -> bool:
    """Whether the kept measure is below the job's current ``run.canary.min_agreement``."""
    return not clears(spec, kept)


def passed(spec: JobSpec, kept: dict[str, Any]) -> bool:
    """Whether the kept measure lets the job on under its current keys: it cleared the
    bar, or the user accepted it."""
    return spec.run.canary.accept or clears(spec, kept)


def enforce(spec: JobSpec, kept: dict[str, Any]) -> None:
    """Stop the job before its full run when the canary's figure is too low."""
    if passed(spec, kept):
        return
    settings = ", ".join(f"{k}={v}" for k, v in kept["settings"].items())
    ci = describe(kept.get("agreement_ci"))
    raise CanaryFailedError(
        f"canary: with {settings} the job's answers agreed with the reference's "
        f"({', '.join(f'{k}={v}' for k, v in kept['reference'].items())}) on "
        f"{kept['agreement']:.1%} of {kept['records']} sampled records"
        f"{f' ({ci})' if ci else ''}, below run.canary.min_agreement "
        f"{spec.run.canary.min_agreement:.0%}; the full run did not "
        "start. Set engine.kv_cache_dtype: auto (or drop the setting), lower "
        "run.canary.min_agreement, or rerun with --set run.canary.accept=true to accept it "
        f"(the sample's answers are kept: {kept.get('runs', {}).get('job', '')})"
    )


def canary_section(
    spec: JobSpec, kept: dict[str, Any] | None, answers: RunCache | None
) -> dict[str, Any] | None:
    """report.json's ``canary``: the measure, the verdict, the sample's answers reused.
    ``passed``: the figure cleared the bar, nothing else; ``accepted``: it did not, and
    the user let the job on (``run.canary.accept``)."""
    if kept is None:
        return None
    section = {**kept, "min_agreement": spec.run.canary.min_agreement}
    if kept.get("agreement") is not None:
        section["passed"] = clears(spec, kept)
        section["accepted"] = not section["passed"] and spec.run.canary.accept
        ci = kept.get("agreement_ci")
        section["undecided"] = ci is not None and decide(ci, section["min_agreement"]) == MORE
    if answers is not None:
        section["answers_reused"] = answers.cache.counts.hits
    return section


def summary_line(canary: dict[str, Any]) -> str:
    """The canary in the run's summary, one line."""
    if canary.get("status") == NOTHING:
        return f"canary: {NOTHING} ({canary.get('reason')})"
    figure = f"{canary['agreement']:.1%} of {canary['records']} records agree with the reference"
    ci = describe(canary.get("agreement_ci"))
    verdict = "passed"
    if canary.get("accepted"):
        verdict = "below min_agreement, accepted"
    elif not canary.get("passed", True):
        verdict = "below min_agreement, not accepted"
    if canary.get("undecided"):  # the interval straddles the bar: the point value decided
        verdict = f"undecided at the cap, judged by the figure: {verdict}"
    accuracy = canary.get("accuracy") or {}
    extra = ""
    if accuracy.get("job") is not None and accuracy.get("reference") is not None:
        extra = f"; accuracy {accuracy['job']:.3f} vs {accuracy['reference']:.3f}"
    flips = canary.get("flips")
    if flips:
        extra += (
            f"; {flips['right_to_wrong']} right to wrong, {flips['wrong_to_right']} wrong to "
            f"right of {flips['of']} labelled"
        )
    figure += f", {ci}" if ci else ""
    return f"canary: {figure} ({verdict}, min {canary['min_agreement']:.0%}){extra}"
