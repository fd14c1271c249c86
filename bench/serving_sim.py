"""Machine-independent evaluation of batch formation: the real :class:`BatchQueue` driven on a simulated
clock by a closed loop of clients, with batch latency given by a cost function ``t(n, L)`` (for example the
coefficients the server learned on the benchmark machine). No model, no HTTP, no noise: it isolates what the
scheduler contributes, which the shared 2-core benchmark machine cannot measure precisely.

    python -m bench.serving_sim
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from modelserver.batching import Batch, BatchingConfig, BatchQueue, WorkItem

from bench.batching_v1 import SCHEDULERS, make_queue

# Cost of all-MiniLM-L6-v2 on 2 CPU cores as learned by the server: seconds = c . [1, n, n*L, n*L^2].
MINILM_CPU = (8e-3, 4e-4, 1.27e-4, 4.4e-7)


@dataclass
class SimResult:
    items_per_s: float
    padding_ratio: float
    mean_batch: float
    max_wait_s: float


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _queue(scheduler: str, clock: _Clock, max_batch_size: int, token_budget: int) -> BatchQueue:
    """The server's queue (``adaptive-v1``: the benchmark's baseline, bench/batching_v1.py) with its default
    cost model, learned online as in the server."""
    return make_queue(
        scheduler,
        BatchingConfig(
            max_batch_size=max_batch_size, max_queue_delay_s=0.005, token_budget=token_budget, max_length=512
        ),
        clock=clock,
    )


def _next_batch(q: BatchQueue, clock: _Clock) -> Batch:
    """A closed loop's next batch: the clock moves to when the queue says one is due (never empty)."""
    got = q.try_form()
    while not isinstance(got, Batch):
        assert got is not None
        clock.t = max(clock.t, got) + 1e-6
        got = q.try_form()
    return got


def cost_fn(coef: Sequence[float]) -> Callable[[int, int], float]:
    c = np.asarray(coef, dtype=np.float64)
    return lambda n, length: float(c @ np.array([1.0, n, n * length, n * length * length]))


def short_lengths(n: int, seed: int = 5) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 25, size=n) + 2  # 4-24 words + [CLS]/[SEP]


def long_lengths(n: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(90) - 0.32, 0.8, size=n)), 8, 512).astype(int)


async def _simulate(
    lengths: np.ndarray,
    scheduler: str,
    cost: Callable[[int, int], float],
    clients: int,
    items: int,
    max_batch_size: int,
    token_budget: int,
) -> SimResult:
    clock = _Clock()
    q = _queue(scheduler, clock, max_batch_size, token_budget)
    loop = asyncio.get_running_loop()
    feed = iter(np.resize(lengths, items + clients + max_batch_size + 1))

    def new() -> WorkItem:
        return WorkItem(
            payload=None,
            length=int(next(feed)),
            deadline=clock() + 1e9,
            arrival=clock(),
            future=loop.create_future(),
        )

    q.submit([new() for _ in range(clients)])
    done, busy, pads, sizes, max_wait = 0, 0.0, [], [], 0.0
    while done < items:
        got = _next_batch(q, clock)
        t = cost(got.size, got.padded_length)
        max_wait = max(max_wait, max(clock.t - i.arrival for i in got.items))
        clock.t += t
        busy += t
        q.record(got, t)
        done += got.size
        pads.append(got.padding_ratio)
        sizes.append(got.size)
        q.submit([new() for _ in range(got.size)])
    return SimResult(done / busy, float(np.mean(pads)), float(np.mean(sizes)), max_wait)


@dataclass
class OpenLoopResult:
    """One open-loop (Poisson) phase: per-item latency (queue wait + batch time), seconds."""

    latencies: np.ndarray
    lengths: np.ndarray
    waits: np.ndarray
    max_batch_s: float
    bucket_bounds: list[int]
    coef_after_saturation: list[float]
    busy_share: float = 0.0
    mean_batch: float = 0.0

    def pct(self, q: float, mask: np.ndarray | None = None) -> float:
        xs = self.latencies if mask is None else self.latencies[mask]
        return float(np.percentile(xs, q)) if len(xs) else float("nan")

    @property
    def p50(self) -> float:
        return self.pct(50)

    @property
    def p99(self) -> float:
        return self.pct(99)

    @property
    def max_wait(self) -> float:
        return float(self.waits.max()) if len(self.waits) else 0.0

    def by_bucket(self) -> dict[str, dict[str, float]]:
        """p50/p99 latency and the longest queue wait per length bucket (the server's final bounds)."""
        out: dict[str, dict[str, float]] = {}
        lo = 0
        for hi in self.bucket_bounds:
            mask = (self.lengths > lo) & (self.lengths <= hi)
            if mask.any():
                out[f"{lo + 1}-{hi}"] = {
                    "items": int(mask.sum()),
                    "p50_ms": round(self.pct(50, mask) * 1000, 1),
                    "p99_ms": round(self.pct(99, mask) * 1000, 1),
                    "max_wait_ms": round(float(self.waits[mask].max()) * 1000, 1),
                }
            lo = hi
        return out


