"""Named crash points, for tests that kill a run at exact moments.

``NIGHTSHIFT_CRASH_AT=point[:n]`` makes the process SIGKILL itself (no cleanup, no
flush, as a power cut or an OOM kill would) the n-th time it reaches ``point``
(default the first). Production code marks its dangerous moments with
``crash_point("...")``; unset, each costs an environment lookup.
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    wanted = os.environ.get("NIGHTSHIFT_CRASH_AT")
    if not wanted:
        return
    point, _, count = wanted.partition(":")
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
