"""Where ``nightshift batch run`` writes: OUTPUT and ERRORS, checked before anything
runs, and claimed in the work folder's batch.json, so that a rerun replaces only the
files this batch wrote (invariant 9), never a user's file that happens to be there."""

from __future__ import annotations

from pathlib import Path

from nightshift.errors import UserError
from nightshift.io.keys import check_key
from nightshift.io.objectstore import open_store


def check_destination(option: str, url: str) -> None:
    """``url`` names a file nightshift can write, or a one-line ``UserError`` now, before
    the input is converted or an engine starts (not a failed write at the end)."""
    if "\\" in url:
        raise UserError(f"{option}: {url} holds a backslash; separate folders with /")
    if url.endswith("/"):
        raise UserError(f"{option}: {url} names a folder; give a file name in it")
    if url.startswith("s3://"):
        bucket, _, key = url.removeprefix("s3://").partition("/")
        try:
            check_key(key)
        except ValueError:
            raise UserError(f"{option}: {url} names no object in s3://{bucket}") from None
        return
    path = Path(url).expanduser()
    if path.is_dir():
        raise UserError(f"{option}: {url} is a directory; give a file name in it")
    for above in path.absolute().parents:
        if above.exists():
            if not above.is_dir():
                raise UserError(f"{option}: {url} cannot be written: {above} is a file")
            return


def check_work(work_url: str) -> None:
    if not work_url.startswith("s3://") and Path(work_url).expanduser().is_file():
        raise UserError(f"--work: {work_url} is a file; give a folder for the batch's state")


def distinct(input_url: str, output_url: str, errors_url: str | None) -> None:
    """OUTPUT and ERRORS name neither INPUT nor each other (each would replace the other)."""
    names = {"INPUT": where(input_url), "OUTPUT": where(output_url)}
    given = {"OUTPUT": output_url, "--errors": errors_url}
    for option, other in (("OUTPUT", "INPUT"), ("--errors", "INPUT"), ("--errors", "OUTPUT")):
        url = given[option]
        if url is not None and where(url) == names[other]:
            raise UserError(f"{option}: {url} is {other}; write the results to another file")


def where(url: str) -> str:
    """A destination as the marker records it: the resolved path, or the S3 URL."""
    return url.rstrip("/") if url.startswith("s3://") else str(Path(url).expanduser().resolve())


def claimed(wrote: list[str], given: dict[str, str | None], work_url: str) -> list[str]:
    """The destinations this batch may write: those it ``wrote`` (claimed) before and
    ``given`` ones that do not exist yet. Any other existing file is refused."""
    claims = list(wrote)
    for option, url in given.items():
        if url is None or where(url) in claims:
            continue
        if _exists(url):
            raise UserError(
                f"{option}: {url} already exists, and this batch did not write it (its work "
                f"folder {work_url} says what it wrote); remove it or give another file"
            )
        claims.append(where(url))
    return claims


def default_errors_url(output_url: str) -> str:
    """``out.jsonl`` -> ``out.errors.jsonl`` beside it (any other name: NAME.errors.jsonl)."""
    base = output_url.removesuffix(".jsonl")
    return f"{base}.errors.jsonl"


def legacy_claims(work_url: str) -> list[str]:
    """What a marker written before destinations were recorded may replace: the OUTPUT
    its default work folder (OUTPUT.nightshift) was named after, and that one's ERRORS."""
    output = work_url.removesuffix(".nightshift")
    if output == work_url:
        return []
    return [where(output), where(default_errors_url(output))]


def _exists(url: str) -> bool:
    parent, _, name = url.rstrip("/").rpartition("/")
    return open_store(parent or ".").exists(name)
