"""The e2e load generator (tests/e2e/canary_support.py) hides nothing and computes no routing: it sends
where a client would, records who answered from the answer's ``x-modeldeploy-revision`` header, counts
a refused connection or a 4xx as a failure, and a dead worker fails the run. The split test is an exact
binomial test. A small HTTP server on loopback stands in for the Service or the gateway."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import httpx
import pytest

from tests.e2e.canary_support import (
    NO_REVISION,
    LoadGenerator,
    LoadGeneratorError,
    Record,
    binomial_p_value,
)


class _Handler(BaseHTTPRequestHandler):
    """Answers like a model server of revision ``r1`` (or ``r2`` for every third request), or, with
    ``x-test: GATEWAY``, like a gateway with no backend: 503 without the revision header; a POISON text
    or ``x-test: BROKEN`` is r1's 500."""

    hosts: ClassVar[list[str]] = []
    n: ClassVar[int] = 0
    lock: ClassVar[threading.Lock] = threading.Lock()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        text = body["inputs"][0]["data"][0]
        with self.lock:
            type(self).hosts.append(self.headers["Host"])
            type(self).n += 1
            n = type(self).n
        if "GATEWAY" in self.headers.get("x-test", ""):
            self._answer(503, b"no available server", None)
        elif "POISON" in text or "BROKEN" in self.headers.get("x-test", ""):
            self._answer(500, b'{"error": "boom"}', "r1")
        else:
            rev = "r2" if n % 3 == 0 else "r1"
            self._answer(200, json.dumps({"model_version": rev[-1], "outputs": []}).encode(), rev)

    def _answer(self, code: int, payload: bytes, revision: str | None) -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(payload)))
        if revision:
            self.send_header("x-modeldeploy-revision", revision)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    _Handler.hosts, _Handler.n = [], 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def run(load: LoadGenerator, n: int) -> LoadGenerator:
    load.start()
    deadline = time.monotonic() + 10
    while len(load.snapshot()) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    load.stop()
    return load


def _gen(url: str, n: int, **kw: Any) -> LoadGenerator:
    return LoadGenerator(None, "ns", "m", url=url, max_requests=n, max_seconds=10, pause=0, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "kind"),
    [(200, "ok"), (404, "http_4xx"), (429, "http_4xx"), (503, "http_5xx"), (0, "connection_error")],
)
def test_every_attempt_has_a_kind_and_only_200_is_ok(code: int, kind: str) -> None:
    assert Record(0.0, "r", code).kind == kind


def test_the_revision_is_what_the_answer_says(server: str) -> None:
    load = run(_gen(server, 30, workers=2), 30)
    assert len(load.snapshot()) == 30
    assert load.by_kind() == {"ok": 30}
    assert load.by_revision() == {"r1": 20, "r2": 10}
    assert {(r.revision, r.version) for r in load.snapshot()} == {("r1", "1"), ("r2", "2")}


def test_the_gateways_own_503_is_a_failure_answered_by_no_revision(server: str) -> None:
    load = run(_gen(server, 10, workers=1, headers={"x-test": "GATEWAY"}), 10)
    assert load.by_kind() == {"http_5xx": 10} and load.by_revision() == {NO_REVISION: 10}
    assert load.failed_share() == 1.0


def test_a_refused_connection_is_recorded_as_a_failure_not_skipped() -> None:
    with socket.socket() as s:  # a port nobody listens on: refused, like a Service with no endpoint
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    load = run(_gen(f"http://127.0.0.1:{port}", 5, workers=1), 5)
    assert load.by_kind() == {"connection_error": 5} and load.by_revision() == {NO_REVISION: 5}
    assert all((r.error or "").startswith("ConnectError") for r in load.snapshot())


def test_the_host_header_names_the_route(server: str) -> None:
    run(_gen(server, 5, workers=1, host="echo.ns.test", mode="gatewayAPI"), 5)
    assert set(_Handler.hosts) == {"echo.ns.test"}


def test_poison_answers_are_the_servers_failures(server: str) -> None:
    load = run(_gen(server, 40, workers=2, poison_share=1.0), 40)
    assert load.by_kind() == {"http_5xx": 40} and load.by_revision() == {"r1": 40}


def test_a_worker_that_dies_fails_the_run(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    load = _gen(server, 10, workers=2)

    def boom(client: httpx.Client, text: str) -> Record:
        raise KeyError("a bug in the load generator")

    monkeypatch.setattr(load, "send", boom)
    load.start()
    time.sleep(0.3)
    with pytest.raises(LoadGeneratorError, match="worker 0 died"):
        load.stop()


def test_only_stable_answers_lists_everything_else() -> None:
    load = _gen("http://unused", 1)
    load.records = [
        Record(1.0, "v1", 200, "1"),
        Record(2.0, "v2", 200, "2"),  # the other revision
        Record(3.0, "v1", 503, None),  # a failure from the right one
        Record(4.0, None, 0),  # refused
        Record(5.0, "v1", 200, "1"),
    ]
    wrong = load.answered_only_by("v1", "1", since=2.0)
    assert [r.t for r in wrong] == [2.0, 3.0, 4.0]


def test_binomial_test_exact_values() -> None:
    # X ~ Bin(10, 0.5): P(X <= 3) + P(X >= 7) = 2 * (1 + 10 + 45 + 120) / 1024
    assert binomial_p_value(3, 10, 0.5) == pytest.approx(352 / 1024)
    assert binomial_p_value(5, 10, 0.5) == pytest.approx(1.0)
    # a third of 300 requests when a third is asked: fine; a tenth: rejected
    assert binomial_p_value(100, 300, 1 / 3) > 0.5
    assert binomial_p_value(30, 300, 1 / 3) < 1e-12
    # degenerate weights: 0 % and 100 % admit no exception at all
    assert binomial_p_value(0, 50, 0.0) == 1.0 and binomial_p_value(1, 50, 0.0) == 0.0
    assert binomial_p_value(50, 50, 1.0) == 1.0 and binomial_p_value(49, 50, 1.0) == 0.0
    assert binomial_p_value(0, 0, 0.3) == 1.0


def test_wait_serving_waits_for_an_answer_and_records_nothing(server: str) -> None:
    load = _gen(server, 5, workers=1).wait_serving(timeout=5)
    assert load.snapshot() == []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(LoadGeneratorError, match="not serving"):
        _gen(f"http://127.0.0.1:{port}", 5).wait_serving(timeout=1)
    assert time.monotonic() - started < 5


def test_wait_serving_waits_out_a_gateway_error_but_not_an_error_a_model_server_answered(server: str) -> None:
    # the gateway's own 503 (no revision header) is a route not there yet: waited out, kept in warmup
    gateway = _gen(server, 5, headers={"x-test": "GATEWAY"})
    with pytest.raises(LoadGeneratorError, match="not serving"):
        gateway.wait_serving(timeout=1)
    assert gateway.warmup and all(r.code == 503 and r.revision is None for r in gateway.warmup)
    # a model server answering an error is a failure at once, not something to retry for 30 s
    broken = _gen(server, 5, headers={"x-test": "BROKEN"})
    started = time.monotonic()
    with pytest.raises(LoadGeneratorError, match="revision r1 answered 500"):
        broken.wait_serving(timeout=20)
    assert time.monotonic() - started < 2 and len(broken.warmup) == 1
