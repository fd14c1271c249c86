"""Events are posted off the reconcile path, in order, and never block or fail it."""

from __future__ import annotations

import threading
from typing import Any

from modeldeploy import metrics
from modeldeploy.events import PostInBackground, PostNow


class Recording:
    def __init__(self, gate: threading.Event | None = None, fail: bool = False) -> None:
        self.posted: list[str] = []
        self.gate = gate
        self.fail = fail

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.fail:
            raise RuntimeError("apiserver says no")
        self.posted.append(obj["reason"])
        return obj


def ev(reason: str) -> dict[str, Any]:
    return {"kind": "Event", "reason": reason, "message": f"{reason} happened"}


def test_post_now_posts_before_returning():
    kube = Recording()
    PostNow(kube).post(ev("Created"))
    assert kube.posted == ["Created"]


def test_background_posts_in_order_without_blocking_the_caller_and_flushes_on_close():
    gate = threading.Event()
    kube = Recording(gate)
    sink = PostInBackground(kube)
    for i in range(5):
        sink.post(ev(f"E{i}"))  # returns although the apiserver has not answered yet
    assert kube.posted == []
    gate.set()
    assert sink.close(timeout=10)
    assert kube.posted == [f"E{i}" for i in range(5)]


def test_a_full_queue_drops_and_counts_instead_of_blocking():
    gate = threading.Event()
    kube = Recording(gate)
    sink = PostInBackground(kube, capacity=2)
    before = metrics.EVENTS_DROPPED._value.get()
    for i in range(6):  # one is being posted (blocked), two wait, the rest find the queue full
        sink.post(ev(f"E{i}"))
    dropped = metrics.EVENTS_DROPPED._value.get() - before
    assert 3 <= dropped <= 4
    gate.set()
    assert sink.close(timeout=10)
    assert len(kube.posted) == 6 - dropped and kube.posted[0] == "E0"


def test_a_failed_post_is_counted_and_the_next_still_goes():
    kube = Recording(fail=True)
    sink = PostInBackground(kube)
    before = metrics.EVENTS_FAILED._value.get()
    sink.post(ev("A"))
    sink.post(ev("B"))
    assert sink.close(timeout=10)
    assert metrics.EVENTS_FAILED._value.get() - before == 2
