"""botocore and s3transfer errors mapped to the fetch's own failure reasons (:mod:`modelserver.fetch_errors`),
with the endpoint and the object named."""

from __future__ import annotations

from .fetch_errors import (
    AccessDenied,
    ChecksumMismatch,
    DownloadTimeout,
    FetchError,
    NotFound,
)

_ACCESS_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "AccountProblem",
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidSecurity",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
    "Forbidden",
    "403",
    "401",
}
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "NoSuchVersion", "NotFound", "404"}


def map_error(exc: BaseException, what: str, endpoint: str = "") -> FetchError:
    """A typed :class:`FetchError` for an exception raised while talking to the store about ``what``."""
    if isinstance(exc, FetchError):
        return exc
    from botocore import exceptions as bx
    from s3transfer.exceptions import RetriesExceededError

    if isinstance(exc, RetriesExceededError) and getattr(exc, "last_exception", None) is not None:
        return map_error(exc.last_exception, what, endpoint)
    if isinstance(exc, bx.ClientError):
        err = exc.response.get("Error", {}) or {}
        code = str(err.get("Code", "") or "")
        status = int((exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode", 0) or 0)
        msg = str(err.get("Message", "") or "").strip()
        detail = f"{code or 'error'} (HTTP {status})" + (f": {msg}" if msg else "")
        if code in _ACCESS_CODES or status in (401, 403):
            return AccessDenied(f"{what}: access denied by {endpoint or 'the store'}: {detail}")
        if code in _NOT_FOUND_CODES or status == 404:
            if code == "NoSuchBucket":
                return NotFound(f"{what}: the bucket does not exist ({detail})")
            return NotFound(f"{what}: not found ({detail})")
        if code in ("PreconditionFailed", "412") or status == 412:
            return FetchError(f"{what}: the object changed during the download ({detail})")
        return FetchError(f"{what}: {detail}")
    if isinstance(exc, bx.FlexibleChecksumError):
        # botocore's own check of a whole-object GET against the store's flexible checksum
        return ChecksumMismatch(f"{what}: the bytes do not match the store's checksum ({exc})")
    if isinstance(exc, bx.SSLError):
        return FetchError(f"{what}: TLS failure talking to {endpoint or 'the store'}: {exc}")
    if isinstance(exc, bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return DownloadTimeout(f"{what}: {endpoint or 'the store'} did not answer in time ({exc})")
    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectionClosedError | bx.HTTPClientError):
        return DownloadTimeout(f"{what}: cannot reach {endpoint or 'the store'} ({exc})")
    if isinstance(exc, bx.PartialCredentialsError):
        return AccessDenied(f"{what}: incomplete credentials ({exc})")
    if isinstance(exc, bx.NoCredentialsError):
        return AccessDenied(f"{what}: no credentials")
    if isinstance(exc, bx.BotoCoreError):
        return FetchError(f"{what}: {type(exc).__name__}: {exc}")
    if isinstance(exc, TimeoutError):
        return DownloadTimeout(f"{what}: {exc or 'timed out'}")
    if isinstance(exc, OSError):
        return FetchError(f"{what}: {exc.strerror or exc} ({getattr(exc, 'filename', '') or ''})")
    return FetchError(f"{what}: {type(exc).__name__}: {exc}")
