"""A node-local cache of fetched models, shared by the fetch containers of one namespace's pods on a node.

The operator mounts one directory per namespace (``<nodeCachePath>/<namespace>``) writable, and the whole
cache read-only beside it for the node-wide cap (:meth:`NodeCache._cap`). Layout under a namespace's
directory::

    entries/<key>/meta.json    a complete entry: what it is, its size, its sha256; mtime = last use
    entries/<key>/data/...     the files (read-only)
    locks/<key>.lock           flock: shared while an entry is read, exclusive while it is filled/evicted
    tmp/<key>.<pid>.<rand>/    an entry being filled (reserve.json: its size); renamed into entries/
    evict.lock                 flock: one eviction/reservation at a time

``key`` is the sha256 of the object's identity: the endpoint, bucket and key, and each object's relative
path, size, ETag and version ID, as the store lists them. A changed object has another key; an entry is
never updated in place. An entry exists only complete (``rename`` of a finished directory); a fetch that
fails leaves no entry. Lock files are never removed (removing one would let two processes lock two files).

Concurrency: a reader takes the key's lock shared (it waits while another pod fills the entry), and uses
the entry if it is complete. Otherwise it takes the lock exclusive, looks again (the other pod may have
filled it) and fills it. Eviction (least recently used first, until the entries and the reservations of
fills in progress fit under the cap) takes an entry's lock exclusive without waiting: an entry in use or
being filled is never evicted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fetch_errors import DownloadTimeout, FetchError

log = logging.getLogger("modelserver.fetch")

META = "meta.json"
DATA = "data"


def lock_fd(path: Path, mode: int, deadline: float, what: str, log_every: float = 5.0) -> int:
    """Open ``path`` and flock it (``LOCK_SH``/``LOCK_EX``), polling until ``deadline`` (monotonic). While it
    waits it says so in the log (once at first, then every ``log_every`` seconds), so that a pod waiting on
    another pod's download is not silent."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    delay = 0.02
    started = time.monotonic()
    next_log = started
    try:
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                if next_log > started:
                    waited = round(time.monotonic() - started, 2)
                    extra = {"event": "cache_waited", "seconds": waited}
                    log.info(f"waited {waited}s for {what}", extra=extra)
                return fd
            except BlockingIOError:
                now = time.monotonic()
                if now >= deadline:
                    raise DownloadTimeout(f"timed out waiting for {what}") from None
                if now >= next_log:
                    waited = round(now - started, 1)
                    log.info(
                        f"waiting for {what} ({waited}s so far, {max(0.0, deadline - now):.0f}s left)",
                        extra={"event": "cache_wait", "seconds": waited},
                    )
                    next_log = now + log_every
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 1.5, 0.5)
    except BaseException:
        os.close(fd)
        raise


def try_lock(path: Path, mode: int = fcntl.LOCK_EX) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def rmtree(path: Path) -> None:
    """Remove a tree, read-only files and directories included."""

    def onerror(func: Any, p: str, exc_info: Any) -> None:
        if isinstance(exc_info[1], FileNotFoundError):
            return
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o755)
            os.chmod(p, 0o755)
        func(p)

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, onerror=onerror)  # onexc is 3.12+


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass
class Entry:
    key: str
    path: Path

    @property
    def data(self) -> Path:
        return self.path / DATA

    def meta(self) -> dict[str, Any]:
        return json.loads((self.path / META).read_text())

    def update_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.path / f".{META}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.path / META)

    def complete(self) -> bool:
        return (self.path / META).is_file() and self.data.is_dir()


