"""Checks while an object streams: GetObject bodies hashed as they are read (botocore event hooks), the
ranges' digests kept to be combined into the store's flexible checksum or compared part by part."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from typing import Any

from .store_checksums import (
    StoreChecksum,
    from_response,
    new_hasher,
    part_digests,
)


class _HashingBody:
    """A GetObject body that hashes what is read through it and reports the digest when the stream ends."""

    def __init__(self, body: Any, algorithm: str, done: Callable[[bytes, int], None]) -> None:
        self._body = body
        self._hash = new_hasher(algorithm)
        self._n = 0
        self._done = done
        self._reported = False

    def read(self, amt: int | None = None) -> bytes:
        data = self._body.read(amt)
        if data:
            self._hash.update(data)
            self._n += len(data)
        elif not self._reported:
            self._reported = True
            self._done(self._hash.digest(), self._n)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class StreamHashes:
    """The digest of every GetObject body (or range) as it streams, keyed by (bucket, key) and range start:
    the store's checksum is checked without reading the files again. MD5 (for the ETag) unless
    :meth:`use` names a flexible checksum algorithm for the object; a whole-object GET's flexible checksum
    header is kept too."""

    _CTX = "modeldeploy_fetch_get"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: dict[tuple[str, str], dict[int, tuple[bytes, int]]] = {}
        self._algorithm: dict[tuple[str, str], str] = {}
        self._values: dict[tuple[str, str], StoreChecksum] = {}

    def install(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.s3.GetObject", self._before)
        client.meta.events.register("after-call.s3.GetObject", self._after)

    def uninstall(self, client: Any) -> None:
        client.meta.events.unregister("before-parameter-build.s3.GetObject", self._before)
        client.meta.events.unregister("after-call.s3.GetObject", self._after)

    def use(self, bucket: str, key: str, algorithm: str) -> None:
        self._algorithm[(bucket, key)] = algorithm

    def _before(self, params: dict[str, Any], context: dict[str, Any], **kw: Any) -> None:
        context[self._CTX] = (params.get("Bucket"), params.get("Key"), params.get("Range"))

    def _after(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **kw: Any) -> None:
        info = context.get(self._CTX)
        if not info or "Body" not in parsed or getattr(http_response, "status_code", 200) >= 300:
            return
        bucket, key, rng = info
        m = re.match(r"bytes=(\d+)-", rng or "")
        start = int(m.group(1)) if m else 0
        algorithm = self._algorithm.get((bucket, key), "MD5")
        if rng is None and algorithm != "MD5":
            value = from_response(parsed, algorithm)
            if value is not None:
                with self._lock:
                    self._values[(bucket, key)] = value

        def done(digest: bytes, n: int) -> None:
            with self._lock:
                self._parts.setdefault((bucket, key), {})[start] = (digest, n)

        parsed["Body"] = _HashingBody(parsed["Body"], algorithm, done)

    def ranges(self, bucket: str, key: str) -> dict[int, tuple[bytes, int]]:
        """Each completed GET of the object: range start -> (digest, bytes)."""
        with self._lock:
            return dict(self._parts.get((bucket, key), {}))

    def value(self, bucket: str, key: str) -> StoreChecksum | None:
        """The flexible checksum a whole-object GET of the object answered with."""
        with self._lock:
            return self._values.get((bucket, key))

    def etag_of(self, bucket: str, key: str, part_sizes: list[int] | None) -> str | None:
        """The ETag the streamed bytes make: their MD5 (one GET, ``part_sizes`` None), or the MD5 of the
        parts' MD5s + ``-N`` when each part came in one ranged GET; None otherwise."""
        got = self.ranges(bucket, key)
        if part_sizes is None:
            return got[0][0].hex() if 0 in got and len(got) == 1 else None
        digests = part_digests(got, part_sizes)
        if digests is None:
            return None
        return hashlib.md5(b"".join(digests), usedforsecurity=False).hexdigest() + f"-{len(part_sizes)}"
