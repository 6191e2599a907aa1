"""The vLLM adapter: offline ``vllm.LLM`` at maximum batch, FP8 KV cache, prefix caching.

Prompts arrive as token ids (``TokensPrompt``), so vLLM runs exactly what was counted
and never tokenizes twice. Each request runs under its own sampling when it has one
(``engines.vllm_outputs``); guided decoding (choice, JSON schema, JSON object) goes
through ``StructuredOutputsParams``. Token counts per record come from vLLM's outputs; cache
and phase-time counters from ``LLM.get_metrics()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from nightshift.engines.base import EngineInfo, EngineRequest, EngineResult, EngineStats, Sampling
from nightshift.engines.processes import (
    EngineProcesses,
    engine_cores_die_with_this_process,
    start_was_killed,
)
from nightshift.engines.stall import StallWatch
from nightshift.engines.vllm_outputs import ParamsCache, _result
from nightshift.engines.vllm_peaks import PeakRecorder
from nightshift.engines.vllm_start import (
    READY_TIMEOUT,
    EngineStartupTimeout,
    engine_chose,
    is_fp8_failure,
    one_line,
    platform_choices,
    set_startup_timeout,
)
from nightshift.errors import EngineError, EngineFatalError, EngineStalledError

log = logging.getLogger(__name__)
# vLLM reconfigures the logging module (dictConfig) on import and at each LLM(): that
# flushes every handler, Prefect's API log handler included, which waits for Prefect's
# event-loop thread, which waits for the logging lock dictConfig holds: a deadlock when
# the engine starts in a thread while a flow runs. Its records propagate to the root
# logger instead, and so reach the engine log (see nightshift.console).
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
logging.getLogger("vllm").setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"))

# Metric name -> EngineStats field. Counters sum over label sets (one per engine).
_COUNTERS = {
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:prompt_tokens_cached": "prompt_tokens_cached",
    "vllm:generation_tokens": "output_tokens",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:num_preemptions": "preemptions",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "draft_tokens_accepted",
}
_HISTOGRAM_SUMS = {
    "vllm:request_prefill_time_seconds": "prefill_seconds",
    "vllm:request_decode_time_seconds": "decode_seconds",
}
_HISTOGRAM_COUNTS = {"vllm:iteration_tokens_total": "engine_steps"}


def import_vllm() -> None:
    """Import what starting an engine needs (about 7 s on a small CPU host), so a caller
    can do it ahead of time in its main thread (``pipelines.headstart``)."""
    import vllm.entrypoints.llm  # noqa: F401
    import vllm.v1.engine.core  # noqa: F401


def fp8_kv_unsupported_reason() -> str | None:
    """Why this machine cannot hold an FP8 KV cache, or None when it can.

    vLLM's CPU attention stores FP8 KV only with AVX-512 or AMX (cpu_attn._get_attn_isa);
    on an AVX2-only CPU the engine would fail at start-up instead.
    """
    import torch
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return None
    if torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported():
        return None
    return "vLLM's CPU backend needs AVX-512 or AMX for an FP8 KV cache; this CPU has neither"


class VllmEngine:
    def __init__(
        self,
        llm: Any,
        notes: dict[str, Any] | None = None,
        stall_s: float | None = None,
        adapters: dict[str, str] | None = None,
    ) -> None:
        self._llm = llm
        self._loras = _lora_requests(adapters or {})
        self._ended = EngineProcesses()  # what kill() ended, for close() to wait for
        self._markers = _reasoning_markers(llm)  # a reasoning model's: answers split apart
        cache = llm.llm_engine.vllm_config.cache_config
        blocks = cache.num_gpu_blocks or 0
        self.info = EngineInfo(
            name="vllm",
            kv_cache_dtype=str(cache.cache_dtype),
            kv_cache_tokens=blocks * cache.block_size,
            block_size=cache.block_size,
            prefix_caching=bool(cache.enable_prefix_caching),
            settings={"num_gpu_blocks": blocks, **(notes or {}), "chosen": engine_chose(llm)},
        )
        max_num_seqs = llm.llm_engine.vllm_config.scheduler_config.max_num_seqs
        self.read_ahead = max(4 * max_num_seqs, 256)
        self._alive = threading.Event()
        self._alive.set()
        self._interrupted = threading.Event()
        self.stalled = False  # set once the watchdog killed this engine as hung
        self._in_flight = 0
        self._peaks = PeakRecorder.attach(llm)
        self._watch = StallWatch(stall_s, self._generated_tokens)
        _wake_reader_when_engine_dies(llm, self._alive)
        if stall_s is not None:
            threading.Thread(
                target=self._watchdog, name="nightshift-stall-watch", daemon=True
            ).start()

    @classmethod
    def start(
        cls,
        args: dict[str, Any],
        cpu_kv_cache_gib: int,
        stall_s: float | None = None,
        adapters: dict[str, str] | None = None,
        startup_timeout_s: float | None = None,
    ) -> VllmEngine:
        """Start ``vllm.LLM(**args)``; without FP8 KV where this machine cannot hold it,
        with what the platform needs that the spec left unset (``engines.vllm_start``).

        The fallback is never silent: it is logged and kept in ``info.settings``, so it
        reaches every report. It follows a failed start only when vLLM's error names the
        FP8 KV cache as the cause; any other failure is the job's error.
        """
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # The CPU build sizes its KV cache from this variable, in whole GiB.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cpu_kv_cache_gib))
        if startup_timeout_s is not None:
            set_startup_timeout(startup_timeout_s)
        args = dict(args)
        chosen = platform_choices(args)  # on a CPU: float32 without bf16 units, eager
        base = {"platform_choices": chosen} if chosen else {}
        requested = args["kv_cache_dtype"]
        reason = fp8_kv_unsupported_reason() if "fp8" in requested else None
        if reason is None:
            try:
                return cls(_start_llm(args), base or None, stall_s, adapters)
            except EngineError as exc:
                killed = start_was_killed()  # abandoned: no second start
                if "fp8" not in requested or killed or not is_fp8_failure(exc):
                    raise
                reason = f"vLLM did not start with an FP8 KV cache ({exc})"
        log.warning("engine.kv_cache_dtype %s falls back to auto: %s", requested, reason)
        notes = {**base, "kv_cache_dtype_requested": requested, "kv_cache_fallback": reason}
        return cls(_start_llm({**args, "kv_cache_dtype": "auto"}), notes, stall_s, adapters)

    def run(self, requests: Iterable[EngineRequest], sampling: Sampling) -> Iterator[EngineResult]:
        """Feed ``LLMEngine`` a sliding window of requests and yield each as it finishes.

        ``LLM.generate`` waits for a whole list; this keeps ``read_ahead`` requests in the
        engine (several batches' worth), so it runs at full batch from the first record to
        the last, and results can be written as they come.
        """
        from vllm.v1.engine.exceptions import EngineDeadError

        engine, params = self._llm.llm_engine, ParamsCache(sampling)
        pending, in_flight, exhausted = iter(requests), {}, False
        watch = self._watch
        self._interrupted.clear()
        try:
            while not self._interrupted.is_set():  # interrupt(): the run is stopping
                room, taken = self.read_ahead - len(in_flight), 0
                for request in islice(pending, room):
                    if request is None:  # none ready yet: step what we hold, ask again
                        break
                    taken += 1  # noqa: SIM113 (a None ends the loop early)
                    own = request.sampling or sampling
                    refused = self._add(engine, request, params.get(own))
                    if refused:
                        yield refused
                    else:
                        in_flight[str(request.key)] = own
                else:
                    exhausted = exhausted or taken < room
                if not in_flight:
                    if exhausted:
                        return
                    continue
                self._in_flight = len(in_flight)
                watch.begin_step()
                try:
                    outputs = engine.step()  # a hung core never returns: see _watchdog
                finally:
                    watch.end_step()
                for out in outputs:
                    if out.finished:
                        own = in_flight.pop(out.request_id, sampling)
                        watch.finished += 1
                        top = None if own.score_tokens else own.logprobs
                        key, scores = int(out.request_id), own.score_tokens
                        yield _result(key, out, top, scores, self._markers)
        except EngineDeadError as exc:
            if self.stalled:
                raise EngineStalledError(
                    f"vLLM engine hung: no progress for {watch.stall_s:g}s with "
                    f"{len(in_flight)} request(s) in flight; it was killed"
                ) from exc
            raise EngineFatalError(f"vLLM engine died: {exc}") from exc
        finally:
            self._in_flight = 0
            if in_flight and self._llm is not None:  # the caller stopped early, or it died
                with contextlib.suppress(Exception):  # a dead engine cannot abort anything
                    engine.abort_request(list(in_flight))

    def interrupt(self) -> None:
        """Make ``run`` return after the current step (the run is stopping); the requests
        it held are aborted, and none of them is an answer."""
        self._interrupted.set()

    def kill(self) -> None:
        """SIGKILL the engine's processes (EngineCore and its children): vLLM then raises
        EngineDeadError in the caller's ``step()``, even one that never returns."""
        self._ended.kill(_engine_pids(self._llm) if self._llm is not None else [])

    def _watchdog(self) -> None:
        period = min(5.0, max(0.2, (self._watch.stall_s or 1.0) / 5))
        while self._alive.is_set():
            time.sleep(period)
            if self._alive.is_set() and self._watch.stalled():
                log.warning(
                    "engine hung: no token and no finished request for %gs with %d "
                    "request(s) in flight; killing it and continuing on a fresh engine",
                    self._watch.stall_s,
                    self._in_flight,
                )
                self.stalled = True
                self.kill()
                return

    def _generated_tokens(self) -> int | None:
        """vLLM's generated-token counter (client side, updated by each step)."""
        try:
            found = [m.value for m in self._llm.get_metrics() if m.name == "vllm:generation_tokens"]
        except Exception:  # closed, or no stat loggers: fall back to steps
            return None
        return int(sum(found)) if found else None

    def reset_peaks(self) -> None:
        """Forget the peaks seen so far (the engine is lent to another run)."""
        self._peaks.reset()

    def _add(self, engine: Any, request: EngineRequest, params: Any) -> EngineResult | None:
        """Queue one request; vLLM's own input checks failing is that record's error."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=list(request.token_ids))
        # Newer vLLM renders prompts before LLMEngine.add_request (raw ones are deprecated);
        # LLM.generate does the same through this method.
        render = getattr(self._llm, "_preprocess_cmpl_one", None)
        lora = self._loras.get(request.adapter) if request.adapter is not None else None
        if request.adapter is not None and lora is None:
            error = f"adapter {request.adapter!r} is not loaded on this engine"
            return EngineResult(request.key, error=error, prompt_tokens=len(request.token_ids))
        try:
            rendered = render(prompt) if render else prompt
            engine.add_request(str(request.key), rendered, params, lora_request=lora)
        except (VLLMClientError, ValueError, TypeError) as exc:
            return EngineResult(request.key, error=str(exc), prompt_tokens=len(request.token_ids))
        return None

    def stats(self) -> EngineStats:
        stats = EngineStats()
        for metric in self._llm.get_metrics():
            if metric.name in _COUNTERS:
                name = _COUNTERS[metric.name]
                setattr(stats, name, getattr(stats, name) + int(metric.value))
            elif metric.name in _HISTOGRAM_SUMS:
                name = _HISTOGRAM_SUMS[metric.name]
                setattr(stats, name, getattr(stats, name) + float(metric.sum))
            elif metric.name in _HISTOGRAM_COUNTS:
                name = _HISTOGRAM_COUNTS[metric.name]
                setattr(stats, name, getattr(stats, name) + int(metric.count))
        stats.peak_kv_cache_usage = round(self._peaks.kv_cache_usage, 4)
        stats.peak_running, stats.peak_waiting = self._peaks.running, self._peaks.waiting
        stats.engine_steps = self._peaks.steps or stats.engine_steps  # every step, not
        # only those with an answer (vLLM's per-iteration histogram)
        return stats

    def close(self) -> None:
        """End the engine's processes, then let vLLM close its own side.

        Every answer is committed before a close, so nothing in the engine is worth
        waiting for, and vLLM's graceful shutdown costs 3-5 s a close on CPU hosts: its
        worker collects garbage and frees its KV cache, and the front end kills the
        core after 5 s anyway. vLLM's shutdown then finds the processes gone (and reaps
        them), so a GPU is free when this returns.
        """
        self._alive.clear()
        llm, self._llm = self._llm, None
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        self._ended.kill(_engine_pids(llm) if llm is not None else [])
        if shutdown:
            shutdown()
        self._ended.wait_and_clean()  # the processes gone (the GPU free), /dev/shm clean


def _reasoning_markers(llm: Any) -> Any:
    """The thinking markers of the reasoning parser the engine was started with
    (``reasoning_parser``, from model.reasoning), or None."""
    config = getattr(llm.llm_engine.vllm_config, "reasoning_config", None)
    parser = getattr(config, "reasoning_parser", "") if config is not None else ""
    if not parser:
        return None
    from nightshift.engines.reasoning import markers_for

    return markers_for(parser, llm.get_tokenizer())


def _lora_requests(adapters: dict[str, str]) -> dict[str, Any]:
    """One ``LoRARequest`` per adapter name, numbered from 1 (0 is the base model)."""
    if not adapters:
        return {}
    from vllm.lora.request import LoRARequest

    return {name: LoRARequest(name, i, path) for i, (name, path) in enumerate(adapters.items(), 1)}


def _engine_pids(llm: Any) -> list[int]:
    """The engine-core processes of ``llm`` (vLLM's engine manager knows them); never
    another child of this process, such as Prefect's temporary server."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    return [p.pid for p in getattr(manager, "processes", None) or [] if p.pid]


def _wake_reader_when_engine_dies(llm: Any, alive: threading.Event) -> None:
    """vLLM's synchronous client waits on its output queue forever if the engine process
    dies: its monitor thread marks the engine dead but never wakes that reader (the
    async client does). Watch the same flag and put the error in the queue, so a dead
    engine becomes an EngineDeadError, and a retried shard, instead of a silent hang."""
    core = getattr(llm.llm_engine, "engine_core", None)
    resources = getattr(core, "resources", None)
    queue = getattr(core, "outputs_queue", None)
    if resources is None or queue is None or not hasattr(resources, "engine_dead"):
        return

    def watch() -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        while alive.is_set():  # cleared by close(): a planned shutdown is not a death
            if resources.engine_dead:
                queue.put_nowait(EngineDeadError())
                return
            time.sleep(0.5)

    threading.Thread(target=watch, name="nightshift-engine-watch", daemon=True).start()


def _start_llm(args: dict[str, Any]) -> Any:
    from vllm import LLM

    engine_cores_die_with_this_process()  # no EngineCore outlives a CLI killed alone
    try:
        return LLM(**args)
    except TimeoutError as exc:  # an OSError: vLLM's engine-ready wait ran out
        if start_was_killed():
            raise EngineFatalError("the vLLM engine was killed while it started") from exc
        raise EngineStartupTimeout(
            f"the vLLM engine was not ready within {os.environ.get(READY_TIMEOUT, 600)} s "
            "(weights, compilation, CUDA graphs): raise run.startup_timeout_s, or set "
            "enforce_eager: true under engine.extra for a shorter start"
        ) from exc
    except (ValueError, TypeError, RuntimeError, NotImplementedError, OSError) as exc:
        if start_was_killed():  # abandoned by a stop: its cores were killed on purpose
            raise EngineFatalError("the vLLM engine was killed while it started") from exc
        raise EngineError(f"vLLM could not start: {one_line(exc)}") from exc
