"""The run stage's start: plan the job (or take up its plan), list the shards left.

A rerun of the same spec into the same output resumes: the plan written by the first
run is reused without reading the input again, committed shards are skipped, and a
partly done shard continues after its last checkpoint. A rerun of a different spec is
refused (see ``jobs.fingerprint``). The steps that follow are ``ShardRunner.run``
(``running.shards``) and ``reports.assemble.finish_run``; ``pipelines`` composes them.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nightshift.engines.tokenizerid import TokenizerIdentity
from nightshift.errors import InputError, OutputExistsError, ShardsFailedError
from nightshift.io.outputs import JobOutput, new_run_location
from nightshift.io.planstore import KeptPlan
from nightshift.jobs.fingerprint import changed_keys, plan_stamp
from nightshift.jobs.spec import JobSpec
from nightshift.running.encoding import close_spare, lend_spare, start_spare
from nightshift.running.progress import LiveProgress
from nightshift.running.shards import ShardRunner
from nightshift.scheduling.increments import add_new_records, input_listing, input_may_have_grown
from nightshift.scheduling.plan import build_plan, describe, load_encoder, open_job_input

# A resume's encoder, loaded while Prefect's server boots (``resume_ahead``), by the
# spec it was loaded for: that spec's ``start_run`` takes it.
_ahead: dict[bytes, Any] = {}


@dataclass
class JobRun:
    """One invocation of a job on one output, between planning and the report: what the
    steps (``start_run``, the shard runner, ``finish_run``) hand each other. The CLI's
    Prefect flow (``pipelines.flow``) calls the same steps as tasks."""

    spec: JobSpec
    output: JobOutput
    manifest: dict[str, Any]
    runner: ShardRunner
    todo: list[int]
    progress: LiveProgress
    planned_s: float  # on the run's clock: when the plan was written
    prepared_s: float = 0.0  # on the run's clock: when planning began (after start-up)


def start_run(
    spec: JobSpec,
    *,
    overwrite: bool = False,
    new_run: bool = False,
    progress: bool = True,
    retry_in_place: bool = True,
    as_worker: bool = False,
    started: float | None = None,
) -> JobRun:
    """Plan the job, or take up the plan of an earlier run of it (adding an increment
    for records new since, see ``scheduling.increments``); list the shards left to run.
    ``as_worker``: one of several workers; it takes up the plan as it is (the
    coordinator planned it) and never plans. ``started``: the ``time.perf_counter()``
    reading the run began at, when work (an engine start) began before this call."""
    clock = LiveProgress(spec.cost, show=progress, started=started)
    prepared = clock.now()
    output = JobOutput(new_run_location(spec.output.path) if new_run else spec.output.path)
    stamp = plan_stamp(spec)  # hashes the model's files: once per run
    # the model first: a spec that cannot even load its tokenizer never deletes nor
    # refuses anything on its account (its own error says what to fix); a resume loads
    # it by the class its plan recorded, without AutoTokenizer's import of torch
    encoder = None if overwrite or new_run else _ahead.pop(pickle.dumps(spec), None)
    encoder = encoder or load_encoder(spec, like=None if overwrite else planned_tokenizer(output))
    manifest = _resumable_plan(output, stamp, overwrite, lambda: open_job_input(spec))
    if as_worker and manifest is None:
        raise OutputExistsError(
            f"output.path: {output.location} has no plan for a worker to take up; "
            "run `nightshift jobs plan SPEC --write` (or `jobs run`) first"
        )
    planned_now = manifest is None
    if not planned_now:
        output.plans.forget_built()  # left by a run killed just after writing plan.json
    try:  # the encoding processes started below end with a failure here
        if planned_now:
            manifest = _plan(spec, output, encoder, stamp, progress)
        elif spec.run.incremental and not as_worker and input_may_have_grown(spec, manifest):
            # the input's files as they were when last planned hold no new record: their
            # ids are not read again (a million ids and the plan's: 1-2 s of a resume)
            manifest = add_new_records(spec, output.plans, manifest, encoder, progress)
        committed = output.shards.committed()
        todo = [s["index"] for s in manifest["shards"]["each"] if s["index"] not in committed]
        if todo and not planned_now:  # a resume: its children load while the shards open
            start_spare(spec, encoder, int(manifest.get("records", {}).get("runnable", 0)))
        runner = ShardRunner(
            spec, output.plans, output.shards, manifest, encoder, clock, retry_in_place
        )
        clock.expect(runner.records_left(todo))
    except BaseException:
        close_spare(spec)
        raise
    return JobRun(spec, output, manifest, runner, todo, clock, clock.now(), prepared)


def _plan(
    spec: JobSpec, output: JobOutput, encoder: Any, stamp: dict[str, Any], progress: bool
) -> dict[str, Any]:
    """Build and write the job's plan; the feed's encoding processes start first, so
    that they have loaded their tokenizers by the time it ends."""
    start_spare(spec, encoder, input_rows(spec))
    listing = {"input_listing": input_listing(spec)}  # before reading (increments)
    kept = output.plans.kept(stamp["fingerprint"], listing["input_listing"])
    if kept is not None:  # built by a run stopped while it wrote the plan's files
        try:
            output.plans.write(KeptPlan(*open_job_input(spec), *kept[:2]), kept[2])
            return output.plans.manifest()
        except InputError:  # its input changed after all (same size and time): plan again
            output.plans.forget_built()
    with lend_spare(spec) as helpers:  # idle until the plan is written: they measure
        plan = build_plan(spec, encoder, progress, helpers=helpers)
    if output.plans.manifest() is not None:  # another run wrote its plan meanwhile: take
        # it up where it is this job's (refused where it is another job's)
        return _resumable_plan(output, stamp, False, lambda: None)
    summary = {**describe(plan, spec), **stamp, **listing, **encoder.identity().as_plan()}
    output.plans.write(plan, summary)  # before generation
    return output.plans.manifest()


def input_rows(spec: JobSpec) -> int:
    """The input's rows, from its Parquet footers (no record is read); 0 when it cannot
    be opened (the plan reads it next and says why)."""
    try:
        return open_job_input(spec)[0].count_rows()
    except Exception:  # noqa: BLE001
        return 0


def work_may_be_left(spec: JobSpec, overwrite: bool, new_run: bool) -> bool:
    """Whether a run of ``spec`` will likely generate, from the plan, markers and the
    input's file listing alone (cheap: no input is read), so its engine can start while
    the plan is built. An output whose plan is all committed starts none early unless
    ``run.incremental`` and the input's files changed since the last plan (new records,
    likely: a nightly run's); one that holds another job's run starts none."""
    if overwrite or new_run:
        return True
    output = JobOutput(spec.output.path)
    manifest = output.plans.manifest()
    if manifest is None:
        return not output.holds_a_run()
    if manifest.get("fingerprint") != plan_stamp(spec)["fingerprint"]:
        return False  # start_run refuses it
    committed = output.shards.committed()
    if any(s["index"] not in committed for s in manifest["shards"]["each"]):
        return True
    return spec.run.incremental and input_may_have_grown(spec, manifest)


def resume_ahead(spec: JobSpec) -> bool:
    """Where a run of ``spec`` will resume the plan at its output (the same job, shards
    left), load its encoder by the class the plan recorded and start its encoding
    processes now, before the run's flow exists (``pipelines.headstart``: while
    Prefect's server boots); True if it did. ``start_run`` takes both up, and says
    what is amiss where this finds anything unusual."""
    try:
        output = JobOutput(spec.output.path)
        manifest = output.plans.manifest()
        if manifest is None or manifest.get("fingerprint") != plan_stamp(spec)["fingerprint"]:
            return False
        committed = output.shards.committed()
        if all(s["index"] in committed for s in manifest["shards"]["each"]):
            return False
        encoder = load_encoder(spec, like=TokenizerIdentity.in_plan(manifest))
    except Exception:  # noqa: BLE001 - start_run meets it again, and says so
        return False
    _ahead[pickle.dumps(spec)] = encoder
    start_spare(spec, encoder, int(manifest.get("records", {}).get("runnable", 0)))
    return True


def drop_ahead(spec: JobSpec) -> None:
    """Forget what ``resume_ahead`` loaded for ``spec`` that no run took (it failed
    first), and end its encoding processes."""
    _ahead.pop(pickle.dumps(spec), None)
    close_spare(spec)


def planned_tokenizer(output: JobOutput) -> TokenizerIdentity | None:
    """The tokenizer identity the plan at ``output`` recorded, if any (a hint: a plan
    that cannot be read here is read, and refused or resumed, by ``start_run``)."""
    try:
        return TokenizerIdentity.in_plan(output.plans.manifest())
    except Exception:  # noqa: BLE001
        return None


def raise_if_failed(job: JobRun) -> None:
    """Raise ``ShardsFailedError`` naming the shards still failed after all attempts."""
    failures = job.runner.failures
    if failures:
        names = ", ".join(f"shard {s} ({e})" for s, e in sorted(failures.items()))
        raise ShardsFailedError(
            f"{len(failures)} shard(s) still failed after {job.spec.run.shard_attempts} "
            f"attempts: {names}; rerun the same command to retry them"
        )


def _resumable_plan(
    output: JobOutput, stamp: dict[str, Any], overwrite: bool, check_input: Callable[[], Any]
) -> dict[str, Any] | None:
    """The plan of an earlier run of the same job here, to resume; None to plan afresh.
    Refuses an output that holds a different job's run, or others' files and no run.
    ``check_input`` raises when the spec does not fit its input (a template column the
    input lacks): run before a run is deleted (``--overwrite``) or refused as another
    job's, so a typo is reported as itself and never costs a finished run."""
    output.refuse_foreign()  # with or without --overwrite: those files are not ours
    if overwrite:
        if output.holds_a_run():
            check_input()
        output.clear()
        return None
    manifest = output.plans.manifest()
    if manifest is None:
        if output.holds_a_run():
            raise OutputExistsError(
                f"output.path: {output.location} holds a run nightshift cannot resume (no "
                "plan.json); pass --overwrite to replace it or --new-run to start beside it"
            )
        return None
    if manifest.get("fingerprint") != stamp["fingerprint"]:
        changed = changed_keys(manifest.get("fingerprint_inputs", {}), stamp["fingerprint_inputs"])
        if changed:
            check_input()  # a spec that cannot run is told so, not advised to --overwrite
        if not changed and "engine" not in manifest.get("fingerprint_inputs", {}):
            return manifest  # a plan from before engine versions were recorded: same job
        raise OutputExistsError(
            f"output.path: {output.location} holds a run of a different job "
            f"({', '.join(changed)} changed); run the spec it was made with to resume it, "
            "pass --new-run to start a fresh run beside it, or --overwrite to replace it"
        )
    return manifest
