"""The work queue between kopf's watch events and the reconciler.

kopf delivers watch events of ModelDeployments and of their children (Deployments, Services, PDBs,
Pods labelled ``modeldeploy.io/name``); each event only *enqueues* the owning ModelDeployment's key.
Workers take keys off the queue and run one reconcile each in a thread. The queue coalesces: a key is
queued at most once, and a key that changes while it is being reconciled is reconciled once more
afterwards -- so a burst of pod events costs one or two reconciles, and two workers never reconcile
the same ModelDeployment at once.

Failed reconciles are retried with exponential backoff; a plan can ask to be run again after a delay
(the rollout's intervals). Those delayed runs are not driven by a watch event, so they first ask the
:class:`PeeringGate` whether this replica is the active one (kopf's own peering pauses only the watch
streams).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

from . import metrics
from .kube import CLUSTER_PEERING, PEERING, Kube

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


class PeeringGate:
    """Whether this operator replica is the active one, by the rules of kopf's peering.

    Active unless another live peer in the peering object has a higher *or equal* priority (kopf pauses
    all same-priority operators). Standalone operators are always active. Cached for ``ttl`` seconds.
    """

    def __init__(
        self,
        kube: Kube | None,
        *,
        identity: str,
        priority: int,
        peering_name: str,
        namespace: str | None = None,
        standalone: bool = False,
        ttl: float = 5.0,
    ):
        self.kube = kube
        self.identity = identity
        self.priority = priority
        self.peering_name = peering_name
        self.namespace = namespace
        self.standalone = standalone
        self.ttl = ttl
        self._cached: tuple[float, bool] | None = None

    @staticmethod
    def decide(peers: dict[str, Any], identity: str, priority: int, now: dt.datetime) -> bool:
        """Pure: active given the peering object's status. A copy of kopf's rule (kopf decides inside its
        own watch); tests/unit/operator/test_op_peering_rule.py pins it to kopf's process_peering_event."""
        for ident, info in peers.items():
            if ident == identity or not isinstance(info, dict):
                continue
            try:
                # as kopf's Peer: a peer that never said when it was seen counts as seen now
                seen = dt.datetime.fromisoformat(str(info["lastseen"])) if "lastseen" in info else now
                if seen.tzinfo is None:
                    seen = seen.replace(tzinfo=dt.UTC)
                alive = seen + dt.timedelta(seconds=int(info.get("lifetime", 60))) > now
            except (TypeError, ValueError):
                continue
            if alive and int(info.get("priority", 0)) >= priority:
                return False
        return True

    def is_active(self) -> bool:
        if self.standalone or self.kube is None:
            return True
        now = time.monotonic()
        if self._cached and now - self._cached[0] < self.ttl:
            return self._cached[1]
        rt = PEERING if self.namespace else CLUSTER_PEERING
        try:
            obj = self.kube.get(rt, self.namespace, self.peering_name)
        except Exception as e:
            log.warning("peering check failed: %s", e)
            obj = None
        active = obj is not None and self.decide(
            obj.get("status") or {}, self.identity, self.priority, dt.datetime.now(dt.UTC)
        )
        self._cached = (now, active)
        metrics.LEADER.set(1 if active else 0)
        return active


class Controller:
    """Coalescing work queue + workers running ``reconcile(namespace, name)`` in threads."""

    def __init__(
        self,
        reconcile: Callable[[str, str], Any],
        *,
        workers: int = 4,
        gate: PeeringGate | None = None,
        max_backoff: float = 60.0,
    ):
        self._reconcile = reconcile
        self._workers = workers
        self._gate = gate
        self._max_backoff = max_backoff
        self._queue: asyncio.Queue[tuple[Key, bool]] | None = None
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._started: dict[Key, float] = {}  # when each running reconcile began (time.monotonic)
        self._dirty: set[Key] = set()
        self._failures: dict[Key, int] = {}
        self._timers: dict[Key, asyncio.TimerHandle] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.known: set[Key] = set()

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue = asyncio.Queue()
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"modeldeploy-worker-{i}") for i in range(self._workers)
        ]

    async def stop(self) -> None:
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    # -------------------------------------------------------------------------------- queue
    def enqueue(self, key: Key, *, from_timer: bool = False) -> None:
        """Ask for a reconcile of ``key`` (idempotent; call from the event loop)."""
        if self._queue is None:
            return
        if key in self._running:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait((key, from_timer))
        metrics.QUEUE_DEPTH.set(len(self._queued))

    def enqueue_after(self, key: Key, delay: float) -> None:
        """Reconcile ``key`` again after ``delay`` seconds (the earliest request wins)."""
        if self._loop is None:
            return
        when = self._loop.time() + max(0.0, delay)
        old = self._timers.get(key)
        if old is not None:
            if old.when() <= when:
                return
            old.cancel()
        self._timers[key] = self._loop.call_at(when, self._fire, key)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.enqueue(key, from_timer=True)

    def forget(self, key: Key) -> None:
        handle = self._timers.pop(key, None)
        if handle is not None:
            handle.cancel()
        self._failures.pop(key, None)
        self.known.discard(key)
        metrics.MANAGED.set(len(self.known))
        metrics.forget(*key)

    def note(self, key: Key) -> None:
        if key not in self.known:
            self.known.add(key)
            metrics.MANAGED.set(len(self.known))

    @property
    def idle(self) -> bool:
        return not self._queued and not self._running

    def longest_running(self) -> tuple[Key, float] | None:
        """The reconcile that has been running longest, and for how many seconds (None: none runs)."""
        if not self._started:
            return None
        key, since = min(self._started.items(), key=lambda kv: kv[1])
        return key, time.monotonic() - since

    # -------------------------------------------------------------------------------- workers
    async def _worker(self, index: int) -> None:
        assert self._queue is not None
        while True:
            key, from_timer = await self._queue.get()
            self._queued.discard(key)
            metrics.QUEUE_DEPTH.set(len(self._queued))
            # running from here on, the peering check included: an event that arrives while the gate is
            # asked marks the key dirty instead of starting a second reconcile next to this one
            self._running.add(key)
            try:
                if from_timer and self._gate is not None:
                    active = await asyncio.to_thread(self._gate.is_active)
                    if not active:
                        log.info(
                            "not the active operator replica; skipping the timed reconcile of %s/%s", *key
                        )
                        continue
                self._started[key] = time.monotonic()
                result = await asyncio.to_thread(self._reconcile, *key)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                n = self._failures.get(key, 0) + 1
                self._failures[key] = n
                delay = min(self._max_backoff, 0.5 * 2 ** (n - 1))
                log.warning(
                    "reconcile of %s/%s failed (%d in a row), retrying in %.1fs: %s", *key, n, delay, e
                )
                self.enqueue_after(key, delay)
            else:
                self._failures.pop(key, None)
                requeue = getattr(result, "requeue_after", None)
                if requeue is not None:
                    self.enqueue_after(key, requeue)
            finally:
                self._running.discard(key)
                self._started.pop(key, None)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.enqueue(key)
