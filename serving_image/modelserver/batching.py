"""The batching core: single work items in, batches out. No HTTP in here.

* :class:`BatchQueue` admits :class:`WorkItem` s (one per text / tensor row), rejects what it cannot serve
  (queue full, deadline unmeetable, draining) and forms batches when the inference worker asks for one.
* :class:`CostModel` learns batch latency as a function of batch size ``n`` and padded length ``L`` online:
  ``t(n, L) = c0 + c1*n + c2*n*L + c3*n*L^2`` (non-negative least squares, relative error).
* :class:`BucketPolicy` holds length buckets: fixed, or derived from observed length quantiles
  (P50/P80/P95 plus the maximum).
* :func:`run_with_split` runs a batch and, when it fails (out of memory or otherwise), splits it in halves and
  retries, so one bad item fails alone and the others succeed.
* :class:`BatchWorker` connects a queue to a model running on a dedicated inference thread.

Batch formation (``scheduler="adaptive"``), each time the worker is free:

1. Items whose deadline passed fail with :class:`DeadlineExpired`.
2. The *seed* is the most urgent item: the smallest virtual arrival time ``arrival + (priority-1)*aging``
   (priority aging: a waiting low-priority item eventually precedes every newcomer, so nothing starves),
   unless an item is about to miss its deadline, then the earliest deadline among those goes first. Every
   batch holds the seed, so no item is ever passed over by one behind it in virtual time (the tail bound).
3. Compatible items are sorted by length and split into contiguous batches (at most ``max_batch_size``
   items, ``n * L <= token_budget``) of **least total estimated time** ``sum t(n, L)`` -- a dynamic
   programme over the sorted queue, so a short input is padded to a longer one exactly when that costs
   less than the extra batch's fixed overhead, and a deep queue is served in wide batches. The batch is the
   seed's group of that plan. A batch crossing a length-bucket bound is costed ``cross_bucket_gain`` more.
   The fixed per-batch cost used is the cost model's ``c0``, at least the recent excess of measured over
   predicted times of batches of 1-2 items, so a model that undervalues batching (``c0`` fitted to ~0 after
   a burst) cannot make the queue serve a backlog in needlessly small batches.
4. The batch is dispatched when it is full, when its oldest item waited ``max_queue_delay``, when the seed's
   deadline is close, or when draining; otherwise the worker waits for more arrivals.

The scheduler before the tail work of issue #15 (``adaptive-v1``: efficiency-scored windows around the
seed) is the benchmark's baseline and lives in bench/batching_v1.py, a subclass of :class:`BatchQueue`.

The errors live in :mod:`.batching_errors`, the cost model and buckets in :mod:`.batch_cost`, the worker and
the split-and-retry in :mod:`.batch_worker`; the first two are re-exported here.

``scheduler="fifo"`` is plain dynamic batching (oldest first, up to ``max_batch_size``), kept for comparison.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .batch_cost import BucketPolicy, CostModel
from .batching_errors import (
    BatchingError,
    DeadlineExpired,
    DeadlineUnmeetable,
    Draining,
    InputTooLong,
    ItemFailed,
    OutOfMemory,
    QueueFull,
    is_oom,
)
from .packing import positions

log = logging.getLogger("modelserver.batching")

Clock = Callable[[], float]

#: the dispatch check's hand-back margin (:attr:`BatchQueue.overrun_s`) halves in this time; under load,
#: about what the 10 % per answered batch it replaced gave with batches of 30-40 ms
OVERRUN_HALF_LIFE_S = 0.25


# ----------------------------------------------------------------------------------------------------------
# items and batches

_seq = itertools.count()


@dataclass(eq=False, slots=True)
class WorkItem:
    """One unit of batching: a text or a tensor row, with its own future."""

    payload: Any
    length: int
    deadline: float
    arrival: float
    priority: int = 1
    key: Hashable = None  # items with different keys never share a batch (e.g. tensor shapes)
    request_id: str = ""
    future: asyncio.Future[Any] | None = None
    seq: int = field(default_factory=lambda: next(_seq))
    vkey: float = 0.0  # virtual arrival time, set by the queue (priority aging)
    est_cost: float = 0.0  # this item's share of the backlog estimate, set by the queue
    queued: bool = False


@dataclass(slots=True)
class Batch:
    items: list[WorkItem]
    padded_length: int
    formed_at: float

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def real_tokens(self) -> int:
        return sum(i.length for i in self.items)

    @property
    def padded_tokens(self) -> int:
        return self.padded_length * len(self.items)

    @property
    def padding_ratio(self) -> float:
        real = self.real_tokens
        return self.padded_tokens / real if real else 1.0


# ----------------------------------------------------------------------------------------------------------
# queue


@dataclass
class BatchingConfig:
    max_batch_size: int = 64
    max_queue_delay_s: float = 0.005
    max_queue_size: int = 1024
    token_budget: int = 8192
    max_length: int = 512
    buckets: Sequence[int] | None = None
    scheduler: str = "adaptive"  # adaptive | fifo
    aging_s: float = 0.1
    cross_bucket_gain: float = 0.10  # a batch crossing a bucket bound costs this much more
    urgent_factor: float = 2.0  # an item is at risk when slack < factor * recent batch time
    #: the model runs batches packed (modelserver.packing) in rows at least this wide: a batch costs the
    #: positions its rows run, not n x its longest (0: padded)
    pack_min_width: int = 0


class BatchObserver(Protocol):
    def on_reject(self, reason: str) -> None: ...

    def on_depth(self, depth: int) -> None: ...


class _NullObserver:
    def on_reject(self, reason: str) -> None:
        pass

    def on_depth(self, depth: int) -> None:
        pass


class BatchQueue:
    """Admission control and batch formation. Use from one event loop."""

    def __init__(
        self,
        config: BatchingConfig,
        clock: Clock = time.monotonic,
        cost_model: CostModel | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        self.cfg = config
        self.clock = clock
        self.cost = cost_model or CostModel()
        self.buckets = BucketPolicy(config.max_length, config.buckets)
        self.observer: BatchObserver = observer or _NullObserver()
        self._items: list[WorkItem] = []
        self._wakeup = asyncio.Event()
        self._closed = False
        self._backlog_s = 0.0
        self.budget = config.token_budget  # lowered after an out-of-memory batch
        self.recent_batch_s = 0.0  # EMA of batch latency
        self.excess_s = 0.0  # EMA of measured minus predicted latency of batches of 1-2 items
        self.in_flight_s = 0.0  # estimated remaining time of the batch being run
        #: how much later than predicted recent batches handed their answers back (a maximum that halves every
        #: ``OVERRUN_HALF_LIFE_S``; see :attr:`overrun_s`): the dispatch check adds it, so answers are not
        #: late by what the prediction leaves out (the thread hand-offs, an event loop busy with other
        #: requests, a slower machine than the cost model saw)
        self._overrun_peak_s = 0.0
        self._overrun_at = 0.0

    # -- state -----------------------------------------------------------------------------------------
    @property
    def overrun_s(self) -> float:
        """The hand-back margin now: the largest recent lateness, halved every ``OVERRUN_HALF_LIFE_S``.

        It fades with time, not with answered batches: a margin past every deadline lets no batch run, so
        one that faded only as batches were answered never faded -- one stall of the process longer than
        the deadline (a CPU-throttled or frozen pod, SIGSTOP in
        tests/integration/server/test_overload.py) left the server answering every request 504, for good."""
        age = self.clock() - self._overrun_at
        return self._overrun_peak_s * 0.5 ** (max(0.0, age) / OVERRUN_HALF_LIFE_S)

    @property
    def depth(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def backlog_seconds(self) -> float:
        return max(0.0, self._backlog_s) + self.in_flight_s

    def retry_after(self) -> float:
        return max(1.0, math.ceil(self.backlog_seconds()))

    def close(self) -> None:
        """Stop admitting; queued items are still batched (without waiting for the delay)."""
        self._closed = True
        self._wakeup.set()

    def poke(self) -> None:
        """Re-evaluate now (tests with a manual clock advance the clock, then poke)."""
        self._wakeup.set()

    # -- admission --------------------------------------------------------------------------------------
    def _item_cost(self, length: int) -> float:
        n = max(1, min(self.cfg.max_batch_size, self.budget // max(1, length)))
        return self.cost_of(n, length, n * length) / n

    def cost_of(self, n: int, longest: int, tokens: int) -> float:
        """The cost model's time of a batch of ``n`` items, the longest ``longest`` tokens, running ``tokens``
        positions: padded ``n x longest``; packed its rows (at least ``pack_min_width`` wide) x the fullest
        row's length."""
        if self.cfg.pack_min_width:
            return self.cost.predict(n, max(longest, self.cfg.pack_min_width), tokens)
        return self.cost.predict(n, longest)

    def batch_cost(self, batch: Batch) -> float:
        return self.cost_of(batch.size, batch.padded_length, self.positions_of(batch.items))

    def padding_ratio(self, batch: Batch) -> float:
        """Positions the batch runs over its real tokens (packed: rows x the fullest row)."""
        return self.positions_of(batch.items) / max(1, batch.real_tokens)

    def positions_of(self, items: Sequence[WorkItem]) -> int:
        """The positions a batch of ``items`` runs: packed (modelserver.packing) or padded to the longest."""
        lengths = tuple(max(1, it.length) for it in items)
        if self.cfg.pack_min_width:
            return positions(lengths, self.cfg.pack_min_width)
        return len(lengths) * max(lengths)

    def observe_cost(self, n: int, longest: int, tokens: int, seconds: float) -> None:
        """Feed a batch's measured time to the cost model (in the terms of :meth:`cost_of`)."""
        if self.cfg.pack_min_width:
            self.cost.observe(n, max(longest, self.cfg.pack_min_width), seconds, tokens)
        else:
            self.cost.observe(n, longest, seconds)

    def submit(self, items: Sequence[WorkItem]) -> None:
        """Admit all of ``items`` or none (raises a :class:`BatchingError`)."""
        if self._closed:
            self.observer.on_reject(Draining.reason)
            raise Draining("server is shutting down", retry_after=1.0)
        if len(self._items) + len(items) > self.cfg.max_queue_size:
            self.observer.on_reject(QueueFull.reason)
            raise QueueFull(f"queue full ({self.cfg.max_queue_size} items)", retry_after=self.retry_after())
        now = self.clock()
        costs = [self._item_cost(it.length) for it in items]
        # Lower bound on completion: everything queued ahead runs at its best batching, then ours.
        finish = now + self.backlog_seconds() + sum(costs)
        earliest = min(it.deadline for it in items)
        if finish > earliest:
            self.observer.on_reject(DeadlineUnmeetable.reason)
            raise DeadlineUnmeetable(
                f"deadline cannot be met: about {finish - now:.3f}s of work is ahead, "
                f"timeout is {earliest - now:.3f}s",
                retry_after=self.retry_after(),
            )
        aging = self.cfg.aging_s
        for it, c in zip(items, costs, strict=True):
            it.arrival = now if it.arrival <= 0 else it.arrival
            it.vkey = it.arrival + (it.priority - 1) * aging
            it.est_cost = c
            it.queued = True
            self._backlog_s += c
            self.buckets.observe(it.length)
            self._items.append(it)
        self.observer.on_depth(len(self._items))
        self._wakeup.set()

    # -- formation --------------------------------------------------------------------------------------
    def _remove(self, batch_items: list[WorkItem]) -> None:
        ids = {id(i) for i in batch_items}
        self._items = [i for i in self._items if id(i) not in ids]
        for i in batch_items:
            i.queued = False
            self._backlog_s -= i.est_cost
        if not self._items:
            self._backlog_s = 0.0
        self.observer.on_depth(len(self._items))

    def expire(self, items: Sequence[WorkItem]) -> None:
        """Deadline timer: fail the given items that are not answered yet with 504 + ``Retry-After``.

        A queued item leaves the queue; one whose batch is running is answered now and its result dropped
        when the batch ends: the caller gets its answer at the deadline it set (as a gRPC deadline does),
        never a 200 after it -- a batch can run past the cost model's estimate when the CPU is shared
        (tests/integration/server/test_overload.py)."""
        now = self.clock()
        queued = [it for it in items if it.queued]
        for it in items:
            if it.future is None or it.future.done():
                continue
            self.observer.on_reject(DeadlineExpired.reason)
            where = "in the queue" if it.queued else "while its batch ran"
            it.future.set_exception(
                DeadlineExpired(
                    f"deadline expired after {(now - it.arrival) * 1000:.0f} ms {where}",
                    retry_after=self.retry_after(),
                )
            )
        if queued:
            self._remove(queued)

    def _sweep(self, now: float) -> None:
        """Fail expired items, drop cancelled ones."""
        dead = []
        for it in self._items:
            if it.future is not None and it.future.done():
                dead.append(it)
            elif it.deadline <= now:
                dead.append(it)
                self.observer.on_reject(DeadlineExpired.reason)
                if it.future is not None:
                    waited = now - it.arrival
                    it.future.set_exception(
                        DeadlineExpired(
                            f"deadline expired after {waited * 1000:.0f} ms in the queue",
                            retry_after=self.retry_after(),
                        )
                    )
        if dead:
            self._remove(dead)

    def _seed(self, now: float) -> WorkItem:
        items = self._items
        horizon = self.cfg.urgent_factor * max(self.recent_batch_s, self.cfg.max_queue_delay_s)
        at_risk = [i for i in items if i.deadline - now < horizon]
        if at_risk:
            return min(at_risk, key=lambda i: (i.deadline, i.seq))
        return min(items, key=lambda i: (i.vkey, i.seq))

    def _plan(self, cands: list[WorkItem], s: int, now: float, deadline: float) -> tuple[int, int, bool]:
        """The seed's batch ``cands[a : b + 1]`` (cands sorted by length, ``s`` the seed) -> (a, b, full).

        Of the partitions of cands into contiguous batches (sizes within the batch size and the token
        budget), the one of least total estimated time; the seed's group of it, among those that finish
        before the seed's deadline. Computed on the ``2 x max_batch_size`` neighbours either side of the seed
        (what lies further off hardly moves the seed's group): ``pre[a]`` is the least time of
        ``cands[:a]``, ``suf[b]`` that of ``cands[b:]``, and the seed's group ``[a, b)`` minimises
        ``pre[a] + t([a, b)) + suf[b]``.
        """
        bmax = self.cfg.max_batch_size
        first = max(0, s - 2 * bmax)
        cands = cands[first : s + 2 * bmax + 1]
        s -= first
        m = len(cands)
        c0, c1, c2, c3 = (float(x) for x in self.cost.coef)
        c0 = max(c0, self.excess_s)
        lens = np.fromiter((max(1, c.length) for c in cands), dtype=np.float64, count=m)
        per = c1 + lens * (c2 + lens * c3)  # per-item time of a batch padded to lens[j]
        cap = np.clip(self.budget // lens, 1, bmax).astype(np.int64)  # most items such a batch holds
        bucket = np.searchsorted(np.asarray(self.buckets.bounds), lens)
        width = min(bmax, m)
        k = np.arange(1, width + 1)
        # t[j, k-1]: estimated time of the batch cands[j-k+1 : j+1] (k items padded to lens[j], or packed),
        # weighted by the cross-bucket factor for planning; inf where it does not exist or does not fit.
        end = np.arange(m)[:, None]
        start = end - k + 1
        fits = (start >= 0) & (k <= cap[:, None])
        if self.cfg.pack_min_width:
            # packed: rows as wide as the longest; an input over half a row wide has a row to itself
            row = np.maximum(lens, self.cfg.pack_min_width)  # a batch ending at j: rows row[j] wide
            cum = np.concatenate(([0.0], np.cumsum(lens)))
            tokens = cum[end + 1] - cum[np.maximum(start, 0)]
            halves = end - np.maximum(start, np.searchsorted(lens, row / 2, side="right")[:, None]) + 1
            rows = np.maximum(np.ceil(tokens / row[:, None]), halves)
            t = c0 + k * c1 + rows * row[:, None] * (c2 + row * c3)[:, None]
        else:
            t = c0 + k * per[:, None]
        plan_t = t * np.where(
            bucket[np.maximum(start, 0)] != bucket[:, None], 1.0 + self.cfg.cross_bucket_gain, 1.0
        )
        plan_t[~fits] = np.inf
        pre = np.zeros(m + 1)
        for j in range(1, s + 1):
            w = min(j, width)
            pre[j] = (pre[j - w : j][::-1] + plan_t[j - 1, :w]).min()
        # by_start[i, k-1]: plan_t of the batch of k items starting at i
        last = np.arange(m)[:, None] + k - 1
        by_start = plan_t[np.minimum(last, m - 1), k - 1]
        by_start[last >= m] = np.inf
        suf = np.zeros(m + 1)
        for i in range(m - 1, s, -1):
            w = min(m - i, width)
            suf[i] = (by_start[i, :w] + suf[i + 1 : i + w + 1]).min()
        # the seed's group: ends b-1 in [s, s+width), sizes reaching down to or below s
        ends = np.arange(s, min(m, s + width))
        total = pre[np.maximum(ends[:, None] - k + 1, 0)] + plan_t[ends] + suf[ends + 1][:, None]
        reach = (ends[:, None] - k + 1 <= s) & np.isfinite(plan_t[ends])
        on_time = (now + t[ends] <= deadline) | ((ends[:, None] == s) & (k == 1))
        total[~(reach & on_time)] = np.inf
        # least total; among (near) equals the widest group
        rows, cols = np.nonzero(total <= float(total.min()) * (1 + 1e-9))
        pick = int(np.argmax(cols))
        b, n = int(ends[rows[pick]]), int(cols[pick]) + 1
        return first + b - n + 1, first + b, n >= int(cap[b])

    def _form(self, now: float) -> tuple[list[WorkItem], int, bool]:
        seed = self._seed(now)
        cands = [it for it in self._items if it.key == seed.key]
        if self.cfg.scheduler == "fifo":
            cands.sort(key=lambda it: (it.vkey, it.seq))
            chosen = cands[: self.cfg.max_batch_size]
            return chosen, max(it.length for it in chosen), len(chosen) >= self.cfg.max_batch_size
        cands.sort(key=lambda it: (it.length, it.vkey, it.seq))
        a, b, full = self._plan(cands, cands.index(seed), now, seed.deadline)
        chosen = cands[a : b + 1]
        return chosen, chosen[-1].length, full

    def try_form(self) -> Batch | float | None:
        """A batch if one should run now; else the clock time to re-check (float) or None (queue empty)."""
        now = self.clock()
        self._sweep(now)
        if not self._items:
            return None
        if not self._closed:
            wait = self._not_yet(now)
            if wait is not None:
                return wait
        chosen, padded, full = self._form(now)
        due, urgent_at = self._dispatch_times(chosen)
        if full or self._closed or now >= due or now >= urgent_at:
            self._remove(chosen)
            run = self._fail_late(chosen, now)
            if not run:
                return self.try_form()  # every item of it was late: the next batch
            if len(run) < len(chosen):
                padded = max(it.length for it in run)
            return Batch(items=run, padded_length=max(1, padded), formed_at=now)
        return min(due, urgent_at)

    def _fail_late(self, items: list[WorkItem], now: float) -> list[WorkItem]:
        """The items of a batch about to run that it would finish before their deadline (by the cost model);
        the others fail now with :class:`DeadlineExpired` (504 + ``Retry-After``), not run: an answer after
        the deadline is worth nothing to the caller and costs the requests behind it."""
        cost = self.cost_of(len(items), max(it.length for it in items), self.positions_of(items))
        end = now + cost + self.overrun_s
        if all(it.deadline >= end for it in items):
            return items
        keep = []
        for it in items:
            if it.deadline >= end:
                keep.append(it)
                continue
            self.observer.on_reject(DeadlineExpired.reason)
            if it.future is not None and not it.future.done():
                it.future.set_exception(
                    DeadlineExpired(
                        f"deadline would expire before the batch finished "
                        f"({(it.deadline - now) * 1000:.0f} ms left, the batch takes about "
                        f"{(end - now) * 1000:.0f} ms)",
                        retry_after=self.retry_after(),
                    )
                )
        return keep

    def _not_yet(self, now: float) -> float | None:
        """When no batch can be full with fewer items than the longest one's batch holds, nor due before the
        queue's oldest item or at risk before its earliest deadline: the time to re-check; else None."""
        due, urgent_at = self._dispatch_times(self._items)
        longest = max(it.length for it in self._items)
        n_max = max(1, min(self.cfg.max_batch_size, self.budget // max(1, longest)))
        if len(self._items) < n_max and now < due and now < urgent_at:
            return min(due, urgent_at)
        return None

    def _dispatch_times(self, items: Sequence[WorkItem]) -> tuple[float, float]:
        """When a batch of ``items`` is due (its oldest waited ``max_queue_delay``) and when it is at risk
        (its earliest deadline within ``urgent_factor`` recent batch times)."""
        due = min(it.arrival for it in items) + self.cfg.max_queue_delay_s
        deadline = min(it.deadline for it in items)
        return due, deadline - self.cfg.urgent_factor * max(self.recent_batch_s, 1e-3)

    async def next_batch(self) -> Batch | None:
        """Wait for the next batch; None once the queue is closed and empty."""
        while True:
            self._wakeup.clear()
            got = self.try_form()
            if isinstance(got, Batch):
                return got
            if got is None:
                if self._closed:
                    return None
                await self._wakeup.wait()
                continue
            timeout = max(0.0, got - self.clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)

    def record(self, batch: Batch, seconds: float) -> None:
        """Feed a finished batch's latency to the cost model."""
        a = 0.2
        # The plan's fixed cost is at least what batches of 1-2 items take beyond the predicted time: a model
        # fitted to c0 ~ 0 (after a burst of large batches) cannot leave a backlog to small batches. It
        # decays by 10 % a larger batch: under saturation no small batch comes to refresh it, and a value
        # left from the ramp-up made every batch the whole queue padded to its longest (short texts: 0.82x
        # the throughput of adaptive-v1, which ignores it; issue 26).
        if batch.size <= 2:
            excess = seconds - self.batch_cost(batch)
            self.excess_s += a * (excess - self.excess_s)
        else:
            self.excess_s *= 0.9
        self.observe_cost(batch.size, batch.padded_length, self.positions_of(batch.items), seconds)
        self.recent_batch_s = (
            seconds if self.recent_batch_s == 0 else (1 - a) * self.recent_batch_s + a * seconds
        )

    def record_answered(self, batch: Batch, predicted_s: float) -> None:
        """A batch's answers were handed back now, ``predicted_s`` (the cost model's time) after it was
        formed: how much later than that feeds :attr:`overrun_s`, a maximum that halves every
        ``OVERRUN_HALF_LIFE_S``."""
        now = self.clock()
        late = now - batch.formed_at - predicted_s
        if late >= self.overrun_s:
            self._overrun_peak_s, self._overrun_at = max(late, 0.0), now

    def lower_budget_after_oom(self, batch: Batch) -> None:
        new = max(batch.padded_length, batch.padded_tokens // 2)
        if new < self.budget:
            log.warning(
                "out of memory at %d padded tokens: token budget lowered %d -> %d",
                batch.padded_tokens,
                self.budget,
                new,
            )
            self.budget = new


__all__ = [
    "Batch",
    "BatchObserver",
    "BatchQueue",
    "BatchingConfig",
    "BatchingError",
    "BucketPolicy",
    "Clock",
    "CostModel",
    "DeadlineExpired",
    "DeadlineUnmeetable",
    "Draining",
    "InputTooLong",
    "ItemFailed",
    "OutOfMemory",
    "QueueFull",
    "WorkItem",
    "is_oom",
]