def _saturate(
    q: BatchQueue,
    clock: _Clock,
    new: Callable[[float], WorkItem],
    run: Callable[[Batch], float],
    clients: int,
    seconds: float,
) -> None:
    """Saturation: a closed loop of ``clients`` clients for ``seconds``; then the clients stop and what they
    still have queued is served."""
    end = clock.t + seconds
    q.submit([new(clock.t) for _ in range(clients)])
    while clock.t < end:
        batch = _next_batch(q, clock)
        run(batch)
        q.submit([new(clock.t) for _ in range(batch.size)])
    while (got := q.try_form()) is not None:
        if isinstance(got, Batch):
            run(got)
        else:
            clock.t = max(clock.t, got) + 1e-6


async def _simulate_open(
    lengths: np.ndarray,
    scheduler: str,
    cost: Callable[[int, int], float],
    rate: float,
    seconds: float,
    saturate_clients: int,
    saturate_s: float,
    max_batch_size: int,
    token_budget: int,
    seed: int,
    freeze_coef: Sequence[float] | None = None,
) -> OpenLoopResult:
    clock = _Clock()
    q = _queue(scheduler, clock, max_batch_size, token_budget)
    loop = asyncio.get_running_loop()
    rng = np.random.default_rng(seed)
    feed = iter(np.resize(lengths, 10_000_000))

    def new(at: float) -> WorkItem:
        return WorkItem(
            payload=None, length=int(next(feed)), deadline=at + 1e9, arrival=at, future=loop.create_future()
        )

    def run(batch: Batch) -> float:
        t = cost(batch.size, batch.padded_length)
        clock.t += t
        q.record(batch, t)
        return t

    if saturate_clients:  # phase 1 (optional)
        _saturate(q, clock, new, run, saturate_clients, saturate_s)
    if freeze_coef is not None:  # a mis-fitted cost model that stops learning (the scheduler's guard alone)
        q.cost.coef = np.asarray(freeze_coef, dtype=np.float64)
        q.cost.observe = lambda *a, **k: None  # type: ignore[method-assign]
    coef_after = [float(c) for c in q.cost.coef]
    # Phase 2: Poisson arrivals at `rate` for `seconds`.
    start = clock.t
    arrivals = start + np.cumsum(rng.exponential(1.0 / rate, size=int(rate * seconds * 1.5) + 10))
    arrivals = arrivals[arrivals < start + seconds]
    nxt = 0
    lat: list[float] = []
    lens: list[int] = []
    waits: list[float] = []
    max_batch = busy = 0.0
    batches = 0
    while nxt < len(arrivals) or q.depth:
        while nxt < len(arrivals) and arrivals[nxt] <= clock.t:
            at = float(arrivals[nxt])
            saved, clock.t = clock.t, at
            q.submit([new(at)])
            clock.t = saved
            nxt += 1
        got = q.try_form()
        upcoming = float(arrivals[nxt]) if nxt < len(arrivals) else math.inf
        if isinstance(got, Batch):
            formed = clock.t
            t = run(got)
            max_batch = max(max_batch, t)
            busy += t
            batches += 1
            for it in got.items:
                waits.append(formed - it.arrival)
                lat.append(clock.t - it.arrival)
                lens.append(it.length)
        elif got is None:
            clock.t = upcoming
        else:
            clock.t = min(max(clock.t, got) + 1e-6, upcoming)
    return OpenLoopResult(
        np.array(lat),
        np.array(lens),
        np.array(waits),
        max_batch,
        list(q.buckets.bounds),
        coef_after,
        busy / max(1e-9, clock.t - start),
        len(lat) / max(1, batches),
    )


def simulate_open(
    lengths: np.ndarray,
    scheduler: str,
    rate: float,
    seconds: float = 30.0,
    coef: Sequence[float] = MINILM_CPU,
    saturate_clients: int = 0,
    saturate_s: float = 15.0,
    max_batch_size: int = 64,
    token_budget: int = 8192,
    seed: int = 1,
    freeze_coef: Sequence[float] | None = None,
) -> OpenLoopResult:
    """Poisson arrivals at ``rate`` items/s for ``seconds`` of simulated time, after an optional saturation
    phase (``saturate_clients`` closed-loop clients for ``saturate_s``) on the same queue. ``freeze_coef``:
    from the open phase on, the queue's cost model has these coefficients and stops learning."""
    return asyncio.run(
        _simulate_open(
            lengths,
            scheduler,
            cost_fn(coef),
            rate,
            seconds,
            saturate_clients,
            saturate_s,
            max_batch_size,
            token_budget,
            seed,
            freeze_coef,
        )
    )


