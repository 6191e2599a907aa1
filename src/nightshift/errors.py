"""Every exception nightshift raises on purpose, in one place.

The split that matters to a user: a ``UserError`` is something they can fix (a bad
spec, a missing file) and is shown as one clear message with exit code 2, never a
traceback. A ``RecordError`` concerns one record and is kept in the output with its
reason while the job goes on. An ``EngineFatalError`` means the engine itself is gone
and the work it held has to be retried on a fresh engine.
"""

from __future__ import annotations


class NightshiftError(Exception):
    """Base of every error nightshift raises on purpose."""


class UserError(NightshiftError):
    """A mistake the user can fix; reported without a traceback, exit code 2."""

    exit_code = 2


class SpecError(UserError):
    """The job spec is invalid. ``key`` is the dotted path of the offending key."""

    def __init__(self, key: str, problem: str, fix: str = "") -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        message = f"{key}: {problem}" if key else problem
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class SpecErrors(UserError):
    """Several spec problems found at once, reported together."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        if len(errors) == 1:  # one problem: one line, as every other user error
            super().__init__(str(errors[0]))
            return
        lines = "\n".join(f"  - {e}" for e in errors)
        super().__init__(f"invalid job spec:\n{lines}")


class InputError(UserError):
    """The input data cannot be read as the spec describes it."""


class OutputExistsError(UserError):
    """The output location already holds a finished run."""


class CanaryFailedError(UserError):
    """The canary's sample agreed with the reference less than ``run.canary.min_agreement``:
    the full run did not start (exit code 2). The sample's answers are kept."""


class CanaryPendingError(UserError):
    """A worker found no canary kept for its job in time: it claimed no shard (exit 2)."""


class RecordError(NightshiftError):
    """One record cannot be processed; it is set aside with this reason.

    ``kind`` is a short stable code (``over_length``, ``null_field``...) that reports
    group by; the message says what exactly was wrong with this record.
    """

    def __init__(self, message: str, kind: str = "invalid") -> None:
        self.kind = kind
        super().__init__(message)


class JobAbortedError(NightshiftError):
    """The job stopped itself: going on would spend the rest of it failing the same way."""


class EngineError(NightshiftError):
    """The engine could not be built or failed while running."""


class EngineFatalError(EngineError):
    """The engine died; the work in flight must be retried on a fresh engine."""


class EngineStalledError(EngineFatalError):
    """The engine made no progress for ``run.stall_s`` with requests in flight and was
    killed with its process tree; its shards continue on a fresh engine (an attempt)."""


class StoreError(NightshiftError):
    """The object store (local directory or S3) failed after its retries."""


class StoreAccessError(StoreError, UserError):
    """The store refused us: missing bucket, bad credentials, no permission. Fixable."""


class ObjectNotFound(StoreError):
    """A key that was expected in the object store is not there."""


class LeaseLostError(NightshiftError):
    """Another worker took over this worker's shard (its lease expired): stop working on
    the shard; what was checkpointed stays, and the new holder continues from it."""


class ShardsFailedError(NightshiftError):
    """Some shards are still failed after all their attempts; rerun to retry them."""


class RunStoppedError(NightshiftError):
    """The run was asked to stop (SIGTERM, Ctrl-C, a Prefect cancellation) before this
    shard committed: its answers are checkpointed, a rerun continues it. Never retried."""

    exit_code = 3  # ``nightshift jobs run`` / ``jobs work`` exit code after a graceful stop


class ShardAttemptFailed(NightshiftError):
    """The engine died under this shard; its checkpoints stay and a retry continues them."""
