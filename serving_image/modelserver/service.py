"""The model service: loading, warm-up, admission, batching, caching, drain. HTTP-agnostic."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import OrderedDict
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .batch_worker import BatchWorker, SplitStats, run_with_split
from .batching import Batch, BatchingConfig, BatchQueue, DeadlineExpired, Draining, WorkItem
from .config import Settings
from .errors import InvalidInput, NotReady, PayloadTooLarge
from .metrics import Metrics
from .models.base import ServedModel
from .packing import PACK_MIN_WIDTH

log = logging.getLogger("modelserver.service")

WARMUP_TOKENS = 2048
#: inputs larger than this (bytes of text or tensor data) are preprocessed on a worker thread; smaller
#: ones on the event loop, where a thread hop would cost more than the work
OFF_LOOP_BYTES = 64 * 1024


def item_count(inputs: dict[str, np.ndarray]) -> int:
    """The items of a request: the largest leading dimension of its inputs."""
    return max((a.shape[0] for a in inputs.values() if a.ndim > 0), default=1)


def data_bytes(inputs: dict[str, np.ndarray]) -> int:
    """The data size of a request's inputs: tensor bytes, and the text lengths of BYTES inputs."""
    size = 0
    for a in inputs.values():
        if a.dtype == object:
            size += sum(len(x) if isinstance(x, (bytes, str)) else 8 for x in a.flat)
        else:
            size += a.nbytes
    return size


class LRUCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._d: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Any:
        try:
            v = self._d[key]
        except KeyError:
            self.misses += 1
            return None
        self._d.move_to_end(key)
        self.hits += 1
        return v

    def put(self, key: Hashable, value: Any) -> None:
        self._d[key] = value
        self._d.move_to_end(key)
        while len(self._d) > self.size:
            self._d.popitem(last=False)

    def __len__(self) -> int:
        return len(self._d)


