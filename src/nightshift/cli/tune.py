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
        help="Records in each round (default: twice the largest max_num_seqs tried, and "
        "enough tokens for max_num_batched_tokens to bind, up to half the job in all rounds).",
    ),
    rounds: int = typer.Option(
        2, "--rounds", min=2, help="Rounds per candidate, each on other records: the spread."
    ),
    grid: bool = typer.Option(
        False, "--grid", help="Run every combination of the --try values, not each alone."
    ),
    check: bool = typer.Option(
        False,
        "--check",
        help="Then run the whole job under the chosen setting and its own: the gain measured.",
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
        None,
        "--dir",
        help="Where tune.json/.md/.png and the runs go (default OUTPUT.tune): a new or "
        "empty folder, or an earlier tune's; one holding other files is refused.",
    ),
    gpu: str = typer.Option(
        None,
        "--gpu",
        help="Predict each candidate's binding limit for this GPU (default: this machine's).",
    ),
) -> None:
    """Measure candidate settings on a sample of the job's records and pick one.

    Per candidate, over --rounds rounds on one engine: tokens/s and its spread, cost, the
    binding limit, agreement with the reference answers (KV cache in the model's dtype,
    no speculation) with its 95% interval, plus accuracy and flips with eval labels. A
    candidate whose round was too small for its batch is not measurable, never chosen.
    The job's own setting is kept unless a candidate beats it beyond the spread with its
    agreement interval at or above --min-agreement. Writes tune.json, tune.md and
    tune.png; --write writes the spec with the chosen setting.

    Examples:

      nightshift jobs tune job.yaml --write tuned.yaml
      nightshift jobs tune job.yaml --try model.path=./small,./large --no-defaults
      nightshift jobs tune job.yaml --no-defaults --grid --check \\
        --try engine.max_num_seqs=16,64,256 --try engine.max_num_batched_tokens=1024,8192
    """
    from nightshift.running.progresslines import progress_bar
    from nightshift.tuning.check import check_line, run_check
    from nightshift.tuning.files import (
        chosen_lines,
        claim_folder,
        table_lines,
        write_tune_files,
        write_tuned_spec,
    )
    from nightshift.tuning.tune import TuneJob, candidates_for, run_tune

    job = TuneJob.load(spec, overrides, folder, min_agreement, gpu)
    claim_folder(job.folder)  # before anything runs: never another's files (invariant 9)
    candidates = candidates_for(job, tries or [], defaults=not no_defaults, grid=grid)
    # a bar on a terminal; in a log, a line as each candidate ends (they take minutes)
    bar = progress_bar("tune", len(candidates), "candidates", every_s=0)
    try:
        summary = run_tune(job, candidates, sample, bar, rounds)
    except KeyboardInterrupt:
        typer.echo(f"stopped: what was measured is in {job.folder}", err=True)
        raise typer.Exit(130) from None
    finally:
        bar.close()
    for line in table_lines(summary):
        typer.echo(line)
    for line in chosen_lines(summary):
        typer.echo(line.replace("**", ""))
    if check:
        typer.echo("check: running the whole job under its own setting and the chosen one")
        summary["check"] = run_check(job, summary)
        write_tune_files(job.folder, summary)
        typer.echo(check_line(summary["check"]))
    chosen = summary.get("chosen")
    typer.echo(f"tune: {job.folder / 'tune.md'} (and tune.json, tune.png beside it)")
    if write is not None and chosen is not None:
        write_tuned_spec(write, job.data, summary)
        typer.echo(f"wrote {write}")


def register(jobs_app: typer.Typer) -> None:
    jobs_app.command("tune")(tune)
