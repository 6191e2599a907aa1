"""An encoding process (``running.encoding``): ``python -m nightshift.running.encodingchild``.

It gets the job's spec and the run's tokenizer identity first, loads the same encoder,
says "ready", then answers each job the run sends, in order, until the run closes the
pipe or is gone:

* ``ENCODE`` + an Arrow stream of records: their prompts' ids (lengths and one flat
  array), for the feed;
* ``MEASURE`` + a pickled (handoff, where, Arrow stream of one batch): the batch's plan
  keys (``scheduling.firstpass.measure_handed``) as Arrow IPC, for a first plan.

A job that fails is answered with its error's text: the run encodes or measures that
batch itself (and meets the error there, where it is reported as the run reports it).
"""

from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import threading
import time
from array import array
from multiprocessing.connection import Connection

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
                answer = _encoded(local, memoryview(data)[1:])
            else:
                answer = _measured(local, measurers, memoryview(data)[1:])
        except Exception as exc:  # noqa: BLE001 - told to the run, which stops on it
            answer = (f"{type(exc).__name__}: {exc}", None)
        answers.send(answer)


def _encoded(local: LocalEncoding, data: memoryview) -> tuple[array, array]:
    ids = local.submit(pa.ipc.open_stream(pa.py_buffer(data)).read_all())()
    flat: list[int] = []
    for one in ids:
        flat += one
    return array("i", map(len, ids)), array("i", flat)


def _measured(local: LocalEncoding, measurers: dict, data: memoryview) -> tuple:
    from nightshift.scheduling.firstpass import measure_handed
    from nightshift.scheduling.measure import RecordMeasurer

    handoff, at, stream = pickle.loads(data)
    batch = pa.ipc.open_stream(pa.py_buffer(stream)).read_next_batch()
    measurer = measurers.get(handoff.block_size)
    if measurer is None:
        measurer = RecordMeasurer(local.spec, local.encoder, handoff.block_size)
        measurers[handoff.block_size] = measurer
    keys, lowest, highest = measure_handed(measurer, batch, at, handoff)
    if keys is None:
        return "measured", None, lowest, highest
    sink = io.BytesIO()
    keys.write_ipc(sink, compression="uncompressed")
    return "measured", sink.getvalue(), lowest, highest


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