class ModelService:
    """States: loading -> ready -> draining -> stopped (or failed)."""

    def __init__(self, settings: Settings, model: ServedModel, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.model = model
        self.name = settings.model_name
        self.version = settings.model_version
        self.metrics = metrics or Metrics(self.name, self.version)
        cpu = self.metrics.cpu_seconds
        self._cpu_tokenize = cpu.labels(self.name, self.version, "tokenize")
        self._cpu_inference = cpu.labels(self.name, self.version, "inference")
        self.state = "loading"
        self.error: str | None = None
        self.queue: BatchQueue | None = None
        self.worker: BatchWorker | None = None
        self.cache = LRUCache(settings.cache_size) if settings.cache_size > 0 else None
        # one thread: large inputs are tokenized one at a time, next to the event loop
        self._preprocessor = ThreadPoolExecutor(1, thread_name_prefix="preprocess")
        self._batch_count = 0
        self.load_seconds = 0.0

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the model (on a thread), warm up, start the batch worker; then ready."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        s = self.settings
        with ThreadPoolExecutor(1, thread_name_prefix="loader") as ex:
            await loop.run_in_executor(ex, self.model.load)
            max_len = max(1, self.model.info.max_length)
            cfg = BatchingConfig(
                max_batch_size=s.max_batch_size,
                max_queue_delay_s=s.max_queue_delay_ms / 1000.0,
                max_queue_size=s.max_queue_size,
                token_budget=max(s.token_budget, max_len),
                max_length=max_len,
                buckets=s.buckets,
                scheduler=s.scheduler,
                aging_s=s.aging_ms / 1000.0,
                pack_min_width=PACK_MIN_WIDTH if self.model.info.extra.get("packed") else 0,
            )
            self.queue = BatchQueue(cfg, observer=self.metrics)
            if s.warmup:
                await loop.run_in_executor(ex, self._warmup)
        self.worker = BatchWorker(self.queue, self.model.predict, sink=self)
        self.worker.start()
        freeze_startup_objects()
        self.load_seconds = time.perf_counter() - t0
        self.state = "ready"
        log.info(
            "model ready",
            extra={
                "model": self.name,
                "version": self.version,
                "platform": self.model.info.platform,
                "device": self.model.device,
                "seconds": round(self.load_seconds, 3),
                "buckets": self.queue.buckets.bounds,
            },
        )

    def _warmup(self) -> None:
        """One throw-away batch, then for every bucket length a batch of 1 and a batch of up to
        ``WARMUP_TOKENS`` padded tokens, recorded in the cost model (which keeps learning online)."""
        assert self.queue is not None
        q = self.queue
        b = self.settings.max_batch_size
        first = self.model.warmup_payloads(q.buckets.bounds[0], 1)
        if not first:
            return
        run_with_split(self.model.predict, first)
        for length in list(q.buckets.bounds):
            n_max = max(1, min(b, q.budget // max(1, length)))
            for n in sorted({1, max(1, min(n_max, WARMUP_TOKENS // max(1, length)))}):
                payloads = self.model.warmup_payloads(length, n)
                stats = SplitStats()
                t0 = time.perf_counter()
                run_with_split(self.model.predict, payloads, stats)
                dt = time.perf_counter() - t0
                if stats.splits == 0:
                    q.observe_cost(n, length, n * length, dt)
                elif stats.ooms:
                    q.lower_budget_after_oom(_fake_batch(n, length))
        log.info("warm-up done", extra={"cost_coef": [float(c) for c in q.cost.coef]})

    def begin_drain(self) -> None:
        if self.state in ("ready", "loading"):
            log.info("draining: no new requests are admitted")
        self.state = "draining"
        if self.queue is not None:
            self.queue.close()

    async def drain(self) -> None:
        self.begin_drain()
        if self.worker is not None:
            await self.worker.join()
        self._preprocessor.shutdown(wait=False)
        self.state = "stopped"

    # -- inference --------------------------------------------------------------------------------------
    def _priority(self, requested: int) -> int:
        levels = self.settings.priority_levels
        if requested == 0:
            return self.settings.default_priority
        if requested > levels:
            raise InvalidInput(f"priority must be 0 (default) or 1..{levels} (1 is highest)")
        return requested

    def check_admitting(self) -> None:
        """Raise the 503 for a server that is loading, failed or draining."""
        if self.state == "ready" and self.queue is not None:
            return
        if self.state in ("draining", "stopped"):
            self.metrics.on_reject("draining")
            raise Draining("server is shutting down", retry_after=1.0)
        self.metrics.on_reject("not_ready")
        raise NotReady(f"model is not ready ({self.state})", retry_after=5.0)

    def _timed_preprocess(self, inputs: dict[str, np.ndarray]) -> list[Any]:
        """The model's preprocess, its thread CPU time counted as ``cpu_seconds{part="tokenize"}``."""
        c0 = time.thread_time()
        try:
            return self.model.preprocess(inputs)
        finally:
            self._cpu_tokenize.inc(time.thread_time() - c0)

    async def _prepare(self, inputs: dict[str, np.ndarray]) -> list[Any]:
        """The model's preprocessing (tokenizing) of a request, after the checks that need none of it."""
        n, limit = item_count(inputs), self.settings.max_queue_size
        if n > limit:
            # never admissible whatever the load: refused before any tokenizing
            self.metrics.on_reject("too_many_items")
            raise PayloadTooLarge(f"the request has {n} items; one request may hold at most {limit}")
        try:
            if data_bytes(inputs) > OFF_LOOP_BYTES:
                # a large input is tokenized on a worker thread: other requests are not stalled
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self._preprocessor, self._timed_preprocess, inputs)
            return self._timed_preprocess(inputs)
        except Exception as e:
            if getattr(e, "reason", None) == "too_long":
                self.metrics.on_reject("too_long")
            raise

    async def infer(
        self,
        inputs: dict[str, np.ndarray],
        priority: int = 0,
        timeout_ms: float | None = None,
        request_id: str = "",
        token_counts: list[int] | None = None,
        arrival: float | None = None,
    ) -> dict[str, np.ndarray]:
        """The outputs of one request; ``token_counts``, when given, gets each item's length (tokens).

        The deadline counts from ``arrival`` (``time.monotonic()`` when the HTTP layer first saw the request,
        modelserver.door), else from now: a request whose deadline passed while it was read, decoded or
        tokenized is answered 504 with ``Retry-After`` and never queued."""
        self.check_admitting()
        prio = self._priority(priority)
        prepared = await self._prepare(inputs)
        if token_counts is not None:
            token_counts.extend(p.length for p in prepared)
        s = self.settings
        timeout = (
            min(timeout_ms if timeout_ms is not None else s.default_timeout_ms, s.max_timeout_ms) / 1000.0
        )
        results: list[Any] = [None] * len(prepared)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        deadline = (now if arrival is None else min(now, arrival)) + timeout
        if deadline <= now:
            self._expired_at_the_door(now - deadline + timeout)
        items: list[WorkItem] = []
        slots: list[int] = []
        cache = self.cache
        for idx, p in enumerate(prepared):
            if cache is not None and p.cache_key is not None:
                hit = cache.get((self.name, self.version, p.key, p.cache_key))
                if hit is not None:
                    results[idx] = hit
                    continue
            items.append(
                WorkItem(
                    payload=p.payload,
                    length=p.length,
                    deadline=deadline,
                    arrival=now,
                    priority=prio,
                    key=p.key,
                    request_id=request_id,
                    future=loop.create_future(),
                )
            )
            slots.append(idx)
        if items:
            q = self.queue
            assert q is not None
            q.submit(items)  # raises QueueFull / DeadlineUnmeetable / Draining
            handle = loop.call_later(deadline - now, q.expire, items)
            try:
                if len(items) == 1:
                    fut = items[0].future
                    assert fut is not None
                    done = [await fut]
                else:
                    done = await asyncio.gather(*(i.future for i in items if i.future is not None))
            except asyncio.CancelledError:
                for i in items:
                    if i.future is not None and not i.future.done():
                        i.future.cancel()
                raise
            finally:
                handle.cancel()
            for idx, item, res in zip(slots, items, done, strict=True):
                results[idx] = res
                if cache is not None:
                    ck = prepared[idx].cache_key
                    if ck is not None:
                        cache.put((self.name, self.version, item.key, ck), res)
        return self.model.postprocess(results)

    def _expired_at_the_door(self, waited: float) -> None:
        """A request whose deadline passed before it reached the queue: 504 + ``Retry-After``, not run."""
        self.metrics.on_reject(DeadlineExpired.reason)
        retry = self.queue.retry_after() if self.queue is not None else 1.0
        raise DeadlineExpired(
            f"deadline expired after {waited * 1000:.0f} ms, before the request reached the queue",
            retry_after=retry,
        )

    # -- batch sink (called on the event loop after every batch) ----------------------------------------
    def on_batch(self, batch: Batch, seconds: float, stats: SplitStats) -> None:
        m = self.metrics
        m.batch_size.observe(batch.size)
        m.inference_duration.observe(seconds)
        self._cpu_inference.inc(stats.cpu_s)
        ratio = self.queue.padding_ratio(batch) if self.queue is not None else batch.padding_ratio
        m.padding_ratio.observe(ratio)
        for it in batch.items:
            m.queue_wait.observe(max(0.0, batch.formed_at - it.arrival))
        self._batch_count += 1
        every = self.settings.log_batch_every
        if stats.splits or stats.ooms or (every and self._batch_count % every == 0):
            log.info(
                "batch",
                extra={
                    "batch": self._batch_count,
                    "size": batch.size,
                    "padded_length": batch.padded_length,
                    "padding_ratio": round(ratio, 3),
                    "seconds": round(seconds, 5),
                    "splits": stats.splits,
                    "ooms": stats.ooms,
                    "queue_depth": self.queue.depth if self.queue else 0,
                    "request_ids": sorted({i.request_id for i in batch.items})[:64],
                },
            )


def freeze_startup_objects() -> None:
    """Move what start-up loaded and built (torch, transformers, the model: objects that live as long as
    the process) out of the garbage collector's view (``gc.freeze``, after a collection so no garbage is
    kept): a full collection then scans what requests create, not the model. Measured with MiniLM loaded:
    411,000 objects, a full collection 181-186 ms before the freeze (a stop of the event loop and of the
    inference thread between torch calls), about 0 ms after (docs/server.md, "Garbage collection")."""
    gc.collect()
    gc.freeze()


def _fake_batch(n: int, length: int) -> Batch:
    items = [WorkItem(payload=None, length=length, deadline=0.0, arrival=0.0) for _ in range(n)]
    return Batch(items=items, padded_length=length, formed_at=0.0)
