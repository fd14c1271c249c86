"""Events are posted off the reconcile path, in order, and never block or fail it."""

from __future__ import annotations

import threading
from typing import Any

from modeldeploy import metrics
from modeldeploy.events import Correlator, PostInBackground, PostNow
from modeldeploy.kube import KubeError


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


class Named:
    """An apiserver's Event store: names generated on create; PATCH merges, 404 for an expired one."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        name = f"{obj['metadata']['generateName']}{len(self.calls):04d}"
        self.calls.append("create")
        stored = {**obj, "metadata": {**obj["metadata"], "name": name}}
        self.stored[name] = stored
        return stored

    def merge_patch(self, rt, namespace, name, patch, sub=None):
        self.calls.append("patch")
        if name not in self.stored:
            raise KubeError(404, {"message": "not found"}, "PATCH", name)
        self.stored[name].update(patch)
        return self.stored[name]


def reconcile_error(message: str, at: str) -> dict[str, Any]:
    return {
        "kind": "Event",
        "metadata": {"generateName": "minilm.", "namespace": "team-a"},
        "involvedObject": {"kind": "ModelDeployment", "name": "minilm", "uid": "u-1"},
        "type": "Warning",
        "reason": "ReconcileError",
        "message": message,
        "source": {"component": "modeldeploy"},
        "firstTimestamp": at,
        "lastTimestamp": at,
        "count": 1,
    }


def test_a_repeated_event_is_one_object_whose_count_grows_as_client_go_aggregates():
    """A reconcile that fails on every retry: one ReconcileError Event with count and last time, not one
    object per retry; a different message is another Event; an expired one is created again."""
    kube = Named()
    sink = PostNow(kube)
    for i in range(5):
        sink.post(reconcile_error("apiserver said no", f"2026-12-02T10:00:0{i}Z"))
    sink.post(reconcile_error("something else", "2026-12-02T10:00:06Z"))
    assert kube.calls == ["create", "patch", "patch", "patch", "patch", "create"]
    first, other = kube.stored.values()
    assert (first["count"], first["firstTimestamp"], first["lastTimestamp"]) == (
        5,
        "2026-12-02T10:00:00Z",
        "2026-12-02T10:00:04Z",
    )
    assert other["message"] == "something else" and other["count"] == 1
    kube.stored.clear()  # the apiserver's Event TTL ran out
    sink.post(reconcile_error("apiserver said no", "2026-12-02T11:00:00Z"))
    assert kube.calls[-2:] == ["patch", "create"] and len(kube.stored) == 1


def test_the_correlator_forgets_the_oldest_distinct_events():
    c = Correlator(size=2)
    for k in ("a", "b", "c"):
        c.record((k,), f"ev-{k}", 1)
    assert c.seen(("a",)) is None and c.seen(("c",)) == ("ev-c", 1)
