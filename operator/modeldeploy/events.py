"""Posting core/v1 Events: at once (tests, tools) or from a thread of their own (the operator).

A reconcile that creates a ModelDeployment's four children used to wait for four Event POSTs as well, a
third of its time in ``make bench-operator`` (py-spy: 155 of 489 samples in ``Reconciler.event``). client-go
posts events the same way: its EventBroadcaster hands them to a goroutine through a bounded channel and
drops them when that is full. Events stay best effort either way: a failed or dropped post is counted and
logged, it never fails a reconcile.

Repeats are aggregated as client-go's EventCorrelator does: an event equal to one posted before (same
object, type, reason, message and source) PATCHes that Event's ``count`` and ``lastTimestamp`` instead of
creating another object, so a ModelDeployment whose reconcile fails on every retry has one
``ReconcileError`` Event with a growing count, not one per retry. The correlator remembers the last
:data:`CORRELATOR_SIZE` distinct events (client-go: 4096); one the apiserver has expired meanwhile (its
Event TTL, 1 h by default) is created anew.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from typing import Any, Protocol

from . import metrics
from .kube import EVENT, KubeError

log = logging.getLogger(__name__)


CORRELATOR_SIZE = 4096


class Creates(Protocol):
    def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...

    def merge_patch(
        self, rt: Any, namespace: str | None, name: str, patch: dict[str, Any], sub: str | None = None
    ) -> dict[str, Any]: ...


class Correlator:
    """The Events posted, by what makes two of them the same: their name and count (an LRU)."""

    def __init__(self, size: int = CORRELATOR_SIZE) -> None:
        self.size = size
        self._seen: OrderedDict[tuple[Any, ...], tuple[str, int]] = OrderedDict()

    @staticmethod
    def key(event: dict[str, Any]) -> tuple[Any, ...]:
        obj = event.get("involvedObject") or {}
        source = (event.get("source") or {}).get("component")
        return (
            event.get("metadata", {}).get("namespace"),
            obj.get("kind"),
            obj.get("name"),
            obj.get("uid"),
            event.get("type"),
            event.get("reason"),
            event.get("message"),
            source,
        )

    def seen(self, key: tuple[Any, ...]) -> tuple[str, int] | None:
        hit = self._seen.get(key)
        if hit is not None:
            self._seen.move_to_end(key)
        return hit

    def record(self, key: tuple[Any, ...], name: str, count: int) -> None:
        self._seen[key] = (name, count)
        self._seen.move_to_end(key)
        while len(self._seen) > self.size:
            self._seen.popitem(last=False)


class EventSink(Protocol):
    def post(self, event: dict[str, Any]) -> None: ...


class PostNow:
    """Post each event before returning."""

    def __init__(self, kube: Creates) -> None:
        self.kube = kube
        self.correlator = Correlator()

    def post(self, event: dict[str, Any]) -> None:
        _post(self.kube, event, self.correlator)


class PostInBackground:
    """Post events in order from one daemon thread, through a queue of at most ``capacity`` events; an
    event that finds the queue full is dropped (``modeldeploy_events_dropped_total``)."""

    def __init__(self, kube: Creates, capacity: int = 1000) -> None:
        self.kube = kube
        self.correlator = Correlator()  # used by the posting thread only
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
            _post(self.kube, event, self.correlator)


def _post(kube: Creates, event: dict[str, Any], correlator: Correlator) -> None:
    key = correlator.key(event)
    try:
        seen = correlator.seen(key)
        if seen is not None and _count_again(kube, event, seen, correlator, key):
            return
        answer = kube.create(event)
        name = (answer.get("metadata") or {}).get("name")
        if name:
            correlator.record(key, name, int(answer.get("count") or 1))
    except Exception as e:  # events are best effort
        metrics.EVENTS_FAILED.inc()
        log.debug("could not post event: %s", e)


def _count_again(
    kube: Creates, event: dict[str, Any], seen: tuple[str, int], correlator: Correlator, key: tuple[Any, ...]
) -> bool:
    """The repeat of a posted event: its count and last time PATCHed in; False when that Event is gone."""
    name, count = seen
    patch = {"count": count + 1, "lastTimestamp": event.get("lastTimestamp")}
    try:
        kube.merge_patch(EVENT, event.get("metadata", {}).get("namespace"), name, patch)
    except KubeError as e:
        if e.status == 404:  # expired (the Event TTL) or deleted: post it anew
            return False
        raise
    correlator.record(key, name, count + 1)
    return True
