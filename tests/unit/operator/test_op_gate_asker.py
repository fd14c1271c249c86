"""The gate asker (modeldeploy.gates) against a real HTTP server on 127.0.0.1: 200 opens, anything else
keeps the gate closed with a one-line reason that tells the class of the failure and nothing of the
network, a hanging gate never blocks the caller, an answer that changed asks for a reconcile of its
owner."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.receiver import Receiver, receivers
from modeldeploy.gates import GateAsker, unreachable
from modeldeploy.notify import namespace_key, verify
from modeldeploy.rollout_types import GateAnswer

KEY = b"operator-signing-key"


@pytest.fixture
def serve() -> Iterator[Any]:
    with receivers() as start:
        yield lambda status=200, hang=False: start(status, hang, "/confirm/secret-path")


@pytest.fixture
def asker() -> Iterator[tuple[GateAsker, list[tuple[str, str]]]]:
    done: list[tuple[str, str]] = []
    a = GateAsker(on_done=lambda ns, name: done.append((ns, name)), refresh=0.2, signing_key=KEY).start()
    yield a, done
    a.stop()


def answer(a: GateAsker, url: str, timeout: float = 2.0, wait: float = 10.0) -> GateAnswer:
    """Ask until an answer is in (each call returns at once)."""
    end = time.monotonic() + wait
    while True:
        got = a.ask("team-a", "echo", "5d7f", "beforeFirstStep", url, timeout)
        if got is not None:
            return got
        assert time.monotonic() < end, "no answer"
        time.sleep(0.02)


def test_200_opens_and_the_request_says_which_gate_of_which_rollout(serve, asker):
    a, done = asker
    g = serve(200)
    assert answer(a, g.url) == GateAnswer(True, "HTTP 200")
    _, headers, body = g.got[0]
    assert json.loads(body) == {
        "namespace": "team-a",
        "name": "echo",
        "revision": "5d7f",
        "gate": "beforeFirstStep",
    }
    assert headers["content-type"] == "application/json"
    assert verify(namespace_key(KEY, "team-a"), "gate", headers, body)
    assert not verify(namespace_key(KEY, "team-a"), "notification", headers, body)
    assert done == [("team-a", "echo")]


@pytest.mark.parametrize("status", [403, 500, 204, 302])
def test_anything_but_200_stays_closed_with_the_status(serve, asker, status):
    a, _ = asker
    g = serve(status)
    assert answer(a, g.url) == GateAnswer(False, f"HTTP {status}")
    time.sleep(0.3)
    assert len(g.got) >= 1 and all(
        h.get("host", "").startswith("127.0.0.1") for _, h, _ in g.got
    )  # no redirect


def test_a_closed_gate_is_asked_again_and_opening_it_asks_for_a_reconcile(serve, asker):
    a, done = asker
    g = serve(403)
    assert not answer(a, g.url).open
    assert done == [("team-a", "echo")]
    g.status = 200
    end = time.monotonic() + 10
    while not answer(a, g.url).open:
        assert time.monotonic() < end, "never asked again"
        time.sleep(0.05)
    assert len(g.got) >= 2 and done == [("team-a", "echo")] * 2  # one reconcile per change of answer


def test_a_hanging_gate_never_blocks_the_caller_and_stays_closed(serve, asker):
    a, _ = asker
    g = serve(hang=True)
    started = time.monotonic()
    assert a.ask("team-a", "echo", "5d7f", "beforeFirstStep", g.url, 0.5) is None
    assert time.monotonic() - started < 0.05
    got = answer(a, g.url, timeout=0.5)
    assert got == GateAnswer(False, unreachable(0.5))
    # asked again while the last ask hangs: one at a time, never a wait
    for _ in range(20):
        t = time.monotonic()
        assert a.ask("team-a", "echo", "5d7f", "beforeFirstStep", g.url, 0.5) is not None
        assert time.monotonic() - t < 0.05
    assert a.in_flight() <= 1


def test_a_refused_connection_and_a_timeout_read_the_same_and_carry_no_os_error_text(serve, asker):
    """The reason lands in the author's status and Events: were it the errno text (or were a refusal
    told sooner than a timeout), gates would tell the author which ports answer where the operator
    stands. The detail is in the operator's log only."""
    a, _ = asker
    s = Receiver()
    port = s.server_address[1]
    s.server_close()  # nothing listens there now
    hanging = serve(hang=True)
    asked = time.monotonic()
    refused = answer(a, f"http://127.0.0.1:{port}/x", timeout=1.0)
    took = time.monotonic() - asked
    timed_out = answer(a, hanging.url, timeout=1.0)
    assert refused == timed_out == GateAnswer(False, unreachable(1.0))
    for word in ("refused", "errno", "connect", "111", "127.0.0.1", str(port), "timeout", "ssl"):
        assert word not in refused.reason.lower(), (word, refused.reason)
    assert took >= 0.95, took  # told no sooner than a timeout would be


def test_a_gate_url_that_does_not_parse_is_closed_without_asking_and_never_raises(asker):
    a, _ = asker
    for url in ("http://[::1/x", "http://h:99999/"):  # admitted by the CRD's pattern before its URL rule
        got = a.ask("team-a", "echo", "5d7f", "beforeFirstStep", url, 2.0)
        assert got is not None and not got.open
        assert got.reason.startswith("spec.rollout.gates.beforeFirstStep.url does not parse"), got
    assert a.in_flight() == 0


def test_a_host_the_operator_does_not_allow_is_closed_without_asking(serve):
    g = serve(200)
    a = GateAsker(allowed_hosts=["*.example.com"]).start()
    try:
        got = a.ask("team-a", "echo", "5d7f", "beforePromotion", g.url, 2.0)
        assert (
            got is not None
            and not got.open
            and "not allowed" in got.reason
            and "secret-path" not in got.reason
        )
        time.sleep(0.2)
        assert g.got == [] and a.in_flight() == 0
    finally:
        a.stop()
