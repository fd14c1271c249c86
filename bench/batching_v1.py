"""Experiments of the batching core kept as benchmark baselines, out of the server (issue 28).

* :class:`V1Queue` -- ``adaptive-v1``, the adaptive scheduler before the tail work of issue #15: instead of
  the least-total-time plan, step 3 of batch formation (modelserver/batching.py) scores every window of
  neighbours around the seed by its efficiency (the ideal cost of its items at full batches over the padded
  batch's estimated time) and takes the best, preferring the seed's bucket (a window crossing a bucket
  bound must be ``cross_bucket_gain`` more efficient). It forms a batch every time the worker asks (no
  early wait while no batch can be full: a window is also full when it stops growing).
* :class:`StratifiedCostModel` -- a :class:`CostModel` that keeps the most recent ``window // 16``
  observations per cell of (log2 batch size, log2 padded length) instead of one ring of the last
  ``window``: observations at other sizes and lengths stay in the fit until newer ones of the same cell
  replace them -- including stale ones: on the benchmark machine the warm-up's (four servers warming up at
  once) kept ``c0`` at 34 ms against 11 ms measured by the ring, and the least-time plan, trusting it,
  padded wide batches for 8% less throughput. The queue uses the ring.

:func:`make_queue` builds the queue of a scheduler name (``adaptive``, ``adaptive-v1``, ``fifo``) for
bench/serving_sim.py, the unit tests and bench/serving_probe.py (``--v1``: the server with this queue).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from modelserver.batch_cost import CostModel
from modelserver.batching import BatchingConfig, BatchQueue, Clock, WorkItem

SCHEDULERS = ("adaptive", "adaptive-v1", "fifo")


class V1Queue(BatchQueue):
    """The server's queue with ``adaptive-v1``'s batch formation."""

    def _not_yet(self, now: float) -> float | None:
        return None

    def _plan(self, cands: list[WorkItem], s: int, now: float, deadline: float) -> tuple[int, int, bool]:
        """The most efficient window around cands[s] in its bucket, or across buckets when that is
        ``cross_bucket_gain`` more efficient and the bucket's window is not full -> (a, b, full)."""
        lo_len, hi_len = self.buckets.range_of(cands[s].length)
        lengths = [c.length for c in cands]
        lo = bisect.bisect_left(lengths, lo_len)
        hi = bisect.bisect_right(lengths, hi_len)
        best = self._window(cands, s, lo, hi, now, deadline)
        if not best[3] and (lo > 0 or hi < len(cands)):
            alt = self._window(cands, s, 0, len(cands), now, deadline)
            if alt[0] > best[0] * (1.0 + self.cfg.cross_bucket_gain):
                best = alt
        return best[1], best[2], best[3]

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


class StratifiedCostModel(CostModel):
    """:class:`CostModel` fitted on the latest observations of each (log2 n, log2 L) cell."""

    def __init__(self, window: int = 512, refit_every: int = 8) -> None:
        super().__init__(window, refit_every)
        self._cells: dict[tuple[int, int], deque[tuple[int, int, float, int]]] = {}
        self._cell_size = max(8, window // 16)

    def _keep(self, ob: tuple[int, int, float, int]) -> None:
        cell = (ob[0].bit_length(), ob[1].bit_length())
        self._cells.setdefault(cell, deque(maxlen=self._cell_size)).append(ob)

    def observations(self) -> list[tuple[int, int, float, int]]:
        return [ob for cell in self._cells.values() for ob in cell]


def make_queue(
    scheduler: str,
    config: BatchingConfig | None = None,
    clock: Clock = time.monotonic,
    cost_model: CostModel | None = None,
    **kw: Any,
) -> BatchQueue:
    """The queue of ``scheduler`` (one of :data:`SCHEDULERS`) on ``config`` (or a default one) changed by
    ``kw``."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}, expected one of {SCHEDULERS}")
    cfg = dataclasses.replace(
        config or BatchingConfig(), scheduler="fifo" if scheduler == "fifo" else "adaptive", **kw
    )
    cls = V1Queue if scheduler == "adaptive-v1" else BatchQueue
    return cls(cfg, clock=clock, cost_model=cost_model)
