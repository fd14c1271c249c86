"""A request body's ``Content-Encoding`` undone with a cap on what it inflates to (issue 24, finding 5).

``gzip.decompress`` inflates a whole body at once: a 64 MiB body of compressed zeros (the largest the
server reads, ``MAX_BODY``) inflates to about 64 GiB and kills the pod. :func:`inflate` inflates in steps
of :data:`STEP` bytes and refuses with 413 (``PayloadTooLarge``) as soon as the output passes ``limit``,
so what is held is bounded by ``limit``, a step and the body (its unconsumed tail), not by what the
body would inflate to; the server calls it off the event loop, on one thread of its own (so however
many compressed bodies arrive at once, one inflated buffer is held), and a large legitimate body does not
stall other requests either.

gzip bodies may hold several members (``gzip.decompress`` accepts them, and so does this); ``deflate``
is the zlib-wrapped stream of RFC 9110. A truncated or corrupt stream is a 400 (``InvalidInput``).
"""

from __future__ import annotations

import zlib

from .errors import InvalidInput, PayloadTooLarge

#: bytes of output per inflate step: the most held beyond ``limit`` before a refusal
STEP = 1 << 20
ENCODINGS = ("gzip", "deflate")


def _decompressor(encoding: str) -> zlib._Decompress:
    return zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded from ``encoding`` (``gzip`` or ``deflate``); PayloadTooLarge past ``limit`` bytes
    of output, InvalidInput for a stream that is corrupt or cut short."""
    if encoding not in ENCODINGS:
        raise ValueError(f"not an encoding inflate knows: {encoding!r}")
    out: list[bytes] = []
    size = 0
    d, data = _decompressor(encoding), body
    try:
        while True:
            chunk = d.decompress(data, STEP)
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"{encoding} request body inflates to more than {limit} bytes")
            out.append(chunk)
            data = d.unconsumed_tail
            if d.eof:
                if encoding == "gzip" and d.unused_data.strip(b"\0"):  # another gzip member follows
                    d, data = _decompressor(encoding), d.unused_data
                    continue
                break
            if not data and not chunk:
                raise InvalidInput(f"cannot decode {encoding} body: the stream is cut short")
    except zlib.error as e:
        raise InvalidInput(f"cannot decode {encoding} body: {e}") from None
    return b"".join(out)
