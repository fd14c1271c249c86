"""The fetch's progress: bytes done of the total, logged every few seconds as an event."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

log = logging.getLogger("modelserver.fetch")


class Progress:
    """Bytes done of a total, logged every ``interval`` seconds: bytes, rate, ETA."""

    def __init__(self, total: int, interval: float = 5.0, what: str = "") -> None:
        self.total = total
        self.interval = interval
        self.what = what
        self.done = 0
        self.start = time.monotonic()
        self._last = self.start
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n

    def snapshot(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.start, 1e-6)
        done = max(self.done, 0)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else None
        return {
            "bytes": done,
            "total_bytes": self.total,
            "percent": round(100.0 * done / self.total, 1) if self.total else 100.0,
            "rate_bytes_per_s": round(rate),
            "eta_s": round(eta, 1) if eta is not None else None,
            "elapsed_s": round(elapsed, 2),
        }

    def maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        s = self.snapshot()
        eta = f"{s['eta_s']:.0f}s" if s["eta_s"] is not None else "?"
        log.info(
            f"progress {human(s['bytes'])} / {human(s['total_bytes'])} ({s['percent']}%), "
            f"{human(s['rate_bytes_per_s'])}/s, ETA {eta}",
            extra={"event": "progress", **s},
        )


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover
