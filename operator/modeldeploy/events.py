"""Posting core/v1 Events: at once (tests, tools) or from a thread of their own (the operator).

A reconcile that creates a ModelDeployment's four children used to wait for four Event POSTs as well, a
third of its time in ``make bench-operator`` (py-spy: 155 of 489 samples in ``Reconciler.event``). client-go
posts events the same way: its EventBroadcaster hands them to a goroutine through a bounded channel and
drops them when that is full. Events stay best effort either way: a failed or dropped post is counted and
logged, it never fails a reconcile.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Protocol

from . import metrics

log = logging.getLogger(__name__)


class Creates(Protocol):
    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...


class EventSink(Protocol):
    def post(self, event: dict[str, Any]) -> None: ...


class PostNow:
    """Post each event before returning."""

    def __init__(self, kube: Creates) -> None:
        self.kube = kube

    def post(self, event: dict[str, Any]) -> None:
        _post(self.kube, event)


class PostInBackground:
    """Post events in order from one daemon thread, through a queue of at most ``capacity`` events; an
    event that finds the queue full is dropped (``modeldeploy_events_dropped_total``)."""

    def __init__(self, kube: Creates, capacity: int = 1000) -> None:
        self.kube = kube
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._run, name="modeldeploy-events", daemon=True)
        self._thread.start()

    def post(self, event: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            metrics.EVENTS_DROPPED.inc()
            reason, message = event.get("reason"), str(event.get("message", ""))[:200]
            log.warning("event queue full: dropped %s %s", reason, message)

    def close(self, timeout: float = 5.0) -> bool:
        """Post what is queued (for at most ``timeout`` seconds) and stop; whether everything was posted."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            _post(self.kube, event)


def _post(kube: Creates, event: dict[str, Any]) -> None:
    try:
        kube.create(event)
    except Exception as e:  # events are best effort
        metrics.EVENTS_FAILED.inc()
        log.debug("could not post event: %s", e)
