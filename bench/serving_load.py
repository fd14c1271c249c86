"""A small, cheap HTTP/1.1 load generator (raw asyncio streams, keep-alive), closed and open loop.

It costs far less CPU per request than an HTTP client library, which matters on a 2-core machine where the
load generator shares the CPUs with the server it measures.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    completed: int = 0  # requests finished with 200 inside the measurement window
    items: int = 0  # items (texts) in those requests
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    #: every non-200 inside the window: (status, the server's ``{"error"}`` with numbers as N) -> count, so a
    #: run says which rule refused what (the door, the queue's admission, a deadline in the queue, ...);
    #: status 0 is a connection error, -1 a request the generator dropped
    failures: Counter[tuple[int, str]] = field(default_factory=Counter)
    #: open loop: (seconds from the window's start to the scheduled arrival, latency s, status) per request
    timeline: list[tuple[float, float, int]] = field(default_factory=list)

    def fail(self, status: int, body: bytes) -> None:
        self.failures[status, error_class(body)] += 1

    @property
    def errors(self) -> dict[int, int]:
        """the failures' count by status"""
        out: Counter[int] = Counter()
        for (status, _), n in self.failures.items():
            out[status] += n
        return dict(out)

    @property
    def reasons(self) -> dict[str, int]:
        """ "status error class" -> count of the failures"""
        return {f"{st} {cls}".rstrip(): n for (st, cls), n in self.failures.items()}

    @property
    def rps(self) -> float:
        return self.completed / self.seconds if self.seconds else 0.0

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")


def error_class(body: bytes) -> str:
    """The server's ``{"error": ...}`` with its numbers replaced by N (the class of a refusal), else ''."""
    m = re.search(rb'"error"\s*:\s*"((?:[^"\\]|\\.)*)"', body)
    return re.sub(r"\d+(\.\d+)?", "N", m.group(1).decode(errors="replace"))[:100] if m else ""


def build_request(host: str, path: str, body: bytes) -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        r, w = await asyncio.open_connection(host, port, limit=1 << 24)
        return cls(r, w)

    async def roundtrip(self, raw: bytes) -> int:
        return (await self.exchange(raw))[0]

    async def exchange(self, raw: bytes) -> tuple[int, bytes]:
        """Send one request, read its answer: (status, body)."""
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        body = await self.reader.readexactly(length) if length else b""
        return status, body

    def close(self) -> None:
        self.writer.close()


async def closed_loop(
    host: str,
    port: int,
    requests: Sequence[tuple[bytes, int]],
    concurrency: int,
    warmup_s: float,
    duration_s: float,
) -> LoadResult:
    """``concurrency`` connections each send the next request when the previous one is answered.
    ``requests`` are (raw request bytes, items) cycled in order."""
    res = LoadResult()
    feed: Iterator[tuple[bytes, int]] = itertools.cycle(requests)
    t_start = time.perf_counter()
    t_measure = t_start + warmup_s
    t_end = t_measure + duration_s

    async def worker() -> None:
        conn = await Conn.open(host, port)
        try:
            while True:
                raw, n = next(feed)
                t0 = time.perf_counter()
                if t0 >= t_end:
                    return
                try:
                    status, body = await conn.exchange(raw)
                except (OSError, asyncio.IncompleteReadError):
                    res.fail(0, b"")
                    conn.close()
                    conn = await Conn.open(host, port)
                    continue
                t1 = time.perf_counter()
                if t1 < t_measure or t1 > t_end:
                    continue  # throughput: completions inside the window
                if status == 200:
                    res.completed += 1
                    res.items += n
                    if t0 >= t_measure:  # latency: requests sent inside the window
                        res.latencies.append(t1 - t0)
                else:
                    res.fail(status, body)
        finally:
            conn.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    res.seconds = duration_s
    return res


async def open_loop(
    host: str,
    port: int,
    requests: Sequence[tuple[bytes, int]],
    rate: float,
    duration_s: float,
    warmup_s: float = 2.0,
    seed: int = 0,
    max_conns: int = 1024,
) -> LoadResult:
    """Poisson arrivals at ``rate``/s; latency is counted from the scheduled arrival time, so a slow server
    cannot hide queueing in the generator (no coordinated omission)."""
    rng = random.Random(seed)
    res = LoadResult()
    idle: list[Conn] = []
    n_conns = 0
    feed = itertools.cycle(requests)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    t_measure = t0 + warmup_s
    t_end = t_measure + duration_s
    tasks: set[asyncio.Task[None]] = set()

    async def one(raw: bytes, n: int, scheduled: float) -> None:
        nonlocal n_conns
        if idle:
            conn = idle.pop()
        else:
            n_conns += 1
            conn = await Conn.open(host, port)
        try:
            status, body = await conn.exchange(raw)
        except (OSError, asyncio.IncompleteReadError):
            res.fail(0, b"")
            conn.close()
            return
        done = loop.time()
        idle.append(conn)
        if t_measure <= scheduled < t_end:
            res.timeline.append((scheduled - t_measure, done - scheduled, status))
            if status == 200:
                res.completed += 1
                res.items += n
                res.latencies.append(done - scheduled)
            else:
                res.fail(status, body)

    t = t0
    while True:
        t += rng.expovariate(rate)
        if t >= t_end:
            break
        delay = t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(tasks) >= max_conns:
            res.fail(-1, b"")  # generator saturated: count as dropped
            continue
        raw, n = next(feed)
        task = asyncio.ensure_future(one(raw, n, t))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    for c in idle:
        c.close()
    res.seconds = duration_s
    return res
