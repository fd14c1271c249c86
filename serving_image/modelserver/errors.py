"""Errors that map to HTTP statuses. The batching core's errors live in :mod:`modelserver.batching_errors`."""

from __future__ import annotations


class ServerError(Exception):
    """An error with an HTTP status; the message is sent to the client as ``{"error": message}``."""

    status = 500
    reason = "error"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class InvalidInput(ServerError):
    status = 400
    reason = "invalid"


class NotFound(ServerError):
    status = 404
    reason = "not_found"


class PayloadTooLarge(ServerError):
    status = 413
    reason = "too_large"


class UnsupportedEncoding(ServerError):
    status = 415
    reason = "encoding"


class Overloaded(ServerError):
    """More infer requests in flight than ``max_concurrent_requests``: 503 with ``Retry-After``."""

    status = 503
    reason = "overloaded"


class NotReady(ServerError):
    status = 503
    reason = "not_ready"


class ModelLoadError(Exception):
    """The model could not be fetched, verified or loaded (the server exits non-zero)."""
