"""Render and encode the feed's record batches in processes of their own.

Rendering and tokenizing every prompt is the run path's largest cost per record. In a
thread it takes its share of the run's one GIL from the thread that feeds the engine and
turns answers into rows, so on a fast engine the two wait on each other. A large run
(a job of ``ENCODE_PROCESSES_FROM`` records or more, ``run.encode_processes``) hands each batch to
a child process instead: the child gets the batch's records as Arrow, renders and
encodes them with its own copy of the job's encoder (the same tokenizer, the same
template: the same ids), and sends back the ids as one flat array. Until a child has
loaded its tokenizer (seconds) batches are encoded here, so starting one never delays
the first request. A run starts its children before it plans (``start_spare``), so
they have loaded by the time the first batch is fed; the feed takes them over. Until
then a first plan borrows them (``lend_spare``) to run jobs of its steps beside it
(``scheduling.helpers``): they would be idle, and the plan is the same.

A child reads its batches from a pipe the run alone writes to: when the run ends, or is
killed, the pipe closes and the child exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import polars as pl
import pyarrow as pa

from nightshift.engines.tokenizer import PromptEncoder
from nightshift.errors import NightshiftError
from nightshift.jobs.spec import JobSpec
from nightshift.scheduling.helpers import HelperJob
from nightshift.scheduling.render import renderer_for, rows

PLAN_JOBS_PER_CHILD = 2  # a first plan's jobs a child holds at once: one runs, one waits
ENCODE_PROCESSES_FROM = 20_000  # records in a job before its batches go to processes
ANSWER_WITHIN_S = 120.0  # a batch takes well under a second; a child past this is stuck
SPARE_FOR_S = 600.0  # children started ahead that no feed took by then are closed
Encoded = Callable[[], list[list[int]]]  # a batch's ids, once they are there


def encode_processes(records: int, setting: int | None) -> int:
    """Processes for a job of ``records``: ``NIGHTSHIFT_ENCODE_PROCESSES``, else
    ``setting`` (run.encode_processes) where set, else one per two cores beyond the run's
    own (at least one), for a large job only."""
    env = os.environ.get("NIGHTSHIFT_ENCODE_PROCESSES", "").strip()
    if env.isdigit():  # anything else is no setting (never a traceback mid-run)
        return int(env)
    if setting is not None:
        return setting
    if records < ENCODE_PROCESSES_FROM or (os.cpu_count() or 1) < 2:
        return 0
    return max(1, min(4, ((os.cpu_count() or 2) - 1) // 2))


class LocalEncoding:
    """Encodes a batch in the calling thread (a small run, or a child not ready yet)."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder) -> None:
        self.renderer, self.encoder = renderer_for(spec, encoder), encoder
        self.spec = spec

    def submit(self, records: pa.Table) -> Encoded:
        pieces = self.renderer.pieces(pl.from_arrow(records))  # type: ignore[arg-type]
        ids = self.encoder.encode_pieces(rows(pieces))
        return lambda: ids

    def close(self) -> None:
        pass


class ProcessEncoding:
    """Batches encoded by ``processes`` children, taken in turn; their answers come back
    in the order sent. Batches sent before a child is ready, or after it died, are
    encoded here."""

    def __init__(self, spec: JobSpec, encoder: PromptEncoder, processes: int) -> None:
        self.local = LocalEncoding(spec, encoder)
        self._children = _take_spare(spec) or _start_children(spec, self.local, processes)
        self._turn = itertools.cycle(self._children)
        self.sent = 0  # batches sent to a child (the others were encoded here)

    def submit(self, records: pa.Table) -> Encoded:
        """``records`` encoded, by the next child in turn (here while it is not ready)."""
        child = next(self._turn)
        if not child.ready():
            return self.local.submit(records)
        self.sent += 1
        return child.send(records)

    def close(self) -> None:
        _close_all(self._children)


def _start_children(spec: JobSpec, local: LocalEncoding, processes: int) -> list[_Child]:
    children: list[_Child] = []
    try:
        for _ in range(processes):
            children.append(_Child(spec, local))
    except BaseException:
        _close_all(children)
        raise
    return children


def _close_all(children: list[_Child]) -> None:
    for child in children:  # all told at once, then each waited for
        child.finish()
    for child in children:
        child.close()


# Children started ahead of a run's feed (``start_spare``), by the spec they were
# started for: the feed of that spec takes them (``ProcessEncoding``).
_spares: dict[bytes, list[_Child]] = {}
_spares_lock = threading.Lock()


