"""The engine a spec asks for, and the run's pool of it: started on first use, kept warm
across shards, rebuilt after a crash. The only place that maps the spec to an engine.
(The engine kept warm between runs, ``warm_engines``, lives in ``running.warm``.)"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nightshift.engines.base import Engine, EngineInfo, EngineStats
from nightshift.engines.processes import StartingProcesses, engine_start_processes
from nightshift.engines.tokenizer import model_source
from nightshift.errors import EngineFatalError, RunStoppedError
from nightshift.jobs.modelcheck import check_model_folders
from nightshift.jobs.platform import batch_limits
from nightshift.jobs.spec import JobSpec
from nightshift.running.lora import adapter_folders, lora_arguments
from nightshift.running.placement import placement_entry, start_placed

# The engine kept warm between runs lives in warm; its pool is imported from here too.
from nightshift.running.warm import WarmEngines as WarmEngines
from nightshift.running.warm import warm_engines as warm_engines
from nightshift.running.warm import warm_pool

if TYPE_CHECKING:
    from nightshift.engines.vllm_engine import VllmEngine


def check_engine_spec(spec: JobSpec) -> None:
    """Checks that need the engine's own package, run before planning so mistakes show early."""
    check_model_folders(spec.model.path, spec.model.tokenizer)  # first: the rest read them
    if spec.task.kind == "embed":
        from nightshift.jobs.tasks import embedding_dimension

        embedding_dimension(spec)  # embed.dimensions the model cannot give: refused now
    if spec.run.engine == "vllm":
        from nightshift.engines.vllm_start import check_engine_extra

        check_engine_extra(spec.engine.extra)


def prepare_engine(spec: JobSpec) -> None:
    """Import the spec's engine package and check its settings, ahead of a start."""
    if spec.run.engine == "vllm":
        from nightshift.engines.vllm_engine import import_vllm

        import_vllm()
    check_engine_spec(spec)