def simulate(
    lengths: np.ndarray,
    scheduler: str,
    coef: Sequence[float] = MINILM_CPU,
    clients: int = 128,
    items: int = 3000,
    max_batch_size: int = 64,
    token_budget: int = 8192,
) -> SimResult:
    return asyncio.run(
        _simulate(lengths, scheduler, cost_fn(coef), clients, items, max_batch_size, token_budget)
    )


def sorted_limit(lengths: np.ndarray, coef: Sequence[float] = MINILM_CPU, items: int = 3000) -> float:
    """Configuration (1) in the simulation: every item known in advance, sorted, best batch size."""
    cost = cost_fn(coef)
    xs = np.sort(np.resize(lengths, items))
    best = 0.0
    for bs in (4, 8, 16, 32, 64):
        t = sum(cost(len(xs[i : i + bs]), int(xs[i : i + bs].max())) for i in range(0, len(xs), bs))
        best = max(best, len(xs) / t)
    return best


def report(coef: Sequence[float] = MINILM_CPU) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name, lengths in (("short", short_lengths(5000)), ("long", long_lengths(5000))):
        lim = sorted_limit(lengths, coef)
        row: dict[str, float] = {"limit_items_per_s": round(lim, 1)}
        for sch in ("adaptive", "fifo"):
            r = simulate(lengths, sch, coef)
            row[f"{sch}_items_per_s"] = round(r.items_per_s, 1)
            row[f"{sch}_padding_ratio"] = round(r.padding_ratio, 3)
            row[f"{sch}_mean_batch"] = round(r.mean_batch, 1)
            row[f"{sch}_max_wait_s"] = round(r.max_wait_s, 3)
        row["adaptive/limit"] = round(row["adaptive_items_per_s"] / lim, 3)
        row["adaptive/fifo"] = round(row["adaptive_items_per_s"] / row["fifo_items_per_s"], 3)
        out[name] = row
    return out


def tail_report(
    coef: Sequence[float] = MINILM_CPU, seconds: float = 60.0, load: float = 0.7
) -> dict[str, dict[str, Any]]:
    """Per workload and scheduler: closed-loop peak (128 clients), then Poisson arrivals at ``load`` x
    ``adaptive``'s peak (as bench/serving.py does on the real server), the same offered rate for both
    adaptive schedulers (FIFO: peak only), on a fresh queue and on one that has just run 15 s at saturation
    (64 clients): p50/p99, the longest queue wait and the longest batch, overall and per length bucket."""
    out: dict[str, dict[str, Any]] = {}
    for name, lengths in (("short", short_lengths(5000)), ("long", long_lengths(5000))):
        peaks = {sch: simulate(lengths, sch, coef).items_per_s for sch in SCHEDULERS}
        rate = load * peaks["adaptive"]
        row: dict[str, Any] = {"rate_per_s": round(rate, 1)}
        for sch in SCHEDULERS:
            entry: dict[str, Any] = {"peak_items_per_s": round(peaks[sch], 1)}
            row[sch] = entry
            if sch == "fifo":  # its peak is below the offered rate: the queue would only grow
                continue
            for phase, sat in (("fresh", 0), ("after_saturation", 64)):
                r = simulate_open(lengths, sch, rate, seconds, coef, saturate_clients=sat)
                entry[phase] = {
                    "p50_ms": round(r.p50 * 1000, 1),
                    "p99_ms": round(r.p99 * 1000, 1),
                    "p99/p50": round(r.p99 / r.p50, 2),
                    "max_wait_ms": round(r.max_wait * 1000, 1),
                    "max_batch_ms": round(r.max_batch_s * 1000, 1),
                    "max_wait/max_batch": round(r.max_wait / r.max_batch_s, 2),
                    "busy_share": round(r.busy_share, 3),
                    "mean_batch": round(r.mean_batch, 1),
                    "buckets": r.by_bucket(),
                }
        row["adaptive/adaptive-v1 peak"] = round(peaks["adaptive"] / peaks["adaptive-v1"], 3)
        row["adaptive/fifo peak"] = round(peaks["adaptive"] / peaks["fifo"], 3)
        out[name] = row
    return out


if __name__ == "__main__":
    for wl, row in report().items():
        print(wl, row)
    for wl, tail in tail_report().items():
        print(wl, tail["rate_per_s"], tail["adaptive/adaptive-v1 peak"], tail["adaptive/fifo peak"])
        for sch in SCHEDULERS[:2]:
            for phase in ("fresh", "after_saturation"):
                e = {k: v for k, v in tail[sch][phase].items() if k != "buckets"}
                print(f"  {sch:12} {phase:17} {e}")