def start_spare(spec: JobSpec, encoder: PromptEncoder, records: int) -> None:
    """Start the encoding processes a job of about ``records`` gets, before its plan is
    built: a child takes seconds to load its tokenizer, and batches a feed sends before
    then are encoded in the run, beside the engine. Unclaimed after ``SPARE_FOR_S``
    (the run failed, or had nothing to feed), they are closed. Children already
    started for the same spec (a resume's, from its head start) are kept."""
    processes = encode_processes(records, spec.run.encode_processes)
    key = pickle.dumps(spec)
    with _spares_lock:
        if not processes or key in _spares:
            return
    children = _start_children(spec, LocalEncoding(spec, encoder), processes)
    with _spares_lock:
        replaced = _spares.pop(key, None)
        _spares[key] = children
    _kill_all(replaced or [])
    timer = threading.Timer(SPARE_FOR_S, _drop_spare, (key, children))
    timer.daemon = True
    timer.start()


@contextlib.contextmanager
def lend_spare(spec: JobSpec) -> Iterator[PlanHelpers | None]:
    """The children started ahead for ``spec``, lent to its first plan while it is built
    (``scheduling.helpers``; None where there are none), then kept for its feed as
    before (or closed, where others were started for it meanwhile)."""
    children = _take_spare(spec)
    try:
        yield PlanHelpers(children) if children else None
    finally:
        # One that died, or still holds a job of the plan (the plan failed), is no use
        # to a feed: it would read the plan's answer as a batch's ids.
        useless = [c for c in children or [] if c.helping or c.gone()]
        children = [c for c in children or [] if c not in useless]
        _kill_all(useless)
        if children:
            with _spares_lock:
                kept = _spares.setdefault(pickle.dumps(spec), children) is children
            if not kept:
                _kill_all(children)


@contextlib.contextmanager
def planning_processes(
    spec: JobSpec, encoder: PromptEncoder, records: int
) -> Iterator[PlanHelpers | None]:
    """Encoding processes for a plan no feed follows (``jobs plan``): started as a run
    would start them for ``records``, lent to the plan, closed after it."""
    start_spare(spec, encoder, records)
    try:
        with lend_spare(spec) as helpers:
            yield helpers
    finally:
        close_spare(spec)


class PlanHelpers:
    """Spare children running a first plan's jobs (``scheduling.helpers.Helpers``): a
    job goes to a child that is ready and holds fewer than ``PLAN_JOBS_PER_CHILD``; the
    plan runs the others itself."""

    def __init__(self, children: list[_Child]) -> None:
        self.children = children
        self.count = len(children)
        self.sent = 0  # jobs sent to a child (the others ran in the plan's process)

    def submit(self, job: HelperJob) -> _Helping | None:
        for child in self.children:
            if child.ready() and child.helping < PLAN_JOBS_PER_CHILD:
                self.sent += 1
                return child.help_plan(job)
        return None


class _Helping:
    """A plan's job a child runs; ``result`` is None where it could not (the plan then
    runs it itself, and meets there any error the child met)."""

    def __init__(self, child: _Child) -> None:
        self.child = child
        child.helping += 1

    def done(self) -> bool:
        return self.child.answered()

    def result(self) -> Any | None:
        answer = self.child.answer()
        self.child.helping -= 1
        return answer[1] if answer is not None and answer[0] == "done" else None


def _take_spare(spec: JobSpec) -> list[_Child] | None:
    with _spares_lock:
        return _spares.pop(pickle.dumps(spec), None)


def close_spare(spec: JobSpec) -> None:
    """End the children started ahead for ``spec`` that no feed took (its feed encodes
    in the run, or there is none: the run failed, stopped, or left the feeding to
    workers). They hold no batch: killed, not waited for while they load a tokenizer."""
    _kill_all(_take_spare(spec) or [])


def _drop_spare(key: bytes, children: list[_Child]) -> None:
    with _spares_lock:
        if _spares.get(key) is not children:
            return  # a feed took them
        del _spares[key]
    _kill_all(children)


def _kill_all(children: list[_Child]) -> None:
    for child in children:
        child.process.kill()
    _close_all(children)


_GONE = object()  # a child's answers: it ended
CHILD = "nightshift.running.encodingchild"  # what a child runs
ENCODE, PLAN_JOB = b"E", b"P"  # a job's first byte: records to encode, a plan's job
PIPE_BYTES = 1 << 20  # a pipe's size where Linux allows it (64 KiB by default)


def _roomy(fd: int) -> None:
    """Make the pipe of ``fd`` hold a batch whole: a batch's ids (about 160 KB for 256
    tickets) and its records. On a 64 KiB pipe the child's write waited on the run's
    reader thread, which waits for the GIL, and the child stopped encoding meanwhile."""
    setting = getattr(fcntl, "F_SETPIPE_SZ", None)  # Linux only
    if setting is not None:
        with contextlib.suppress(OSError):  # past /proc/sys/fs/pipe-max-size: as it is
            fcntl.fcntl(fd, setting, PIPE_BYTES)