def engine_arguments(spec: JobSpec) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments a spec asks for; ``engine.extra`` wins last."""
    e, m = spec.engine, spec.model
    args: dict[str, Any] = {
        "model": model_source(m.path),
        "tokenizer": model_source(m.tokenizer or m.path),
        "max_model_len": m.max_model_len,
        "dtype": m.dtype,
        "trust_remote_code": m.trust_remote_code,
        "kv_cache_dtype": e.kv_cache_dtype,
        "enable_prefix_caching": e.enable_prefix_caching,
        "gpu_memory_utilization": e.gpu_memory_utilization,
        "tensor_parallel_size": e.tensor_parallel_size,
        "disable_log_stats": False,  # get_metrics() needs the stat loggers
        "seed": spec.sampling.seed if spec.sampling.seed is not None else 0,
        # Compact guided JSON: whitespace between JSON tokens is output the user pays for,
        # and a small model can otherwise spend its whole budget on it.
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    # Unset batch limits and block size are the engine's own choice for the hardware
    # (jobs.platform): vLLM's on an H100 are four times the CPU's.
    for key in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
        if getattr(e, key) is not None:
            args[key] = getattr(e, key)
    if m.reasoning:  # vLLM caps the thinking and guides only the answer after it
        args["reasoning_parser"] = m.reasoning
    args.update(lora_arguments(spec))
    if spec.task.kind == "embed":
        # the pooling runner (a generative model is converted: last token, normalized)
        args["runner"] = "pooling"
        del args["structured_outputs_config"]
    args.update(e.extra)
    return args


def start_vllm(spec: JobSpec) -> VllmEngine:
    """A vLLM engine with the very arguments (and fallbacks) a job of ``spec`` gets."""
    from nightshift.engines.vllm_engine import VllmEngine

    return VllmEngine.start(
        engine_arguments(spec),
        spec.engine.cpu_kv_cache_gib,
        stall_s=spec.run.stall_s,
        adapters=adapter_folders(spec),
        startup_timeout_s=spec.run.startup_timeout_s,
    )


def _fake(spec: JobSpec) -> Engine:
    from nightshift.engines.fake import FakeEngine
    from nightshift.jobs.tasks import embedding_dimension

    e = spec.engine
    size = embedding_dimension(spec) if spec.task.kind == "embed" else 64
    seqs, tokens = batch_limits(e)
    engine = FakeEngine.from_environment(e.block_size or 16, e.kv_cache_dtype, seqs, size)
    chosen = {"dtype": spec.model.dtype, "max_num_seqs": seqs, "max_num_batched_tokens": tokens}
    settings = {**engine.info.settings, "chosen": chosen}  # as vLLM's report (vllm_engine)
    engine.info = dataclasses.replace(engine.info, settings=settings)
    return engine


ENGINES: dict[str, Callable[[JobSpec], Engine]] = {"vllm": start_vllm, "fake": _fake}


def build_engine(spec: JobSpec) -> Engine:
    """A new engine for ``spec`` on devices it holds (``running.placement``), or a loan of
    the warm one (``running.warm``) when this process keeps one started with the same
    settings."""

    def start() -> Engine:
        tp = spec.engine.tensor_parallel_size
        return start_placed(tp, lambda: ENGINES[spec.run.engine](spec))

    warm = warm_pool()
    if warm is not None:
        return warm.lend(_engine_key(spec), start)
    return start()


def _engine_key(spec: JobSpec) -> str:
    """Two specs share an engine when they would start the very same one."""
    e = spec.engine
    return json.dumps(
        [
            spec.run.engine,
            engine_arguments(spec),
            adapter_folders(spec),
            e.cpu_kv_cache_gib,
            spec.run.stall_s,
        ],
        sort_keys=True,
        default=str,
    )


class EngineStart:
    """One engine being built in a background thread: started while the plan is built,
    so a GPU engine's minutes of start-up overlap planning instead of following it.

    A start can be abandoned (``abandon``: a stop, a cancel, a start no run took): the
    processes it started so far are killed (``engines.processes.StartingProcesses``),
    whoever waits gets an error at once, and an engine that gets built all the same is
    closed by the building thread."""

    def __init__(self, spec: JobSpec) -> None:
        self.spec = spec
        self.engine: Engine | None = None
        self.error: BaseException | None = None
        self.began = time.perf_counter()
        self.ended: float | None = None
        self.abandoned = False
        self._processes = StartingProcesses()
        self._done = threading.Event()  # built, failed or abandoned
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._build, name="nightshift-engine-start")
        self._thread.start()

    def _build(self) -> None:
        engine = None
        try:
            with engine_start_processes(self._processes):
                engine = build_engine(self.spec)
        except BaseException as exc:  # handed to whoever waits for the engine
            self.error = exc
        finally:
            with self._lock:
                self.ended = time.perf_counter()
                unwanted = self.abandoned
                if not unwanted:
                    self.engine = engine
                self._done.set()
            if unwanted and engine is not None:  # closed, and a lent one not handed back
                with contextlib.suppress(Exception):
                    getattr(engine, "discard", lambda: None)()
                    engine.close()

    def abandon(self) -> None:
        """Give the start up: kill what it started; ``wait`` raises from now on."""
        with self._lock:
            if self._done.is_set():
                return
            self.abandoned = True
            self._done.set()
        self._processes.kill()

    def join(self) -> None:  # the building thread ends (an abandoned one: engine closed)
        self._thread.join()

    def building(self, wait_s: float = 0.0) -> bool:
        """Whether the building thread is still at work after up to ``wait_s``."""
        self._thread.join(wait_s)
        return self._thread.is_alive()

    def wait(self) -> Engine:
        self._done.wait()
        if self.abandoned:
            raise EngineFatalError("the engine's start-up was abandoned")
        if self.error is not None:
            raise self.error
        assert self.engine is not None
        return self.engine


_head: EngineStart | None = None  # started before this process's next run asked for it


def start_head(spec: JobSpec) -> None:
    """Start the engine of this process's next run now, before the run itself exists
    (``pipelines.headstart``: while Prefect's server boots). The run's pool takes it
    over when it asks for the same engine; ``drop_head`` shuts down one no run took."""
    global _head
    drop_head()
    _head = EngineStart(spec)


def head_starting(wait_s: float = 0.0) -> bool:
    """Whether a head-started engine's thread is still at work (it may import), after
    waiting up to ``wait_s`` for it to end; an abandoned start's thread counts too."""
    head = _head
    return head is not None and head.building(wait_s)


def _take_head(spec: JobSpec) -> EngineStart | None:
    """The head-started engine, if it is the one ``spec`` asks for (else shut down)."""
    global _head
    head, _head = _head, None
    if head is not None and _engine_key(head.spec) != _engine_key(spec):
        _shut_down(head)
        return None
    return head


def drop_head() -> None:
    """Shut down a head-started engine that no run took (the run failed first)."""
    global _head
    head, _head = _head, None
    if head is not None:
        _shut_down(head)


def _shut_down(start: EngineStart) -> None:
    """A start no run wants: killed if still starting, else closed; none is left."""
    start.abandon()
    start.join()
    if not start.abandoned:
        with contextlib.suppress(BaseException):
            start.wait().close()


@dataclass
class EnginePool:
    """The run's engine: the caller's, or one built from the spec on first use (a run
    with nothing left to generate starts none) or started early (``start_early``), kept
    warm across shards, and built afresh after a crash. Adds up start-up time and the
    engines' own counters; ``spans`` are the start-ups' (began, ended) clock readings."""

    spec: JobSpec
    given: Engine | None = None
    startup_s: float = 0.0
    starts: int = 0
    stats: EngineStats = field(default_factory=EngineStats)
    info: EngineInfo | None = None
    spans: list[tuple[float, float]] = field(default_factory=list)
    _engine: Engine | None = None
    _starting: EngineStart | None = None  # started early, not yet waited for
    _waiting: EngineStart | None = None  # the start ``acquire`` waits for now
    _stopping: bool = False  # a stop abandoned the start: no engine for this run
    _before: EngineStats = field(default_factory=EngineStats)
    # Where each engine started ran: one ``running.placement.placement_entry`` per start.
    placements: list[dict[str, Any]] = field(default_factory=list)

    def start_early(self) -> None:
        """Start building the engine now, in the background; ``acquire`` waits for it."""
        if self.given is None and self._engine is None and self._starting is None:
            self._starting = _take_head(self.spec) or EngineStart(self.spec)

    def acquire(self) -> Engine:
        if self._engine is not None:
            return self._engine
        if self.given is not None:
            self._before, self._engine = self.given.stats(), self.given
            return self.given
        if self._stopping:
            raise RunStoppedError("the run was stopped before its engine started")
        start = self._starting or _take_head(self.spec) or EngineStart(self.spec)
        self._starting, self._waiting = None, start
        try:
            self._engine = start.wait()
        except EngineFatalError as exc:
            if start.abandoned and self._stopping:
                raise RunStoppedError("the run was stopped while its engine started") from exc
            raise
        finally:
            self._waiting = None
            self._count_start(start)
        self._before = EngineStats()
        self.placements.append(placement_entry(self._engine))
        return self._engine

    def _count_start(self, start: EngineStart) -> None:
        ended = start.ended if start.ended is not None else time.perf_counter()
        self.spans.append((start.began, ended))
        self.startup_s += ended - start.began
        self.starts += 1

    def discard(self, engine: Engine) -> None:
        getattr(engine, "discard", lambda: None)()  # a lent engine is not handed back
        self.close()

    def interrupt(self) -> None:
        """The run is stopping: make the engine's ``run`` return soon (engines that
        cannot be interrupted stop at their next result). Any thread may call it."""
        interrupt = getattr(self._engine, "interrupt", None)
        if interrupt is not None:
            interrupt()
        self.abandon_start()

    def abandon_start(self) -> None:
        """The run is stopping: an engine still starting is not waited for (a vLLM start
        can take minutes, and nothing it holds is an answer). Its processes are killed
        and ``acquire`` raises ``RunStoppedError``. Any thread may call it."""
        self._stopping = True
        for start in (self._starting, self._waiting):
            if start is not None:
                start.abandon()

    def kill(self) -> None:
        """Kill the engine's processes now (a stop that took too long, or a second
        signal), a start still under way included: the feeding thread's ``step()``, or
        its wait for the engine, then fails instead of hanging."""
        self.abandon_start()
        kill = getattr(self._engine, "kill", None)
        if kill is not None:
            with contextlib.suppress(Exception):
                kill()

    def close(self) -> None:
        """Count the engine's work and shut it down (the caller's engine stays up). An
        engine still starting is abandoned (killed; closed once built, if it gets that
        far): no engine process outlives the run, even when planning failed while it
        started, and the run does not wait minutes for an engine it will not use."""
        if self._starting is not None:
            start, self._starting = self._starting, None
            start.abandon()
            start.join()  # quick once killed; the thread closes an engine it built late
            with contextlib.suppress(BaseException):
                self._engine = start.wait()  # it had started already
            self._count_start(start)
        engine, self._engine = self._engine, None
        if engine is None:
            return
        self.info = engine.info
        # A dead engine may not answer at all; the results' own counts remain.
        with contextlib.suppress(Exception):
            self.stats = self.stats.plus(engine.stats().since(self._before))
        if engine is not self.given:
            engine.close()
