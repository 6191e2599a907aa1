"""Which GPUs an engine may use, and holding them while it lives.

The devices are those the host gives this process: an inherited ``CUDA_VISIBLE_DEVICES``
(indices, UUIDs or MIG ids, as Slurm, a container runtime or a user set them), else
every GPU (or MIG instance) ``nvidia-smi -L`` lists, by UUID. A host with neither gives
none: the engine runs where its package puts it (the CPU build) and has no placement.

An engine holds its ``engine.tensor_parallel_size`` devices through an exclusive lock
on one file per device under a host-wide folder (``NIGHTSHIFT_DEVICE_LOCKS``, default
``/tmp/nightshift-devices``), from before its start until its processes are gone. A
lock file, not a Prefect limit: two jobs that report to different Prefect servers (each
``jobs run`` without ``PREFECT_API_URL`` has a temporary server of its own) still never
share a GPU. The kernel frees the lock of a process that dies, and an engine process
forked from the holder keeps it until it is gone too.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from nightshift.errors import UserError

log = logging.getLogger(__name__)
LOCKS_ENV = "NIGHTSHIFT_DEVICE_LOCKS"
DEFAULT_LOCKS = "/tmp/nightshift-devices"
POLL_S = 1.0  # how often an engine waiting for devices looks again
_UUID = re.compile(r"\(UUID: ([^)]+)\)")
_env_lock = threading.Lock()  # one engine start at a time sets this process's variable


class DeviceError(UserError):
    """More devices asked for than the host gives."""


def given_devices(env: dict[str, str] | os._Environ = os.environ) -> list[str] | None:
    """The devices this host gives, as ``CUDA_VISIBLE_DEVICES`` entries; None when it
    gives no GPU (no variable and no ``nvidia-smi``, or the variable empty or -1)."""
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        listed = [d.strip() for d in value.split(",") if d.strip()]
        if "-1" in listed:  # CUDA stops at the first invalid id: nothing after it counts
            listed = listed[: listed.index("-1")]
        return listed or None
    return [uuid for uuid, _ in driver_devices()] or None


def driver_devices() -> list[tuple[str, str]]:
    """(UUID, GPU index) of every device ``nvidia-smi -L`` lists: a GPU split into MIG
    instances counts as its instances. Empty without ``nvidia-smi`` or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus: list[tuple[str, str, list[str]]] = []  # (uuid, index, its MIG uuids)
    for line in out.splitlines():
        found = _UUID.search(line)
        if found is None:
            continue
        if line.startswith("GPU "):
            gpus.append((found.group(1), line.split()[1].rstrip(":"), []))
        elif gpus and line.strip().startswith("MIG"):
            gpus[-1][2].append(found.group(1))
    return [(m, index) for uuid, index, migs in gpus for m in (migs or [uuid])]


def lock_folder() -> Path:
    folder = Path(os.environ.get(LOCKS_ENV) or DEFAULT_LOCKS)
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # shared by every user's jobs on the host
        folder.chmod(0o1777)
    return folder


@dataclass
class Placement:
    """The devices one engine holds; ``visible`` is its ``CUDA_VISIBLE_DEVICES``."""

    devices: tuple[str, ...]
    _files: list[IO[str]] = field(default_factory=list, repr=False)

    @property
    def visible(self) -> str:
        return ",".join(self.devices)

    def release(self) -> None:
        files, self._files = self._files, []
        for f in files:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
                f.close()


def check_device_count(needed: int, given: list[str] | None, what: str) -> None:
    """Refuse, in one line, a run that needs more devices than the host gives."""
    if given is not None and needed > len(given):
        raise DeviceError(
            f"{what} needs {needed} GPU(s) but this host gives {len(given)} "
            f"({','.join(given)}): use fewer workers or a smaller "
            "engine.tensor_parallel_size, or give more devices (CUDA_VISIBLE_DEVICES)"
        )


def hold_devices(
    count: int, given: list[str], abandoned: Callable[[], bool] = lambda: False
) -> Placement:
    """Lock ``count`` of the ``given`` devices, waiting while others hold them (warned
    once, naming the holders); raises ``InterruptedError`` once ``abandoned()``."""
    check_device_count(count, given, f"engine.tensor_parallel_size {count}")
    keys = _lock_keys(given)
    warned = False
    while True:
        held = _try_hold(count, given, keys)
        if held is not None:
            return held
        if abandoned():
            raise InterruptedError("the engine's start was abandoned while it waited for a GPU")
        if not warned:
            log.warning(
                "waiting for %d free GPU(s) of %s: held by %s (locks in %s)",
                count, ",".join(given), _holders(keys), lock_folder(),
            )  # fmt: skip
            warned = True
        time.sleep(POLL_S)


def _try_hold(count: int, given: list[str], keys: list[str]) -> Placement | None:
    """Lock the first ``count`` free devices, or none at all (no half-held set waits)."""
    placement = Placement(())
    folder = lock_folder()
    for device, key in zip(given, keys, strict=True):
        f = _open_lock(folder / f"{key}.lock")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        with contextlib.suppress(OSError):  # another user's file: locked, not written
            f.truncate(0)
            f.write(f"{os.getpid()}\n")
            f.flush()
        placement._files.append(f)
        placement.devices += (device,)
        if len(placement.devices) == count:
            return placement
    placement.release()
    return None


def _open_lock(path: Path) -> IO[str]:
    """A device's lock file, writable by every user of the host; one another user made
    is opened read-only (a lock needs no write access)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # past the umask: the next user's job may write it too
        return os.fdopen(fd, "r+")
    except PermissionError:
        return path.open("r")


def _lock_keys(given: list[str]) -> list[str]:
    """A file name per device, the same whichever way it is named: an index becomes the
    UUID ``nvidia-smi`` gives it (indices in its PCI order, as CUDA_DEVICE_ORDER=PCI_BUS_ID)."""
    by_index = (
        {index: uuid for uuid, index in driver_devices()} if any(d.isdigit() for d in given) else {}
    )
    return [re.sub(r"[^A-Za-z0-9._-]", "_", by_index.get(d, d)) for d in given]


def _holders(keys: list[str]) -> str:
    folder = lock_folder()
    pids = []
    for key in keys:
        with contextlib.suppress(OSError):
            pids.append((folder / f"{key}.lock").read_text().strip() or "?")
    return "pid " + ", ".join(pids) if pids else "another engine"


@contextlib.contextmanager
def visible_devices(placement: Placement | None) -> Iterator[None]:
    """``CUDA_VISIBLE_DEVICES`` set to the placement's devices while an engine starts
    (its processes inherit it), the process's own value back afterwards. Starts in one
    process take turns, so none sees another's devices."""
    if placement is None:
        yield
        return
    with _env_lock:
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = placement.visible
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
