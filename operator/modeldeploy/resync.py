"""A periodic LIST of every kind of child, which repairs what the watches missed.

kopf drops an entry of its indices (the :class:`~modeldeploy.childcache.ChildCache`) only on a DELETED watch
event. A child deleted while the watch was broken (a 410 Gone relist, an apiserver restart, a network
partition) would stay in the cache for good: every reconcile would believe it exists and never recreate
it. Every ``period`` seconds the :class:`Resyncer` LISTs each kind of child (label ``modeldeploy.io/name``,
cluster-wide or in each of the operator's namespaces) and hands the answer, with the list's
resourceVersion, to :meth:`ChildCache.resynced`; the ModelDeployments whose view that changed go to
``on_changed`` (the operator enqueues them).

The resync also runs :data:`RELIST_SETTLE` seconds after a watch of children listed its kind again
(:meth:`Resyncer.relisted`, called by the operator for every listed object): kopf relists after a 410
(the watch's resourceVersion was too old, e.g. after an apiserver restart) and at its start, and a
listing only adds to the indices: the resync finds what was deleted while the watch was down, at once
instead of up to a period later. A relist that finds no child at all replays nothing and asks for
nothing: the periodic resync repairs that case.

A LIST that fails is logged, counted (``modeldeploy_resyncs_total{kind,result="error"}``) and tried again
at the next period; nothing raises out of the resync thread. The LISTs are counted in
``modeldeploy_reads_total`` with ``verb="resync"``: a reconcile still LISTs nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from . import metrics
from .builders import LABEL_NAME
from .childcache import ChildCache, Key
from .kube import ResourceType

log = logging.getLogger(__name__)

#: seconds between two resyncs: a lost deletion is repaired within this long (the watches repair
#: everything else at once); each resync is one LIST per kind of child (per namespace when namespaced)
DEFAULT_PERIOD = 300.0
#: seconds after the last object of a relist before the resync it asks for: a relist replays every
#: child at once, and one resync after it is enough
RELIST_SETTLE = 2.0


class Lister(Protocol):
    """What the resync needs of :class:`~modeldeploy.kube.Kube` (a fake in the tests)."""

    def list_with_rv(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None, verb: str = "list"
    ) -> tuple[list[dict[str, Any]], str | None]: ...


def _int_rv(rv: str | None) -> int | None:
    """A list's resourceVersion as a number (etcd's revision); None when it is not one: nothing is hidden."""
    try:
        return int(rv) if rv is not None else None
    except ValueError:
        return None


class Resyncer:
    """Every ``period`` seconds (0: never), in a daemon thread of its own, LIST each kind of child and
    repair the cache with the answer; :meth:`trigger` asks for one at once."""

    def __init__(
        self,
        kube: Lister,
        cache: ChildCache,
        kinds: Iterable[ResourceType],
        *,
        namespaces: Sequence[str] = (),
        period: float = DEFAULT_PERIOD,
        on_changed: Callable[[set[Key]], object] | None = None,
        relist_settle: float = RELIST_SETTLE,
    ) -> None:
        """``namespaces``: the operator's (empty: cluster-wide). ``on_changed(keys)`` receives the
        ``(namespace, name)`` of the ModelDeployments whose children a resync changed; it is called from
        the resync thread, so it must hand them to the event loop itself (``call_soon_threadsafe``)."""
        self.period = period
        self._kube = kube
        self._cache = cache
        self._kinds = tuple(kinds)
        self._namespaces: tuple[str | None, ...] = tuple(namespaces) or (None,)
        self._on_changed = on_changed or (lambda keys: None)
        self._relist_settle = relist_settle
        self._due: float | None = None  # a resync asked for (trigger, relisted) is due at this time
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Start the resync thread (not when ``period`` is 0). The first periodic resync comes one period
        after the start; kopf's initial listing replays its children through :meth:`relisted` too, which
        asks for one resync :data:`RELIST_SETTLE` seconds after it (one LIST per kind)."""
        if self.period <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="modeldeploy-resync", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop the thread; returns within ``timeout`` even while a LIST is in flight (the daemon thread
        then ends after it, without touching the cache or calling ``on_changed``)."""
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def trigger(self) -> None:
        """Resync now instead of at the end of the period; from any thread. Nothing happens when the
        thread is not running (``period`` 0)."""
        self._due = time.monotonic()
        self._wake.set()

    def relisted(self) -> None:
        """A watch of children listed its kind again: resync :data:`RELIST_SETTLE` seconds after the last
        such call; from any thread (kopf calls it in its event loop)."""
        self._due = time.monotonic() + self._relist_settle
        self._wake.set()

    def _run(self) -> None:
        next_at = time.monotonic() + self.period
        while not self._stopping.is_set():
            due = self._due
            until = next_at if due is None else min(next_at, due)
            self._wake.wait(max(0.0, until - time.monotonic()))
            self._wake.clear()
            if self._stopping.is_set():
                return
            now, due = time.monotonic(), self._due
            if now < next_at and (due is None or now < due):
                continue  # woken early: a relist pushed its resync later
            self._due = None  # before the LISTs: a relist during them asks for one more
            try:
                self.run_once()
            except Exception:  # never out of the thread: the next period tries again
                log.exception("resync failed")
            next_at = time.monotonic() + self.period

    # -------------------------------------------------------------------------------- one resync
    def run_once(self) -> set[Key]:
        """LIST each kind the cache serves, repair the cache, pass the changed owners to ``on_changed``;
        returns them. Never raises: a kind whose LIST fails is counted and skipped."""
        changed: set[Key] = set()
        for rt in self._kinds:
            changed |= self._resync(rt)
        if changed and not self._stopping.is_set():
            try:
                self._on_changed(changed)
            except Exception:
                log.exception("resync: enqueueing %d ModelDeployments failed", len(changed))
        return changed

    def _resync(self, rt: ResourceType) -> set[Key]:
        if not self._cache.serves(rt.kind):  # kopf has not started (or this kind is not watched)
            return set()
        try:
            listed, listed_rv = self._list(rt)
            if self._stopping.is_set():
                return set()
            changed = self._cache.resynced(rt.kind, listed, listed_rv)
        except Exception as e:  # KubeError, a connection error, the loop not answering
            metrics.RESYNCS.labels(kind=rt.kind, result="error").inc()
            log.warning("resync of %s failed (tried again in %gs): %s", rt.kind, self.period, e)
            return set()
        metrics.RESYNCS.labels(kind=rt.kind, result="ok").inc()
        if changed:
            metrics.RESYNC_REPAIRED.labels(kind=rt.kind).inc(len(changed))
            log.info(
                "resync: the watch of %s missed changes of the children of %s",
                rt.kind,
                ", ".join(f"{ns}/{name}" for ns, name in sorted(changed)),
            )
        return changed

    def _list(self, rt: ResourceType) -> tuple[list[dict[str, Any]], int | None]:
        """Every labelled object of a kind in scope, and the resourceVersion they are known at: one LIST
        cluster-wide, or one per namespace and the earliest of theirs (an object newer than any of those
        LISTs may be missing from one only because it came after it, so it must not be hidden)."""
        items: list[dict[str, Any]] = []
        rvs: list[int | None] = []
        for ns in self._namespaces:
            got, rv = self._kube.list_with_rv(rt, ns, LABEL_NAME, verb="resync")
            items += got
            rvs.append(_int_rv(rv))
        known = [rv for rv in rvs if rv is not None]
        return items, min(known) if len(known) == len(rvs) else None