class _Child:
    """One encoding process (``python -m nightshift.running.encodingchild``, never a fork of
    the threaded run, nor a re-run of its main module); a thread of the run drains its
    answers as they come, so neither side blocks on a full pipe while the other waits."""

    def __init__(self, spec: JobSpec, local: LocalEncoding) -> None:
        jobs_read, jobs_write = os.pipe()
        answers_read, answers_write = os.pipe()
        _roomy(jobs_write)
        _roomy(answers_write)
        self.process = subprocess.Popen(
            [sys.executable, "-m", CHILD, str(jobs_read), str(answers_write), str(os.getpid())],
            pass_fds=(jobs_read, answers_write),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,  # a quiet screen: what it knows comes by its pipe
        )
        os.close(jobs_read)  # the child's ends: closed here, so a dead run closes its pipe
        os.close(answers_write)
        self.jobs = Connection(jobs_write, readable=False)
        self.answers = Connection(answers_read, writable=False)
        self.local = local
        self._answers: queue.SimpleQueue = queue.SimpleQueue()
        self._state = "starting"  # then "ready", or "gone" once its pipe closed
        self._abandoned = False  # timed out: killed, and its answers never read again
        self.helping = 0  # a first plan's jobs sent and not yet taken (PlanHelpers)
        # Both pipe ends are served by threads of their own: a child that stops reading
        # (frozen, or slow to start with a large spec) never blocks the run's feed.
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._outbox.put(pickle.dumps((spec, local.encoder.identity())))
        self._writer = threading.Thread(target=self._write, name="nightshift-encoder-batches")
        self._reader = threading.Thread(target=self._read, name="nightshift-encoder-answers")
        for thread in (self._writer, self._reader):
            thread.daemon = True
            thread.start()

    def _write(self) -> None:
        while (data := self._outbox.get()) is not None:
            try:
                self.jobs.send_bytes(data)
            except OSError:  # the child is gone: its reader says so
                return

    def _read(self) -> None:
        try:
            if self.answers.recv() == "ready":
                self._state = "ready"
            while True:
                self._answers.put(self.answers.recv())
        except Exception:  # noqa: BLE001 - closed, or unreadable: either way it is gone
            pass
        self._state = "gone"
        self._answers.put(_GONE)

    def ready(self) -> bool:
        return self._state == "ready" and not self._abandoned

    def gone(self) -> bool:
        """Whether it ended, or was killed as stuck: it answers nothing more."""
        return self._state == "gone" or self._abandoned

    def send(self, records: pa.Table) -> Encoded:
        sink = pa.BufferOutputStream()
        sink.write(ENCODE)
        with pa.ipc.new_stream(sink, records.schema) as writer:
            writer.write_table(records)
        self._outbox.put(sink.getvalue())
        return lambda: self._take(records)

    def help_plan(self, job: HelperJob) -> _Helping:
        """``job`` run for a first plan (``scheduling.helpers``)."""
        self._outbox.put(PLAN_JOB + pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        return _Helping(self)

    def _take(self, records: pa.Table) -> list[list[int]]:
        answer = self.answer()
        if answer is None:  # its batch is encoded here instead
            return self.local.submit(records)()
        lengths, flat = answer
        if isinstance(lengths, str):
            raise NightshiftError(f"an encoding process failed: {lengths}")
        ids, at = flat.tolist(), 0
        out = []
        for n in lengths:
            out.append(ids[at : at + n])
            at += n
        return out

    def answered(self) -> bool:
        """Whether the next answer is there (or the child is past answering)."""
        return self._abandoned or not self._answers.empty()

    def answer(self):
        """The answer to the oldest job sent and not yet answered; None where the child
        is past answering (gone, or stuck and killed)."""
        if self._abandoned:  # any answer still to come may be a late one: never read
            return None
        try:
            answer = self._answers.get(timeout=ANSWER_WITHIN_S)
        except queue.Empty:  # a child this slow is stuck: it goes, its jobs come here
            self._abandoned = True
            self.process.kill()
            return None
        if answer is _GONE:  # it ended with this job unanswered
            self._answers.put(_GONE)
            return None
        return answer

    def finish(self) -> None:
        """No more batches: the writer ends, then the pipe closes and the child exits."""
        self._outbox.put(None)

    def close(self) -> None:
        if self._state == "starting":  # still loading: it was sent nothing, so nothing
            self.process.kill()  # is lost, and a short rerun's end never waits its import
        self.finish()
        self._writer.join(timeout=5)
        if self._writer.is_alive():  # stuck writing to a child that stopped reading
            self.process.kill()
            self._writer.join()
        with contextlib.suppress(OSError):
            self.jobs.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(timeout=5)
        self.answers.close()
