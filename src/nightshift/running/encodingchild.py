"""An encoding process (``running.encoding``): ``python -m nightshift.running.encodingchild``.

It gets the job's spec and the run's tokenizer identity first, loads the same encoder,
says "ready", then answers each job the run sends, in order, until the run closes the
pipe or is gone:

* ``ENCODE`` + an Arrow stream of records: their prompts' ids (lengths and one flat
  array), for the feed;
* ``PLAN_JOB`` + a pickled job of a first plan (``scheduling.helpers``): what its
  ``run`` returns with this process's own ``RecordMeasurer``.

A job that fails is answered with its error's text: the run encodes that batch itself,
or runs that plan's job itself (and meets the error there, where it is reported as the
run reports it).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from array import array
from multiprocessing.connection import Connection
from typing import Any

import pyarrow as pa

from nightshift.running.encoding import ENCODE, LocalEncoding


def serve(jobs: Connection, answers: Connection, parent: int) -> None:
    """The loop: the job's spec, its encoder, then one answer per job until the run
    closes the pipe, or is gone (an engine process forked from the run may hold the
    pipe open after the run died)."""
    from nightshift.scheduling.plan import load_encoder

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the run's to handle
    threading.Thread(target=_exit_without, args=(parent,), daemon=True).start()
    try:
        spec, identity = pickle.loads(jobs.recv_bytes())
        local = LocalEncoding(spec, load_encoder(spec, like=identity))
    except Exception:  # noqa: BLE001 - the run loaded it: it encodes in its thread instead
        return
    answers.send("ready")
    measurers: dict[int, object] = {}  # by block size: one RecordMeasurer, kept warm
    while True:
        try:
            data = jobs.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            if data[:1] == ENCODE:
                measurers.clear()  # the feed has begun: the plan is done with this one
                answer = _encoded(local, memoryview(data)[1:])
            else:
                answer = _plan_job(local, measurers, memoryview(data)[1:])
        except Exception as exc:  # noqa: BLE001 - told to the run, which stops on it
            answer = (f"{type(exc).__name__}: {exc}", None)
        answers.send(answer)


def _encoded(local: LocalEncoding, data: memoryview) -> tuple[array, array]:
    ids = local.submit(pa.ipc.open_stream(pa.py_buffer(data)).read_all())()
    flat: list[int] = []
    for one in ids:
        flat += one
    return array("i", map(len, ids)), array("i", flat)


def _plan_job(local: LocalEncoding, measurers: dict, data: memoryview) -> tuple[str, Any]:
    from nightshift.scheduling.measure import RecordMeasurer

    job = pickle.loads(data)
    measurer = measurers.get(job.block_size)
    if measurer is None:
        measurer = RecordMeasurer(local.spec, local.encoder, job.block_size)
        measurers[job.block_size] = measurer
    return "done", job.run(measurer)


def _exit_without(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


if __name__ == "__main__":
    jobs_fd, answers_fd, parent = (int(a) for a in sys.argv[1:4])
    serve(Connection(jobs_fd, writable=False), Connection(answers_fd, readable=False), parent)
    # every answer is written (Connection.send returns once it is): nothing is left to
    # flush, and the tokenizer's and polars' teardown took a second of every run's end
    os._exit(0)
