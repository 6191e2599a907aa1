"""What a run started from this process does before its flow exists: the head start.

Before the job flow's first line runs, Prefect boots its temporary server (a process
of its own, about 5 s) and the flow run is created; then the flow imports vLLM (about
7 s) as it starts the engine. None of these needs the others, so ``head_start``:

1. boots the temporary server in the background (when no ``PREFECT_API_URL`` is set;
   ``pipelines.tempserver``);
2. meanwhile imports vLLM, the flow and the tokenizer's package (transformers, whose
   AutoTokenizer imports torch: 3 s on the fake engine, where vLLM does not import it
   first) here, in the main thread (imports are not run in two threads at once: two
   threads importing modules that import each other can deadlock); a resume instead
   loads its tokenizer by the class its plan recorded, which needs no torch, and
   starts its encoding processes (``runner.resume_ahead``);
3. starts the engine itself (``running.engines.start_head``), where this host holds
   no GPU slot: a GPU host's engine waits for its slot, which needs the server, and
   the flow starts it early once the slot is held (``pipelines.flow``).

The flow's pool takes the head-started engine over (``EnginePool.start_early``), and
the run's clock starts here (``runclock.clock_start``), so the report counts this time too.
A job with nothing left to run, one run by ``--workers``, or one with
``run.overlap_startup: false`` gets no head start; an engine no run took is shut down
when the block ends (the plan failed first).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from importlib import import_module

from nightshift.engines.tokenizer import model_source
from nightshift.io.outputs import JobOutput
from nightshift.jobs.spec import JobSpec
from nightshift.pipelines import tempserver
from nightshift.pipelines.runclock import start_clock, stop_clock
from nightshift.pipelines.slots import host_takes_slots
from nightshift.reports.files import chart_wanted
from nightshift.running import engines
from nightshift.running.canary import canary_pending
from nightshift.running.runner import (
    drop_ahead,
    planned_tokenizer,
    resume_ahead,
    work_may_be_left,
)
from nightshift.scheduling import tokenizermemo


@contextlib.contextmanager
def head_start(spec: JobSpec, *, overwrite: bool, new_run: bool, workers: int) -> Iterator[None]:
    """Within the block (the flow call), the run has a head start; see the module."""
    start_clock()
    try:
        server = tempserver.boot()
        early = workers == 1 and spec.run.overlap_startup
        early = early and work_may_be_left(spec, overwrite, new_run) and _prepared(spec)
        early = early and not canary_pending(spec, overwrite, new_run)  # engines in turn
        import_module("nightshift.pipelines.flow")  # before the engine's thread: one importer
        afresh = overwrite or new_run
        if not (early and not afresh and resume_ahead(spec)):  # a resume loads it now
            _import_tokenizers(spec, afresh)
        if early and not host_takes_slots():
            engines.start_head(spec)
        if server is not None:
            _import_while_it_boots(server)
            server.join()  # the flow's client must not find a half-started server
            tempserver.use()
        yield
    finally:
        stop_clock()
        engines.drop_head()
        drop_ahead(spec)


def _import_tokenizers(spec: JobSpec, afresh: bool) -> None:
    """What loading the job's tokenizer imports (``engines.tokenizer``), while the server
    boots rather than after it: a plan, or a resume's first record, waits on it. A
    resume loads its tokenizer by the class its plan recorded (``runner.start_run``):
    that class's module, not AutoTokenizer's, which imports torch (3 s on 2 cores); so
    does a fresh run of a model folder whose tokenizer an earlier run loaded
    (``scheduling.tokenizermemo``)."""
    known = None if afresh else planned_tokenizer(JobOutput(spec.output.path))
    with contextlib.suppress(Exception):  # a broken install: the plan's own load says so
        known = known or tokenizermemo.recall(
            model_source(spec.model.tokenizer or spec.model.path), spec.model.trust_remote_code
        )
        if known is not None and known.tokenizer_class() is not None:
            return
        import_module("transformers").AutoTokenizer  # noqa: B018  (a lazy module's import)


def _import_while_it_boots(server: threading.Thread) -> None:
    """What the run imports later, imported while the server still boots; not while an
    engine is being built in a thread of this process (one importer at a time, as
    above): FastAPI's encoder, which Prefect imports to store the flow run's parameters
    as it starts the flow (0.25 s on 2 cores), then the report's chart module
    (matplotlib: about 0.5 s), so the wrap-up draws at once, unless the run draws no
    chart (``NIGHTSHIFT_REPORT_CHART``: 30 MB and 0.4 s of CPU for nothing)."""
    wanted = ["fastapi.encoders"] + (["nightshift.reports.chart"] if chart_wanted() else [])
    for module in wanted:
        if not server.is_alive() or engines.head_starting(wait_s=0.1):
            return
        with contextlib.suppress(ImportError):  # Prefect's own import says what is wrong
            import_module(module)


def _prepared(spec: JobSpec) -> bool:
    """Import the engine's package and check its settings; False if they are wrong."""
    try:
        engines.prepare_engine(spec)
    except Exception:  # the flow raises it, where the run's other errors go
        return False
    return True
