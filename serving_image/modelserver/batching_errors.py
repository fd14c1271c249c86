"""Why the batching core refuses or fails an item (each maps to an HTTP answer in app.py)."""

from __future__ import annotations


class BatchingError(Exception):
    """A request the queue refuses or cannot finish. ``status`` is the HTTP status the server maps it to."""

    status = 503
    reason = "error"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(BatchingError):
    status = 503
    reason = "queue_full"


class DeadlineUnmeetable(BatchingError):
    status = 429
    reason = "deadline"


class DeadlineExpired(BatchingError):
    status = 504
    reason = "timeout"


class Draining(BatchingError):
    status = 503
    reason = "draining"


class InputTooLong(BatchingError):
    status = 413
    reason = "too_long"


class ItemFailed(BatchingError):
    """The model failed on this item even when it ran alone."""

    status = 500
    reason = "model_error"


class OutOfMemory(ItemFailed):
    status = 503
    reason = "oom"


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "OutOfMemory"):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()
