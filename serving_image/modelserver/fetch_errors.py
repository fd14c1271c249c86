"""The typed failures of ``python -m modelserver.fetch`` and the redaction of secrets from its output.

Each failure has a ``reason`` (one word, the first token of the termination message: the operator turns
it into the ``ModelAvailable=False`` condition's reason) and an exit code. The one-line termination
message is ``<reason>: <message>``.

=================  ====  =========================================================================
reason             exit  when
=================  ====  =========================================================================
FetchFailed        1     anything else (a store error after retries, TLS, a local write error)
InvalidURI         2     the URI or an option is not usable (not ``s3://bucket[/prefix]``, ...)
AccessDenied       3     the store refused the credentials or the request (HTTP 401/403)
NotFound           4     no such bucket, and no object at the key nor under ``key/``
ChecksumMismatch   5     ``--sha256`` or the store's checksum (ETag MD5) does not match the bytes
DownloadTimeout    6     the endpoint was unreachable or silent, or the whole fetch passed ``--timeout``
TooLarge           7     the listed size is over ``--max-bytes``, or over the free space of the target
=================  ====  =========================================================================
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

#: the environment variables whose values never appear in any output
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
#: a termination message is at most 4096 bytes (the kubelet's cap); one line is plenty
MAX_LINE = 1024


class FetchError(Exception):
    reason = "FetchFailed"
    exit_code = 1

    def line(self) -> str:
        """The termination message: one line, ``<reason>: <message>``, secrets redacted."""
        text = " ".join(redact(str(self)).split())
        return f"{self.reason}: {text}"[:MAX_LINE]


class InvalidURI(FetchError):
    reason = "InvalidURI"
    exit_code = 2


class AccessDenied(FetchError):
    reason = "AccessDenied"
    exit_code = 3


class NotFound(FetchError):
    reason = "NotFound"
    exit_code = 4


class ChecksumMismatch(FetchError):
    reason = "ChecksumMismatch"
    exit_code = 5


class DownloadTimeout(FetchError):
    reason = "DownloadTimeout"
    exit_code = 6


class TooLarge(FetchError):
    reason = "TooLarge"
    exit_code = 7


REASONS = {
    c.reason: c
    for c in (FetchError, InvalidURI, AccessDenied, NotFound, ChecksumMismatch, DownloadTimeout, TooLarge)
}

_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
#: what a signed URL or an Authorization header would carry
_SIGNATURE = re.compile(
    r"(?i)(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|AWSAccessKeyId|Credential)"
    r"(=|\s*:\s*)[^&\s,\"']+"
)


def secrets(environ: Mapping[str, str] | None = None, extra: Iterable[str] = ()) -> list[str]:
    env = os.environ if environ is None else environ
    values = [env.get(k, "") for k in SECRET_ENV] + list(extra)
    # longest first, so a value containing another is replaced whole
    return sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` without the credentials of the environment, URL user-info or request signatures."""
    for value in secrets(environ):
        text = text.replace(value, "***")
    text = _USERINFO.sub(r"\g<scheme>***@", text)
    return _SIGNATURE.sub(r"\1\2***", text)
