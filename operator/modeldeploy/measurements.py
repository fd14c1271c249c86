"""Analysis measurements off the reconcile path: a thread with its own event loop asks Prometheus.

A reconcile never waits on Prometheus (as Argo Rollouts' AnalysisRun is a controller of its own). When a
window is due it calls :meth:`MeasurementRunner.request`, which returns at once:

* the finished answers of the same queries, if a measurement of them finished since the last request and
  is not older than ``max_age`` -- handed out once (the window is judged once);
* otherwise ``None`` (pending): the measurement is started unless it runs already, and when it finishes
  ``on_done(namespace, name)`` asks for another reconcile of that ModelDeployment.

The shadow stage's probes (:meth:`latest`) read the newest finished answer instead, refreshed in the
background when older than ``refresh`` seconds.

Every query has a total deadline (``analysis.queryTimeout``, connect to the last byte; see
:mod:`modeldeploy.promclient`), a response-size cap and no retries of its own, and at most
``per_url`` queries run against one Prometheus at once: a Prometheus that hangs or drips bytes costs
its own ModelDeployments a held window per deadline, and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from . import metrics
from .analysis import Query, Sample
from .loop_thread import LoopThread
from .promclient import PromClient, PromConfig, QueryError, redact

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, ModelDeployment name)
JobKey = tuple[str, float, tuple[Query, ...]]  # (url, timeout, queries)
Slot = tuple[Key, str, str, str]  # (ModelDeployment, url, metric, revision): the probes' latest answers


@dataclass
class _Done:
    samples: list[Sample]
    finished: float  # the runner's clock


class MeasurementRunner:
    """Runs analysis queries in a thread of its own; reconciles read finished measurements."""

    def __init__(
        self,
        config_for: Callable[[str, float], PromConfig],
        on_done: Callable[[str, str], object] | None = None,
        *,
        max_age: float = 30.0,
        per_url: int = 8,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._config_for = config_for
        self.on_done = on_done
        self.max_age = max_age
        self.per_url = per_url
        self._clock = clock
        self._wall = wall  # the end of a range query (Unix seconds)
        self._lock = threading.Lock()
        self._done: dict[JobKey, _Done] = {}
        self._slots: dict[Slot, _Done] = {}
        self._running: dict[JobKey, Future[None]] = {}
        self._clients: dict[tuple[str, float], PromClient] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._thread = LoopThread("modeldeploy-measurements")

    # -------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Cancel every measurement and close the clients; returns within ``timeout`` whatever
        Prometheus does (the thread is a daemon)."""

        async def close_clients() -> None:
            await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)

        self._thread.stop(timeout, before=close_clients)

    # -------------------------------------------------------------------------------- reads (any thread)
    def request(self, key: Key, url: str, timeout: float, queries: Sequence[Query]) -> list[Sample] | None:
        """The answers of a finished measurement of ``queries`` (once), or None while it runs."""
        job: JobKey = (url, timeout, tuple(queries))
        with self._lock:
            done = self._done.pop(job, None)
            if done is not None and self._clock() - done.finished <= self.max_age:
                return done.samples
            self._submit(key, job)
        return None

    def latest(self, key: Key, url: str, timeout: float, query: Query, refresh: float) -> Sample | None:
        """The newest finished answer for ``query``'s metric and revision (None before the first, or
        when older than ``max_age``); a new one (of ``query`` as it is now: its window may have grown) is
        asked for in the background when the last is older than ``refresh`` seconds."""
        slot: Slot = (key, url, query.metric, query.revision)
        with self._lock:
            done = self._slots.get(slot)
            now = self._clock()
            if done is None or now - done.finished > refresh:
                self._submit(key, (url, timeout, (query,)), slot)
            if done is None or now - done.finished > self.max_age:
                return None
            return done.samples[0]

    def in_flight(self) -> int:
        with self._lock:
            return len(self._running)

    # -------------------------------------------------------------------------------- the loop
    def _submit(self, key: Key, job: JobKey, slot: Slot | None = None) -> None:
        """With the lock held: start ``job`` unless it runs."""
        if job in self._running or not self._thread.running:
            return
        self._running[job] = self._thread.submit(self._measure(key, job, slot))

    async def _measure(self, key: Key, job: JobKey, slot: Slot | None) -> None:
        url, timeout, queries = job
        started = time.monotonic()
        try:
            samples = list(await asyncio.gather(*(self._one(url, timeout, q) for q in queries)))
        finally:
            with self._lock:
                self._running.pop(job, None)
        metrics.ANALYSIS_MEASUREMENT_SECONDS.observe(time.monotonic() - started)
        with self._lock:
            if slot is not None:
                self._slots[slot] = _Done(samples, self._clock())
            else:
                self._done[job] = _Done(samples, self._clock())
            self._forget_old()
        if self.on_done is not None:
            try:
                self.on_done(*key)
            except Exception as e:  # the reconcile is also requeued by its own timer
                log.warning("measurements: on_done %s/%s: %s", *key, e)

    async def _one(self, url: str, timeout: float, q: Query) -> Sample:
        limit = self._limits.setdefault(url, asyncio.Semaphore(self.per_url))
        try:
            client = self._client(url, timeout)
            async with limit:
                if q.judge is not None:
                    return await self._judged(client, q)
                value = await client.instant(q.promql)
        except QueryError as e:
            metrics.ANALYSIS_QUERIES.labels(result=e.kind).inc()
            log.warning("prometheus %s: %s: %s", redact(url), q.metric, e)
            return Sample(q, None, error=str(e)[:500])
        except Exception as e:  # a URL or TLS setting the client refuses: an error, never a pass
            metrics.ANALYSIS_QUERIES.labels(result="config").inc()
            log.warning("prometheus %s: %s: %s: %s", redact(url), q.metric, type(e).__name__, e)
            return Sample(q, None, error=f"config: {type(e).__name__}: {e}"[:500])
        metrics.ANALYSIS_QUERIES.labels(result="ok" if value is not None else "nodata").inc()
        return Sample(q, value)

    async def _judged(self, client: PromClient, q: Query) -> Sample:
        """A judged query: the revision's and the stable's samples over the same window (range queries
        ending now, one point per step: the last ``window`` seconds in samples of ``step``)."""
        p = q.judge
        assert p is not None
        end = self._wall()
        start = end - p.window + p.step
        series, baseline = await asyncio.gather(
            client.range(q.promql, start, end, p.step), client.range(p.baseline, start, end, p.step)
        )
        metrics.ANALYSIS_QUERIES.labels(result="ok" if series and baseline else "nodata").inc()
        return Sample(q, None, series=tuple(series), baseline=tuple(baseline))

    def _client(self, url: str, timeout: float) -> PromClient:
        client = self._clients.get((url, timeout))
        if client is None:
            client = self._clients[(url, timeout)] = PromClient(self._config_for(url, timeout))
        return client

    def _forget_old(self) -> None:
        """With the lock held: drop answers nobody read within ``max_age`` (bounded memory)."""
        now = self._clock()
        for job in [j for j, d in self._done.items() if now - d.finished > self.max_age]:
            del self._done[job]
        for slot in [k for k, d in self._slots.items() if now - d.finished > self.max_age]:
            del self._slots[slot]