class NodeCache:
    """One namespace's cache (``root``, capped at ``max_bytes``). With ``node_root`` (every namespace's
    directory, read here and never written) and ``node_max_bytes``, a fill also keeps the whole node under
    that cap -- by evicting this namespace's entries only: another tenant's are never touched."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        node_root: Path | None = None,
        node_max_bytes: int = 0,
        namespace: str = "",
    ) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.node_root = node_root
        self.node_max_bytes = node_max_bytes
        self.namespace = namespace
        self.entries = root / "entries"
        self.locks = root / "locks"
        self.tmp = root / "tmp"
        try:
            for d in (root, self.entries, self.locks, self.tmp):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FetchError(f"cannot use the cache directory {root}: {e.strerror or e}") from e

    def entry(self, key: str) -> Entry:
        return Entry(key, self.entries / key)

    def lock_path(self, key: str) -> Path:
        return self.locks / f"{key}.lock"

    def drop(self, key: str) -> None:
        """Remove the entry (a corrupt one). Call with the key's lock held exclusive."""
        target = self.entries / key
        if target.exists():
            trash = self.tmp / f"evict.{key}.{uuid.uuid4().hex[:8]}"
            os.rename(target, trash)
            rmtree(trash)
            log.info("cache drop", extra={"event": "cache_drop", "key": key})

    def touch(self, key: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self.entries / key / META)

    # -- reading ------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def shared(self, key: str, deadline: float) -> Iterator[Entry | None]:
        """The complete entry under a shared lock (waits for a fill in progress), or None."""
        fd = lock_fd(self.lock_path(key), fcntl.LOCK_SH, deadline, "another fetch of the same model")
        try:
            e = self.entry(key)
            yield e if e.complete() else None
        finally:
            unlock(fd)

    @contextlib.contextmanager
    def exclusive(self, key: str, deadline: float) -> Iterator[Entry | None]:
        """The key's lock exclusive: the complete entry (another fetch filled it meanwhile) or None, in which
        case the caller fills it with :meth:`reserve` and :meth:`commit`."""
        fd = lock_fd(self.lock_path(key), fcntl.LOCK_EX, deadline, "another fetch of the same model")
        try:
            # what a killed filler of this key left: nobody else can be filling it now
            for stale in self.tmp.glob(f"{key}.*"):
                rmtree(stale)
            e = self.entry(key)
            yield e if e.complete() else None
        finally:
            unlock(fd)

    # -- filling ------------------------------------------------------------------------------------------
    def reserve(self, key: str, size: int, deadline: float) -> Path | None:
        """Make room for ``size`` bytes (evicting least recently used entries) and return a staging directory
        for the entry, or None when it cannot fit (larger than the cap, or the rest is in use). Call with
        the key's lock held exclusive."""
        fd = lock_fd(self.root / "evict.lock", fcntl.LOCK_EX, deadline, "the cache's eviction lock")
        try:
            cap, why = self._cap()
            if size > cap:
                log.info(
                    f"not cached: larger than {why}",
                    extra={"event": "cache_skip", "key": key, "bytes": size, "cache_max_bytes": cap},
                )
                return None
            used = self._usage(exclude=key)
            if used + size > cap:
                used = self._evict(used + size - cap, used, protect=key)
            if used + size > cap:
                log.info(
                    "not cached: the cache is full of entries in use",
                    extra={"event": "cache_skip", "key": key, "bytes": size, "used_bytes": used},
                )
                return None
            staging = self.tmp / f"{key}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
            staging.mkdir(mode=0o755)
            (staging / "reserve.json").write_text(json.dumps({"bytes": size}))
            return staging
        finally:
            unlock(fd)

    def commit(self, key: str, staging: Path, meta: dict[str, Any]) -> Entry:
        """Mark the staged entry complete: files read-only, meta written, one ``rename``."""
        data = staging / DATA
        for p in sorted(data.rglob("*"), reverse=True):
            if p.is_file():
                os.chmod(p, 0o444)
            elif p.is_dir():
                os.chmod(p, 0o755)
        os.chmod(data, 0o755)
        (staging / "reserve.json").unlink(missing_ok=True)
        tmp_meta = staging / (META + ".tmp")
        tmp_meta.write_text(json.dumps({"key": key, "created": time.time(), **meta}, indent=1))
        os.replace(tmp_meta, staging / META)
        target = self.entries / key
        if target.exists():  # a leftover without our lock cannot be complete; replace it
            rmtree(target)
        os.rename(staging, target)
        log.info("cache stored", extra={"event": "cache_store", "key": key, "bytes": meta.get("bytes")})
        return self.entry(key)

    def discard(self, staging: Path | None) -> None:
        if staging is not None:
            rmtree(staging)

    # -- size ---------------------------------------------------------------------------------------------
    def _cap(self) -> tuple[int, str]:
        """What this namespace may hold now: its own cap, or less when the other namespaces' entries leave
        less of the node's cap (what they hold is theirs: never evicted from here)."""
        if self.node_root is None or not self.node_max_bytes:
            return self.max_bytes, "the cache's cap"
        left = self.node_max_bytes - self._others_usage()
        if left < self.max_bytes:
            return max(0, left), "what the node's cap leaves beside other namespaces' entries"
        return self.max_bytes, "the cache's cap"

    def _others_usage(self) -> int:
        """Bytes of the complete entries and reservations of the node's other namespaces (read-only)."""
        used = 0
        assert self.node_root is not None
        with contextlib.suppress(OSError):
            for ns in self.node_root.iterdir():
                if ns.name == self.namespace:
                    continue
                for meta in [*ns.glob(f"entries/*/{META}"), *ns.glob("tmp/*/reserve.json")]:
                    with contextlib.suppress(OSError, ValueError):
                        used += int(json.loads(meta.read_text()).get("bytes", 0))
        return used

    def _usage(self, exclude: str = "") -> int:
        used = 0
        for e in self.entries.iterdir():
            try:
                used += int(json.loads((e / META).read_text()).get("bytes", 0))
            except (OSError, ValueError):
                continue  # not complete: a leftover, removed by its key's next filler
        for s in self.tmp.iterdir():
            if s.name.startswith(f"{exclude}."):
                continue
            key = s.name.split(".", 1)[0]
            fd = try_lock(self.lock_path(key)) if (s / "reserve.json").exists() else None
            if fd is not None:  # its filler is gone
                try:
                    rmtree(s)
                finally:
                    unlock(fd)
                continue
            if key == "evict" or not (s / "reserve.json").exists():
                if key == "evict":
                    rmtree(s)  # an eviction's leftover (we hold the eviction lock)
                continue
            with contextlib.suppress(OSError, ValueError):
                used += int(json.loads((s / "reserve.json").read_text()).get("bytes", 0))
        return used

    def _evict(self, need: int, used: int, protect: str) -> int:
        """Evict least recently used entries not in use until ``need`` bytes are freed; the new usage."""
        candidates = []
        for e in self.entries.iterdir():
            if e.name == protect:
                continue
            try:
                st = (e / META).stat()
                size = int(json.loads((e / META).read_text()).get("bytes", 0))
            except (OSError, ValueError):
                continue
            candidates.append((st.st_mtime, e.name, size))
        candidates.sort()
        freed = 0
        for mtime, key, size in candidates:
            if freed >= need:
                break
            fd = try_lock(self.lock_path(key))
            if fd is None:
                log.info("cache entry in use: not evicted", extra={"event": "cache_busy", "key": key})
                continue
            try:
                src = self.entries / key
                trash = self.tmp / f"evict.{key}.{uuid.uuid4().hex[:8]}"
                try:
                    os.rename(src, trash)
                except OSError as e:
                    if e.errno == errno.ENOENT:
                        continue
                    raise
                rmtree(trash)
            finally:
                unlock(fd)
            freed += size
            log.info(
                "cache evict",
                extra={"event": "cache_evict", "key": key, "bytes": size, "last_used": round(mtime, 3)},
            )
        return used - freed
