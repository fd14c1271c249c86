"""Measurements run off the reconcile path: a request never waits, a finished measurement is handed out
once and wakes its ModelDeployment, a hanging Prometheus costs a deadline and nothing else, and stopping
never waits for Prometheus -- against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from modeldeploy.analysis import JudgeParams, Query
from modeldeploy.measurements import MeasurementRunner
from modeldeploy.promclient import PromConfig

pytestmark = pytest.mark.timeout(20)

KEY = ("ns", "m")


class Prometheus(ThreadingHTTPServer):
    """Answers every query with ``value`` unless ``hang`` is set (then it accepts and never answers)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.value = "0.5"
        self.hang = threading.Event()
        self.release = threading.Event()
        self.asked: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: Prometheus

    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        if self.server.hang.is_set():
            self.server.release.wait(30)
            return
        if urlsplit(self.path).path.endswith("/query_range"):
            args = parse_qs(urlsplit(self.path).query)
            # a series per revision: 10 ms for the stable ("s1"), 13 ms for anything else
            value = "10" if 'revision="s1"' in args["query"][0] else "13"
            values = [[0, value]] * 12
            data: dict[str, object] = {"resultType": "matrix", "result": [{"metric": {}, "values": values}]}
        else:
            data = {"resultType": "vector", "result": [{"metric": {}, "value": [0, self.server.value]}]}
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prom() -> Iterator[Prometheus]:
    server = Prometheus()
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.release.set()
    server.shutdown()


@pytest.fixture
def woken() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def runner(woken: list[tuple[str, str]]) -> Iterator[MeasurementRunner]:
    r = MeasurementRunner(
        lambda url, timeout: PromConfig(url, timeout=timeout), on_done=lambda ns, n: woken.append((ns, n))
    )
    r.start()
    yield r
    r.stop()


def q(metric: str = "requests") -> Query:
    return Query(metric, f"sum(x_{metric.replace('-', '_')})", 1.0, "min", "rev1")


def wait_for(pred, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.02)


def test_a_request_returns_at_once_and_the_finished_measurement_is_handed_out_once(prom, runner, woken):
    queries = [q("requests"), q("error-rate")]
    assert runner.request(KEY, prom.url, 5.0, queries) is None  # pending: started, not waited for
    wait_for(lambda: woken)
    assert woken == [KEY]  # its ModelDeployment is asked to reconcile
    samples = runner.request(KEY, prom.url, 5.0, queries)
    assert samples is not None and [s.value for s in samples] == [0.5, 0.5]
    assert [s.query.metric for s in samples] == ["requests", "error-rate"]
    # handed out once: the next window is a new measurement
    assert runner.request(KEY, prom.url, 5.0, queries) is None


def test_a_hanging_prometheus_costs_a_deadline_per_window_and_never_a_waiting_caller(prom, runner, woken):
    prom.hang.set()
    started = time.monotonic()
    for _ in range(50):  # 10 canaries x 5 reconciles: every call returns at once
        assert runner.request(KEY, prom.url, 0.5, [q()]) is None
    assert time.monotonic() - started < 0.5
    assert runner.in_flight() == 1  # asked once, not once per call
    wait_for(lambda: woken, timeout=3.0)
    [sample] = runner.request(KEY, prom.url, 0.5, [q()]) or [None]
    assert sample is not None and sample.value is None
    assert sample.error is not None and sample.error.startswith("timeout:")


def test_stop_returns_promptly_while_a_query_hangs(prom, woken):
    r = MeasurementRunner(lambda url, timeout: PromConfig(url, timeout=timeout), on_done=None)
    r.start()
    prom.hang.set()
    r.request(KEY, prom.url, 30.0, [q()])
    wait_for(lambda: prom.asked)
    started = time.monotonic()
    r.stop()
    assert time.monotonic() - started < 2.5


def test_a_measurement_nobody_collects_goes_stale(prom, woken):
    now = [0.0]
    r = MeasurementRunner(
        lambda url, timeout: PromConfig(url, timeout=timeout),
        on_done=lambda ns, n: woken.append((ns, n)),
        max_age=30.0,
        clock=lambda: now[0],
    )
    r.start()
    try:
        assert r.request(KEY, prom.url, 5.0, [q()]) is None
        wait_for(lambda: woken)
        now[0] = 31.0  # the window it measured is long gone: measured again, not judged on old data
        assert r.request(KEY, prom.url, 5.0, [q()]) is None
    finally:
        r.stop()


def test_latest_serves_the_newest_answer_and_refreshes_it_in_the_background(prom, runner, woken):
    assert runner.latest(KEY, prom.url, 5.0, q("copying"), refresh=0.1) is None
    wait_for(lambda: woken)
    s = runner.latest(KEY, prom.url, 5.0, q("copying"), refresh=0.1)
    assert s is not None and s.value == 0.5
    prom.value = "2"
    time.sleep(0.15)
    runner.latest(KEY, prom.url, 5.0, q("copying"), refresh=0.1)  # older than refresh: asked again
    wait_for(lambda: (runner.latest(KEY, prom.url, 5.0, q("copying"), refresh=10) or s).value == 2.0)


def test_a_judged_query_asks_the_window_of_canary_and_stable_as_range_queries(prom, woken):
    r = MeasurementRunner(
        lambda url, timeout: PromConfig(url, timeout=timeout),
        on_done=lambda ns, n: woken.append((ns, n)),
        wall=lambda: 1_000_000.0,
    )
    r.start()
    try:
        params = JudgeParams('x{revision="s1"}', 30.0, 2.0, 0.98, 6, True)
        judged = Query("judge-latency-ms", 'x{revision="c1"}', 0.2, "max", "c1", judge=params)
        assert r.request(KEY, prom.url, 5.0, [judged]) is None
        wait_for(lambda: woken)
        samples = r.request(KEY, prom.url, 5.0, [judged])
    finally:
        r.stop()
    assert samples is not None
    (s,) = samples
    assert s.error is None and s.series == (13.0,) * 12 and s.baseline == (10.0,) * 12
    asked = [parse_qs(urlsplit(p).query) for p in prom.asked]
    assert {a["query"][0] for a in asked} == {'x{revision="c1"}', 'x{revision="s1"}'}
    # the last 30 s in samples of 2 s: the first sample covers (end - 30 s, end - 28 s]
    assert all(
        a["start"] == ["999972.000"] and a["end"] == ["1000000.000"] and a["step"] == ["2"] for a in asked
    )
