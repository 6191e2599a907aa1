"""One object-store interface over a local directory and S3, so job code never branches.

Jobs write plans, results and commit markers through ``ObjectStore`` and read them back;
the same code runs on a laptop directory and on a bucket. Both backends keep the
guarantees the commit protocol relies on:

- a write is atomic: a reader sees the whole object or none of it (locally a hidden temp
  file renamed into place; on S3 a PUT or a completed multipart upload);
- ``put_if_absent`` creates a key only if it is missing, and exactly one of several
  racing writers wins (locally a hard link, which fails on an existing name; on S3 a
  conditional PUT, ``If-None-Match: *``);
- ``uri(key)`` is what polars, pyarrow and duckdb open, with ``storage_options()``.

S3 settings come only from the standard AWS environment and config files, which boto3
reads itself (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_PROFILE``, ``~/.aws/config``...).
The S3 backend lives in ``nightshift.io.s3store``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

from nightshift.errors import ObjectNotFound, StoreAccessError, StoreError
from nightshift.io.keys import check_key, check_prefix

# Local temp files start with this; list() skips them, so a crashed writer's leftovers
# never look like objects. (Only this prefix: ".nightshift-staging/..." keys are listed.)
TEMP_PREFIX = ".tmp-nightshift-"
_COPY_CHUNK = 1 << 20


@runtime_checkable
class ObjectStore(Protocol):
    """Keys are "/"-separated paths relative to ``root``."""

    root: str  # "s3://bucket/prefix" or an absolute local directory; no trailing slash

    def uri(self, key: str) -> str: ...
    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` under ``key`` (a view is only valid during the call: copy it
        to keep it)."""

    def put_file(self, key: str, path: Path) -> None: ...
    def put_written(self, key: str, write: Callable[[BinaryIO], object]) -> None: ...
    def put_if_absent(self, key: str, data: bytes) -> bool: ...
    def get_bytes(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str) -> list[str]: ...
    def delete(self, keys: Iterable[str]) -> None: ...
    def download(self, key: str, path: Path) -> Path: ...
    def storage_options(self) -> dict[str, str] | None: ...


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def open_store(location: str) -> ObjectStore:
    """``s3://bucket/prefix`` opens S3; anything else is a local directory."""
    if location.startswith("s3://"):
        from nightshift.io.s3store import S3Store

        bucket, _, prefix = location.removeprefix("s3://").partition("/")
        if not bucket:
            raise StoreAccessError(f"{location!r} names no bucket: write s3://BUCKET/PREFIX")
        return S3Store(bucket, prefix)
    if location.startswith("file://"):
        location = location.removeprefix("file://")
    elif "://" in location:
        scheme = location.split("://", 1)[0]
        raise StoreAccessError(f"{location!r}: {scheme}:// is not supported (use s3:// or a path)")
    return LocalStore(location)


def __getattr__(name: str) -> object:
    """``S3Store`` importable from here too, without importing boto3 for local stores."""
    if name == "S3Store":
        from nightshift.io.s3store import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class LocalStore:
    """Objects as files under a directory, which is created on the first write."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.path.abspath(os.path.expanduser(os.fspath(root))).rstrip("/") or "/"

    def __repr__(self) -> str:
        return f"LocalStore({self.root!r})"

    def uri(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def path(self, key: str) -> Path:
        return Path(self.root, *check_key(key).split("/"))

    def put_bytes(self, key: str, data: bytes | memoryview) -> None:
        target = self.path(key)
        with _os_errors("write", target):
            _atomic_write(target, lambda out: out.write(data), os.replace)

    def put_file(self, key: str, path: Path) -> None:
        target = self.path(key)
        with open(path, "rb") as source, _os_errors("write", target):
            _atomic_write(target, lambda out: shutil.copyfileobj(source, out, _COPY_CHUNK))

    def put_written(self, key: str, write: Callable[[BinaryIO], object]) -> None:
        """What ``write`` writes to the stream it is given, written in place: no copy."""
        target = self.path(key)
        with _os_errors("write", target):
            _atomic_write(target, write)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """A hard link fails on an existing name, and the linked file is already whole."""
        target = self.path(key)
        created = True

        def link(temp: Path, name: Path) -> None:
            nonlocal created
            try:
                os.link(temp, name)
            except FileExistsError:
                created = False

        with _os_errors("write", target):
            _atomic_write(target, lambda out: out.write(data), link)
        return created

    def get_bytes(self, key: str) -> bytes:
        target = self.path(key)
        with _os_errors("read", target):
            return target.read_bytes()

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest directory the prefix names in full.
        top = Path(self.root, *prefix.rpartition("/")[0].split("/"))
        keys = [key for key in self._walk(top) if key.startswith(prefix)]
        return sorted(keys)

    def _walk(self, top: Path) -> Iterator[str]:
        for dirpath, _dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            for name in filenames:
                if not name.startswith(TEMP_PREFIX):
                    yield name if rel == "." else f"{rel}/{name}"

    def delete(self, keys: Iterable[str]) -> None:
        for key in keys:
            target = self.path(key)
            with _os_errors("delete", target):
                target.unlink(missing_ok=True)

    def download(self, key: str, path: Path) -> Path:
        """A copy of ``key``'s file at ``path``, a fresh file: a scratch copy, so nothing
        is synced (a plan's shard was synced on every read, a few ms a shard)."""
        source, path = self.path(key), Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # a new file, whatever was at that name before
        with _open_source(source) as data, _os_errors("write", path), open(path, "xb") as out:
            shutil.copyfileobj(data, out, _COPY_CHUNK)
        return path

    def storage_options(self) -> dict[str, str] | None:
        return None


@contextlib.contextmanager
def _open_source(path: Path) -> Iterator[BinaryIO]:
    with _os_errors("read", path), open(path, "rb") as data:
        yield data


def _atomic_write(
    target: Path,
    fill: Callable[[BinaryIO], object],
    publish: Callable[[Path, Path], None] = os.replace,
) -> None:
    """Write a hidden temp file beside ``target``, sync it, then publish it by name.

    ``os.replace`` overwrites; ``os.link`` raises ``FileExistsError`` if ``target``
    exists. Either way the name appears only once the content is complete and on disk.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}")
    try:
        with open(temp, "xb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        publish(temp, target)
    finally:
        temp.unlink(missing_ok=True)  # after os.link, or after a failure
    _fsync_dir(target.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the new name itself durable (a crash cannot lose a committed marker)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _os_errors(op: str, path: Path) -> Iterator[None]:
    """OS errors as store errors: missing objects, refusals and the rest."""
    try:
        yield
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        if op != "read":
            raise StoreError(f"cannot {op} {path}: {exc.strerror}") from exc
        raise ObjectNotFound(f"{path} does not exist") from exc
    except PermissionError as exc:
        raise StoreAccessError(
            f"cannot {op} {path}: permission denied (check the directory's owner and mode)"
        ) from exc
    except OSError as exc:
        raise StoreError(f"cannot {op} {path}: {exc}") from exc
