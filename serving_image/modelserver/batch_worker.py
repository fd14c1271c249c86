"""Running batches: :func:`run_with_split` (a failing batch is split in halves and retried, so one bad
item fails alone) and :class:`BatchWorker`, which connects a :class:`~.batching.BatchQueue` to a model on a
dedicated inference thread."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from .batching import Batch, BatchQueue
from .batching_errors import ItemFailed, OutOfMemory, is_oom

log = logging.getLogger("modelserver.batching")


@dataclass
class SplitStats:
    splits: int = 0
    ooms: int = 0
    cpu_s: float = 0.0  # the inference thread's CPU time for the batch (time.thread_time)


def run_with_split(
    fn: Callable[[list[Any]], Sequence[Any]],
    payloads: list[Any],
    stats: SplitStats | None = None,
) -> list[Any]:
    """Run ``fn`` on ``payloads``; on failure split in halves and retry each half.

    Returns one entry per payload: the result, or an :class:`ItemFailed` / :class:`OutOfMemory` instance
    for a payload that failed even alone.
    """
    stats = stats if stats is not None else SplitStats()
    try:
        out = fn(payloads)
        if len(out) != len(payloads):
            raise RuntimeError(f"model returned {len(out)} results for {len(payloads)} inputs")
        return list(out)
    except Exception as exc:
        oom = is_oom(exc)
        if oom:
            stats.ooms += 1
        if len(payloads) == 1:
            if oom:
                return [OutOfMemory("out of memory while running this input alone")]
            return [ItemFailed(f"model error: {type(exc).__name__}: {exc}")]
        stats.splits += 1
        mid = len(payloads) // 2
        return run_with_split(fn, payloads[:mid], stats) + run_with_split(fn, payloads[mid:], stats)


class BatchSink(Protocol):
    """What the worker reports about every batch (metrics, logs)."""

    def on_batch(self, batch: Batch, seconds: float, stats: SplitStats) -> None: ...


class BatchWorker:
    """Pulls batches from a queue and runs them on one dedicated inference thread."""

    def __init__(
        self,
        queue: BatchQueue,
        predict: Callable[[list[Any]], Sequence[Any]],
        sink: BatchSink | None = None,
        thread_name: str = "inference",
    ) -> None:
        self.queue = queue
        self.predict = predict
        self.sink = sink
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._task: asyncio.Task[None] | None = None
        self.batches = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batch-worker")

    async def join(self) -> None:
        """Wait until the queue is closed and every admitted item has finished."""
        if self._task is not None:
            await self._task
        self.executor.shutdown(wait=True)

    def _run_sync(self, batch: Batch) -> tuple[list[Any], float, SplitStats]:
        stats = SplitStats()
        t0, c0 = time.perf_counter(), time.thread_time()
        out = run_with_split(self.predict, [i.payload for i in batch.items], stats)
        stats.cpu_s = time.thread_time() - c0
        return out, time.perf_counter() - t0, stats

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        q = self.queue
        while True:
            batch = await q.next_batch()
            if batch is None:
                return
            live = [i for i in batch.items if i.future is None or not i.future.done()]
            if not live:
                continue
            if len(live) != len(batch.items):
                batch = Batch(live, max(i.length for i in live), batch.formed_at)
            predicted = q.in_flight_s = q.batch_cost(batch)
            try:
                results, seconds, stats = await loop.run_in_executor(self.executor, self._run_sync, batch)
            except Exception as exc:  # the split runner does not raise; this is a bug guard
                log.exception("batch runner failed")
                results, seconds, stats = (
                    [ItemFailed(f"internal error: {exc}")] * batch.size,
                    0.0,
                    SplitStats(),
                )
            finally:
                q.in_flight_s = 0.0
            self.batches += 1
            if stats.ooms:
                q.lower_budget_after_oom(batch)
            elif stats.splits == 0:
                q.record(batch, seconds)
            for item, res in zip(batch.items, results, strict=True):
                if isinstance(res, BaseException):
                    log.warning("input failed: %s", res, extra={"request_id": item.request_id})
                fut = item.future
                if fut is None or fut.done():
                    continue
                if isinstance(res, BaseException):
                    fut.set_exception(res)
                else:
                    fut.set_result(res)
            q.record_answered(batch, predicted)
            if self.sink is not None:
                try:
                    self.sink.on_batch(batch, seconds, stats)
                except Exception:
                    log.exception("batch sink failed")
