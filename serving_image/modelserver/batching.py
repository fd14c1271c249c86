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

``scheduler="adaptive-v1"`` is the scheduler before the tail work of issue #15, kept as the benchmark's
baseline: step 3 scores every window of neighbours around the seed by its efficiency (the ideal cost of its
items at full batches over the padded batch's estimated time) and takes the best, preferring the seed's
bucket. Both use the same cost model (see :class:`CostModel`).

``scheduler="fifo"`` is plain dynamic batching (oldest first, up to ``max_batch_size``), kept for comparison.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

log = logging.getLogger("modelserver.batching")

Clock = Callable[[], float]


# ----------------------------------------------------------------------------------------------------------
# errors


class BatchingError(Exception):
    """A request the queue refuses or cannot finish. ``status`` is the HTTP status the server maps it to."""

    status = 503
    reason = "error"

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class QueueFull(BatchingError):
    status = 503
    reason = "queue_full"


class DeadlineUnmeetable(BatchingError):
    status = 429
    reason = "deadline"


class DeadlineExpired(BatchingError):
    status = 504
    reason = "timeout"


class Draining(BatchingError):
    status = 503
    reason = "draining"


class InputTooLong(BatchingError):
    status = 413
    reason = "too_long"


class ItemFailed(BatchingError):
    """The model failed on this item even when it ran alone."""

    status = 500
    reason = "model_error"


class OutOfMemory(ItemFailed):
    status = 503
    reason = "oom"


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    name = type(exc).__name__
    if name in ("OutOfMemoryError", "OutOfMemory"):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


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
# cost model


class CostModel:
    """Online estimate of batch latency ``t(n, L)`` in seconds.

    Features ``[1, n, n*L, n*L^2]``; coefficients are fitted by non-negative least squares on relative error
    over the most recent observations, refitted every few observations.

    ``stratified=False`` (default): one ring buffer of the last ``window`` observations. After a burst of
    large batches it holds nothing else, so the fixed cost ``c0`` cannot be told apart from the per-item cost
    ``c1``, and a fit with ``c0 ~ 0`` explains the data as well; the queue's plan guards against that (see
    :meth:`BatchQueue.record`). ``stratified=True``: the most recent ``window // 16`` observations per cell of
    (log2 batch size, log2 padded length), so observations at other sizes and lengths stay in the fit until
    newer ones of the same cell replace them -- including stale ones: on the benchmark machine the warm-up's
    (four servers warming up at once) kept ``c0`` at 34 ms against 11 ms measured by the ring, and the
    least-time plan, trusting it, padded wide batches for 8% less throughput. Not used by the queue.
    """

    FEATURES = 4

    def __init__(self, window: int = 512, refit_every: int = 8, stratified: bool = False) -> None:
        self._obs: deque[tuple[int, int, float]] = deque(maxlen=window)
        self._cells: dict[tuple[int, int], deque[tuple[int, int, float]]] | None = {} if stratified else None
        self._cell_size = max(8, window // 16)
        self._count = 0
        self._refit_every = refit_every
        self._since_fit = 0
        # A weak prior, only used until the first fit: 0.5 ms + 2 us per padded token.
        self.coef = np.array([5e-4, 0.0, 2e-6, 0.0])
        self.fitted = False
        self._lock = threading.Lock()

    def predict(self, n: int, length: int) -> float:
        c = self.coef
        return float(c[0] + n * (c[1] + length * (c[2] + length * c[3])))

    def observe(self, n: int, length: int, seconds: float) -> None:
        if seconds <= 0 or n <= 0:
            return
        with self._lock:
            ob = (n, max(1, length), seconds)
            if self._cells is None:
                self._obs.append(ob)
            else:
                cell = (n.bit_length(), ob[1].bit_length())
                self._cells.setdefault(cell, deque(maxlen=self._cell_size)).append(ob)
            self._count += 1
            self._since_fit += 1
            if self._since_fit >= (1 if self._count < 32 else self._refit_every):
                self._fit()

    def observations(self) -> list[tuple[int, int, float]]:
        """The (n, padded length, seconds) observations the fit uses."""
        if self._cells is None:
            return list(self._obs)
        return [ob for cell in self._cells.values() for ob in cell]

    def _fit(self) -> None:
        self._since_fit = 0
        obs = np.array(self.observations(), dtype=np.float64)
        if len(obs) < 2:
            return
        n, length, y = obs[:, 0], obs[:, 1], obs[:, 2]
        x = np.stack([np.ones_like(n), n, n * length, n * length * length], axis=1)
        w = 1.0 / y  # relative error
        xw, yw = x * w[:, None], y * w
        active = list(range(self.FEATURES))
        coef = np.zeros(self.FEATURES)
        while active:
            sol, *_ = np.linalg.lstsq(xw[:, active], yw, rcond=None)
            if (sol >= 0).all():
                coef[:] = 0
                coef[active] = sol
                break
            active.pop(int(np.argmin(sol)))
        if coef.any():
            self.coef = coef
            self.fitted = True

    def per_item(self, length: int, batch: int) -> float:
        """Estimated seconds of worker time per item when batched ``batch``-wide at ``length``."""
        batch = max(1, batch)
        return self.predict(batch, length) / batch


# ----------------------------------------------------------------------------------------------------------
# buckets


class BucketPolicy:
    """Length buckets. ``bounds`` are inclusive upper bounds, the last one is ``max_length``.

    Fixed bounds are used as given. Otherwise ("auto") they start as powers of two and are re-derived from
    the observed lengths' P50/P80/P95 (rounded up to multiples of 8) every ``update_every`` observations.
    """

    QUANTILES = (0.50, 0.80, 0.95)

    def __init__(
        self,
        max_length: int,
        fixed: Sequence[int] | None = None,
        window: int = 1024,
        update_every: int = 256,
        min_samples: int = 64,
    ) -> None:
        self.max_length = max(1, max_length)
        self.auto = fixed is None
        self._lengths: deque[int] = deque(maxlen=window)
        self._update_every = update_every
        self._min_samples = min_samples
        self._since = 0
        if fixed is not None:
            bounds = sorted({min(int(b), self.max_length) for b in fixed if b > 0})
        else:
            bounds, b = [], 16
            while b < self.max_length:
                bounds.append(b)
                b *= 2
        if not bounds or bounds[-1] != self.max_length:
            bounds.append(self.max_length)
        self.bounds: list[int] = bounds

    def index(self, length: int) -> int:
        return min(bisect.bisect_left(self.bounds, length), len(self.bounds) - 1)

    def range_of(self, length: int) -> tuple[int, int]:
        """Inclusive (low, high) lengths of the bucket holding ``length``."""
        i = self.index(length)
        return (self.bounds[i - 1] + 1 if i else 0), self.bounds[i]

    def observe(self, length: int) -> None:
        if not self.auto:
            return
        self._lengths.append(length)
        self._since += 1
        if self._since >= self._update_every and len(self._lengths) >= self._min_samples:
            self._since = 0
            self.bounds = self.derive(list(self._lengths), self.max_length)

    @classmethod
    def derive(cls, lengths: Sequence[int], max_length: int) -> list[int]:
        qs = np.quantile(np.asarray(lengths, dtype=np.float64), cls.QUANTILES)
        bounds = sorted({min(max_length, max(8, math.ceil(q / 8.0) * 8)) for q in qs})
        if bounds[-1] != max_length:
            bounds.append(max_length)
        return bounds


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
    scheduler: str = "adaptive"  # adaptive | adaptive-v1 | fifo
    aging_s: float = 0.1
    cross_bucket_gain: float = 0.10  # a batch crossing a bucket bound costs this much more (v1: must gain it)
    urgent_factor: float = 2.0  # an item is at risk when slack < factor * recent batch time


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

    # -- state -----------------------------------------------------------------------------------------
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
        return self.cost.per_item(length, n)

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
        """Deadline timer: fail the given items that are still queued (504); running ones finish."""
        now = self.clock()
        gone = [it for it in items if it.queued]
        if not gone:
            return
        self._remove(gone)
        for it in gone:
            self.observer.on_reject(DeadlineExpired.reason)
            if it.future is not None and not it.future.done():
                it.future.set_exception(
                    DeadlineExpired(f"deadline expired after {(now - it.arrival) * 1000:.0f} ms in the queue")
                )

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
                        DeadlineExpired(f"deadline expired after {waited * 1000:.0f} ms in the queue")
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

    def _right_ends(
        self, cands: list[WorkItem], i: int, hi: int, now: float, deadline: float
    ) -> Iterator[tuple[int, int, int, float, float, float]]:
        """Windows ``[i, b]`` of cands (sorted by length) for each right end ``b`` from ``i`` up, while the
        batch fits the batch size, the token budget and the seed's deadline -> (b, n, n_max, per-item time
        at b's length, estimated batch time, summed ``est_cost`` of ``[i, b]``)."""
        bmax, budget = self.cfg.max_batch_size, self.budget
        c0, c1, c2, c3 = (float(x) for x in self.cost.coef)
        right_val = 0.0
        for b in range(i, hi):
            length = max(1, cands[b].length)
            right_val += cands[b].est_cost
            n_max = max(1, min(bmax, budget // length))
            n = b - i + 1
            if n > n_max:
                return
            per_item = c1 + length * (c2 + length * c3)
            t = max(c0 + n * per_item, 1e-9)
            if b > i and now + t > deadline:
                return
            yield b, n, n_max, per_item, t, right_val

    def _window(
        self, cands: list[WorkItem], i: int, lo: int, hi: int, now: float, deadline: float
    ) -> tuple[float, int, int, bool]:
        """Best window [a, b] of cands[lo:hi] (sorted by length) containing i -> (score, a, b, full).

        The score is the window's efficiency: the sum of its items' ideal costs (each item's share of a full
        batch at its own length, ``est_cost``) divided by the estimated time of the padded batch. Short items
        riding in a batch padded to a long one lower it, as does a small batch's fixed overhead. For each
        right end ``b`` the window grows downwards while that raises the efficiency (which is unimodal,
        since items get shorter). ``full``: it cannot or should not grow further.
        """
        best = (-1.0, i, i, False)
        for b, n, n_max, per_item, t, right_val in self._right_ends(cands, i, hi, now, deadline):
            val, a = right_val, i
            score = val / t
            stopped = False
            while a > lo and n < n_max:
                v2, t2 = val + cands[a - 1].est_cost, t + per_item
                s2 = v2 / t2
                if s2 < score:
                    stopped = True
                    break
                a, n, val, t, score = a - 1, n + 1, v2, t2, s2
            if score > best[0]:
                best = (score, a, b, stopped or n >= n_max)
        return best

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
        # t[j, k-1]: estimated time of the batch cands[j-k+1 : j+1] (k items padded to lens[j]), weighted by
        # the cross-bucket factor for planning; inf where it does not exist or does not fit.
        end = np.arange(m)[:, None]
        start = end - k + 1
        fits = (start >= 0) & (k <= cap[:, None])
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
        i = cands.index(seed)
        if self.cfg.scheduler == "adaptive-v1":
            _, a, b, full = self._v1_window(cands, i, now, seed.deadline)
        else:
            a, b, full = self._plan(cands, i, now, seed.deadline)
        chosen = cands[a : b + 1]
        return chosen, chosen[-1].length, full

    def _v1_window(
        self, cands: list[WorkItem], i: int, now: float, deadline: float
    ) -> tuple[float, int, int, bool]:
        """``adaptive-v1``: the most efficient window around cands[i] in its bucket, or across buckets when
        that is ``cross_bucket_gain`` more efficient and the bucket's window is not full."""
        lo_len, hi_len = self.buckets.range_of(cands[i].length)
        lengths = [c.length for c in cands]
        lo = bisect.bisect_left(lengths, lo_len)
        hi = bisect.bisect_right(lengths, hi_len)
        best = self._window(cands, i, lo, hi, now, deadline)
        if not best[3] and (lo > 0 or hi < len(cands)):
            alt = self._window(cands, i, 0, len(cands), now, deadline)
            if alt[0] > best[0] * (1.0 + self.cfg.cross_bucket_gain):
                best = alt
        return best

    def try_form(self) -> Batch | float | None:
        """A batch if one should run now; else the clock time to re-check (float) or None (queue empty)."""
        now = self.clock()
        self._sweep(now)
        if not self._items:
            return None
        if not self._closed and self.cfg.scheduler != "adaptive-v1":
            # No batch can be full with fewer items than the longest one's batch holds, nor due before the
            # queue's oldest item or at risk before its earliest deadline: then skip forming one. (A window
            # of adaptive-v1 is also full when it stops growing.)
            due, urgent_at = self._dispatch_times(self._items)
            longest = max(it.length for it in self._items)
            n_max = max(1, min(self.cfg.max_batch_size, self.budget // max(1, longest)))
            if len(self._items) < n_max and now < due and now < urgent_at:
                return min(due, urgent_at)
        chosen, padded, full = self._form(now)
        due, urgent_at = self._dispatch_times(chosen)
        if full or self._closed or now >= due or now >= urgent_at:
            self._remove(chosen)
            return Batch(items=chosen, padded_length=max(1, padded), formed_at=now)
        return min(due, urgent_at)

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
        # fitted to c0 ~ 0 (after a burst of large batches) cannot leave a backlog to small batches.
        if batch.size <= 2:
            excess = seconds - self.cost.predict(batch.size, batch.padded_length)
            self.excess_s += a * (excess - self.excess_s)
        self.cost.observe(batch.size, batch.padded_length, seconds)
        self.recent_batch_s = (
            seconds if self.recent_batch_s == 0 else (1 - a) * self.recent_batch_s + a * seconds
        )

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


# ----------------------------------------------------------------------------------------------------------
# running a batch with split-and-retry


@dataclass
class SplitStats:
    splits: int = 0
    ooms: int = 0


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


# ----------------------------------------------------------------------------------------------------------
# worker


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
        t0 = time.perf_counter()
        out = run_with_split(self.predict, [i.payload for i in batch.items], stats)
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
            q.in_flight_s = q.cost.predict(batch.size, batch.padded_length)
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
            if self.sink is not None:
                try:
                    self.sink.on_batch(batch, seconds, stats)
                except Exception:
                    log.exception("batch sink failed")
