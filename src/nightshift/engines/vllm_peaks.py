"""The peaks of a running vLLM engine: its largest batch, queue and KV-cache usage."""

from __future__ import annotations

from typing import Any


class PeakRecorder:
    """The largest batch, queue and KV-cache usage the scheduler reported, step by step.

    vLLM's gauges hold only the latest step's value, so this joins the engine's stat
    loggers (``StatLoggerManager.stat_loggers``; ``LLM`` takes no custom loggers) and
    keeps the maxima; reading the metrics every step instead would walk Prometheus's
    registry once a step. Where vLLM has no such list, the peaks stay 0 (unknown).
    """

    def __init__(self) -> None:
        self.reset()

    @classmethod
    def attach(cls, llm: Any) -> PeakRecorder:
        recorder = cls()
        manager = getattr(getattr(llm, "llm_engine", None), "logger_manager", None)
        loggers = getattr(manager, "stat_loggers", None)
        if isinstance(loggers, list):
            loggers.append(recorder)
        return recorder

    def reset(self) -> None:
        self.running, self.waiting, self.kv_cache_usage, self.steps = 0, 0, 0.0, 0

    def record(self, scheduler_stats: Any, iteration_stats: Any, **_: Any) -> None:
        if scheduler_stats is None:
            return
        # counted after the step: its finished requests were in its batch too (a
        # one-token classify finishes every request in the step that prefilled it)
        finished = len(getattr(iteration_stats, "finished_requests", None) or ())
        self.steps += 1
        self.running = max(self.running, scheduler_stats.num_running_reqs + finished)
        self.waiting = max(self.waiting, scheduler_stats.num_waiting_reqs)
        self.kv_cache_usage = max(self.kv_cache_usage, scheduler_stats.kv_cache_usage)

    def record_sleep_state(self, *_: Any, **__: Any) -> None:
        pass

    def log(self) -> None:
        pass

    def log_engine_initialized(self) -> None:
        pass
