"""``nightshift jobs tune``: the job's operating point measured, not guessed.

A sample of the job's own records runs under each candidate setting on the real engine;
the table says what each costs and how often its answers agree with the reference's.
"""

from __future__ import annotations

from pathlib import Path

import typer

from nightshift.cli.jobs import SET, SPEC, user_errors


@user_errors
def tune(
    spec: Path = SPEC,
    overrides: list[str] = SET,
    sample: int = typer.Option(
        None,
        "--sample",
        min=1,
        help="Records in the sample (default: 5% of the job, 16 to 2,000, at most a tenth).",
    ),
    tries: list[str] = typer.Option(
        [],
        "--try",
        help="Add candidates: KEY=V1,V2 (any spec key), e.g. --try model.dtype=bfloat16,float32.",
    ),
    no_defaults: bool = typer.Option(
        False, "--no-defaults", help="Only the reference, the job itself and --try's candidates."
    ),
    min_agreement: float = typer.Option(
        0.98, "--min-agreement", min=0, max=1, help="Least agreement with the reference to choose."
    ),
    write: Path = typer.Option(
        None, "--write", help="Write the spec with the chosen setting here."
    ),
    folder: Path = typer.Option(
        None, "--dir", help="Where tune.json/.md/.png go (default OUTPUT.tune)."
    ),
    gpu: str = typer.Option(
        None,
        "--gpu",
        help="Predict each candidate's binding limit for this GPU (default: this machine's).",
    ),
) -> None:
    """Measure candidate settings on a sample of the job's records and pick one.

    Per candidate: tokens/s, cost, the binding limit, and agreement with the reference
    answers (KV cache in the model's dtype, no speculation), plus accuracy with eval.
    Writes tune.json, tune.md and tune.png; --write writes the spec with the fastest
    setting whose agreement is at least --min-agreement.

    Examples:

      nightshift jobs tune job.yaml --write tuned.yaml
      nightshift jobs tune job.yaml --try model.path=./small,./large --no-defaults
    """
    from nightshift.running.progresslines import progress_bar
    from nightshift.tuning.files import table_lines, write_tuned_spec
    from nightshift.tuning.tune import TuneJob, candidates_for, run_tune

    job = TuneJob.load(spec, overrides, folder, min_agreement, gpu)
    candidates = candidates_for(job, tries or [], defaults=not no_defaults)
    # a bar on a terminal; in a log, a line as each candidate ends (they take minutes)
    bar = progress_bar("tune", len(candidates), "candidates", every_s=0)
    try:
        summary = run_tune(job, candidates, sample, bar)
    except KeyboardInterrupt:
        typer.echo(f"stopped: what was measured is in {job.folder}", err=True)
        raise typer.Exit(130) from None
    finally:
        bar.close()
    for line in table_lines(summary):
        typer.echo(line)
    chosen = summary.get("chosen")
    typer.echo(_chosen_line(chosen, min_agreement))
    typer.echo(f"tune: {job.folder / 'tune.md'} (and tune.json, tune.png beside it)")
    if write is not None and chosen is not None:
        write_tuned_spec(write, job.data, summary)
        typer.echo(f"wrote {write}")


def _chosen_line(chosen: dict | None, min_agreement: float) -> str:
    if chosen is None:
        return f"no candidate kept {min_agreement:.0%} agreement with the reference"
    gain = chosen.get("speedup_over_job")
    told = f": {gain:.2f}x the job's tokens/s" if gain else ""
    return f"chosen: {chosen['name']}{told}"


def register(jobs_app: typer.Typer) -> None:
    jobs_app.command("tune")(tune)
