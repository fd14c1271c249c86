"""A periodic LIST repairs what the watches missed: kopf drops an index entry only on a DELETED event, so a
child deleted while the watch was down would stay in the child cache for good and never be recreated.
After a resync the cache hides what the LIST proves gone, shows what the LIST saw that the index lacks,
never hides what came after the LIST, and reports the ModelDeployments whose view changed."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from modeldeploy import builders as b
from modeldeploy import kube as k
from modeldeploy import metrics
from modeldeploy.childcache import ADDED_TTL, ChildCache, Repair, reconcile_listing
from modeldeploy.resync import Resyncer

OWNER = ("ml", "minilm")


def dep(
    name: str, rv: int | str, owner: str = "minilm", uid: str | None = None, replicas: int = 1, ns: str = "ml"
) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "resourceVersion": str(rv),
            "labels": {b.LABEL_NAME: owner},
        },
        "spec": {"replicas": replicas},
    }


class Loop:
    """An event loop in a thread, as kopf's; tests call the cache from the main thread like a worker."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class World:
    def __init__(self, cache: ChildCache, index: dict, services: dict, clock: Clock) -> None:
        self.cache, self.index, self.services, self.clock = cache, index, services, clock

    def names(self, owner: str = "minilm", rt: k.ResourceType = k.DEPLOYMENT) -> list[str]:
        return [o["metadata"]["name"] for o in self.cache.children(rt, "ml", owner)]


@pytest.fixture
def world() -> Iterator[World]:
    loop, clock = Loop(), Clock()
    index: dict = {}  # what kopf's index holds: {(namespace, owner): [objects]}
    services: dict = {}
    cache = ChildCache(clock=clock)
    cache.attach(loop.loop, {"Deployment": index, "Service": services})
    try:
        yield World(cache, index, services, clock)
    finally:
        loop.close()


# -------------------------------------------------------------------------------- ChildCache.resynced
def test_a_child_deleted_while_the_watch_was_down_is_hidden_and_its_owner_reported(world):
    world.index[OWNER] = [dep("minilm-a", 5), dep("minilm-b", 6)]
    assert world.cache.resynced("Deployment", [dep("minilm-b", 6)], 10) == {OWNER}
    assert world.names() == ["minilm-b"]
    assert world.index[OWNER][0]["metadata"]["name"] == "minilm-a"  # kopf's index is left as it is


def test_a_child_created_after_the_list_is_not_hidden(world):
    world.index[OWNER] = [dep("minilm-a", 11)]  # the LIST (at 10) could not see it
    assert world.cache.resynced("Deployment", [], 10) == set()
    assert world.names() == ["minilm-a"]


def test_our_write_after_the_list_is_not_hidden(world):
    world.index[OWNER] = [dep("minilm-a", 5)]
    world.cache.wrote({"kind": "Deployment", **dep("minilm-a", 12, uid="u2", replicas=3)})  # recreated
    world.cache.resynced("Deployment", [], 10)
    (got,) = world.cache.children(k.DEPLOYMENT, "ml", "minilm")
    assert (got["metadata"]["uid"], got["spec"]["replicas"]) == ("u2", 3)
    # and after the resync: the reconcile recreates the hidden child, and sees it at once
    world.index[("ml", "other")] = [dep("other-a", 4, owner="other")]
    world.cache.resynced("Deployment", [], 10)
    assert world.names("other") == []
    world.cache.wrote({"kind": "Deployment", **dep("other-a", 13, owner="other", uid="u3")})
    assert world.names("other") == ["other-a"]


def test_a_child_missing_from_the_index_is_added_until_the_watch_delivers_it(world):
    listed = {"apiVersion": "apps/v1", "kind": "Deployment", **dep("minilm-new", 8, replicas=2)}
    assert world.cache.resynced("Deployment", [listed], 10) == {OWNER}
    (got,) = world.cache.children(k.DEPLOYMENT, "ml", "minilm")
    assert (got["metadata"]["name"], got["spec"]["replicas"], got["kind"]) == ("minilm-new", 2, "Deployment")
    got["spec"]["replicas"] = 99  # a copy
    world.index[OWNER] = [dep("minilm-new", 9, replicas=4)]  # the watch catches up: the index wins
    assert [o["spec"]["replicas"] for o in world.cache.children(k.DEPLOYMENT, "ml", "minilm")] == [4]
    world.index[OWNER] = []  # and then it is deleted: gone, the addition went with the catching up
    assert world.names() == []


def test_a_listed_object_older_than_the_indexed_one_is_not_added(world):
    world.index[OWNER] = [dep("minilm-a", 12, replicas=5)]  # changed after the LIST
    assert world.cache.resynced("Deployment", [dep("minilm-a", 7, replicas=1)], 10) == set()
    assert [o["spec"]["replicas"] for o in world.cache.children(k.DEPLOYMENT, "ml", "minilm")] == [5]


def test_a_child_changed_while_the_watch_was_down_is_shown_as_listed(world):
    world.index[OWNER] = [dep("minilm-a", 5, replicas=5)]
    assert world.cache.resynced("Deployment", [dep("minilm-a", 8, replicas=2)], 10) == {OWNER}
    assert [o["spec"]["replicas"] for o in world.cache.children(k.DEPLOYMENT, "ml", "minilm")] == [2]


def test_a_resync_with_nothing_changed_reports_no_owner(world):
    world.index[OWNER] = [dep("minilm-a", 5)]
    assert world.cache.resynced("Deployment", [dep("minilm-a", 5)], 10) == set()
    assert world.names() == ["minilm-a"]
    # a child still hidden by the next resync: the view does not change again, nothing to enqueue
    world.index[OWNER] = [dep("minilm-a", 5), dep("minilm-b", 6)]
    assert world.cache.resynced("Deployment", [dep("minilm-a", 5)], 10) == {OWNER}
    assert world.cache.resynced("Deployment", [dep("minilm-a", 5)], 20) == set()
    assert world.names() == ["minilm-a"]


def test_a_hidden_name_shows_again_when_the_watch_sees_it_anew(world):
    world.index[OWNER] = [dep("minilm-a", 5, uid="u1")]
    world.cache.resynced("Deployment", [], 10)
    assert world.names() == []
    # recreated: kopf keeps entries by uid, so the stale one stays next to the new one
    world.index[OWNER] = [dep("minilm-a", 5, uid="u1"), dep("minilm-a", 15, uid="u2", replicas=7)]
    (got,) = world.cache.children(k.DEPLOYMENT, "ml", "minilm")
    assert (got["metadata"]["uid"], got["spec"]["replicas"]) == ("u2", 7)
    world.index[OWNER] = [dep("minilm-a", 16, uid="u1")]  # the same uid at a newer version
    assert world.names() == ["minilm-a"]


def test_unknown_resource_versions_never_hide(world):
    world.index[OWNER] = [dep("minilm-a", 5), dep("minilm-b", "not-a-number")]
    assert world.cache.resynced("Deployment", [], None) == set()
    assert world.cache.resynced("Deployment", [], 10) == {OWNER}
    assert world.names() == ["minilm-b"]


def test_each_resync_replaces_the_last_one(world):
    world.index[OWNER] = [dep("minilm-a", 5)]
    world.cache.resynced("Deployment", [], 10)
    assert world.names() == []
    # the next LIST holds it again (the first one raced an outage): shown, and the owner reported
    assert world.cache.resynced("Deployment", [dep("minilm-a", 5)], 20) == {OWNER}
    assert world.names() == ["minilm-a"]
    assert world.cache.resynced("Deployment", [], 30) == {OWNER}
    world.index[OWNER] = []
    world.cache.resynced("Deployment", [], 40)
    assert world.cache._repairs["Deployment"] == Repair(at=world.clock.now)  # nothing kept


def test_an_addition_the_watch_never_confirms_expires(world):
    world.cache.resynced("Deployment", [dep("minilm-new", 8)], 10)
    assert world.names() == ["minilm-new"]
    world.clock.now += ADDED_TTL + 1
    assert world.names() == []


def test_a_child_that_changed_owner_while_the_watch_was_down_moves(world):
    world.index[OWNER] = [dep("shared", 5, uid="u1")]
    moved = dep("shared", 8, uid="u1", owner="other")
    assert world.cache.resynced("Deployment", [moved], 10) == {OWNER, ("ml", "other")}
    assert (world.names(), world.names("other")) == ([], ["shared"])


def test_kinds_are_resynced_apart(world):
    world.index[OWNER] = [dep("minilm-a", 5)]
    world.services[OWNER] = [dep("minilm-svc", 5)]
    assert world.cache.resynced("Service", [], 10) == {OWNER}
    assert world.names() == ["minilm-a"]
    assert world.names(rt=k.SERVICE) == []


def test_resynced_before_attach_or_for_a_kind_not_indexed_does_nothing(world):
    assert ChildCache().resynced("Deployment", [dep("minilm-a", 5)], 10) == set()
    assert world.cache.resynced("ScaledObject", [dep("minilm-a", 5)], 10) == set()


def test_reconcile_listing_is_pure_and_reports_against_the_view_before():
    indexed = {OWNER: [dep("minilm-a", 5), dep("minilm-b", 12)], ("ml", "x"): [dep("x-a", 3, owner="x")]}
    listed = [dep("x-a", 3, owner="x"), dep("y-a", 7, owner="y")]
    repair, changed = reconcile_listing(indexed, listed, 10, now=5.0)
    assert repair.hidden == {OWNER: {("minilm-a", "uid-minilm-a"): 5}}  # minilm-b is newer than the LIST
    assert list(repair.added) == [("ml", "y")] and list(repair.added["ml", "y"]) == ["y-a"]
    assert changed == {OWNER, ("ml", "y")} and repair.at == 5.0
    _, again = reconcile_listing(indexed, listed, 10, before=repair)
    assert again == set()


# -------------------------------------------------------------------------------- Resyncer
class FakeKube:
    """LISTs answered from ``listings[(kind, namespace)] = (items, resourceVersion)``."""

    def __init__(self) -> None:
        self.listings: dict[tuple[str, str | None], tuple[list[dict], str | None]] = {}
        self.failing: dict[str, Exception] = {}
        self.calls: list[tuple[str, str | None, str | None, str]] = []

    def list_with_rv(
        self, rt: k.ResourceType, namespace: str | None, label_selector: str | None = None, verb: str = "list"
    ) -> tuple[list[dict[str, Any]], str | None]:
        self.calls.append((rt.kind, namespace, label_selector, verb))
        if rt.kind in self.failing:
            raise self.failing[rt.kind]
        return self.listings.get((rt.kind, namespace), ([], "1"))


def _count(counter: Any, **labels: str) -> float:
    return counter.labels(**labels)._value.get()


def test_run_once_lists_each_kind_and_hands_the_changed_owners_on(world):
    fake, got = FakeKube(), []
    world.index[OWNER] = [dep("minilm-a", 5), dep("minilm-b", 6)]
    world.services[OWNER] = [dep("minilm", 5)]
    fake.listings["Deployment", None] = ([dep("minilm-b", 6)], "10")
    fake.listings["Service", None] = ([dep("minilm", 5)], "10")
    repaired_before = _count(metrics.RESYNC_REPAIRED, kind="Deployment")
    resyncer = Resyncer(fake, world.cache, [k.DEPLOYMENT, k.SERVICE, k.POD], on_changed=got.append)
    assert resyncer.run_once() == {OWNER}
    assert got == [{OWNER}]
    assert world.names() == ["minilm-b"]
    # cluster-wide, by our label, counted apart from a reconcile's reads; Pods are not indexed here
    assert fake.calls == [
        ("Deployment", None, b.LABEL_NAME, "resync"),
        ("Service", None, b.LABEL_NAME, "resync"),
    ]
    assert _count(metrics.RESYNC_REPAIRED, kind="Deployment") == repaired_before + 1
    assert resyncer.run_once() == set() and got == [{OWNER}]  # nothing new: on_changed is not called


def test_namespaced_scope_lists_each_namespace_and_hides_only_what_all_lists_saw_gone(world):
    fake = FakeKube()
    world.index[OWNER] = [dep("minilm-old", 8), dep("minilm-new", 15)]
    fake.listings["Deployment", "ml"] = ([], "10")
    fake.listings["Deployment", "other"] = ([], "20")  # listed later: its version is higher
    resyncer = Resyncer(fake, world.cache, [k.DEPLOYMENT], namespaces=["ml", "other"])
    assert resyncer.run_once() == {OWNER}
    assert [c[1] for c in fake.calls] == ["ml", "other"]
    assert world.names() == ["minilm-new"]  # created after the LIST of "ml" (at 10): not hidden


def test_a_failing_list_is_counted_and_does_not_raise(world):
    fake = FakeKube()
    world.index[OWNER] = [dep("minilm-a", 5)]
    world.services[OWNER] = [dep("minilm", 5)]
    fake.failing["Service"] = k.KubeError(503, {"message": "unavailable"}, "GET", "/api/v1/services")
    errors, oks = (
        _count(metrics.RESYNCS, kind="Service", result="error"),
        _count(metrics.RESYNCS, kind="Deployment", result="ok"),
    )
    resyncer = Resyncer(fake, world.cache, [k.SERVICE, k.DEPLOYMENT])
    fake.listings["Deployment", None] = ([], "10")
    assert resyncer.run_once() == {OWNER}  # the other kinds are resynced all the same
    assert world.names() == [] and world.names(rt=k.SERVICE) == ["minilm"]
    assert _count(metrics.RESYNCS, kind="Service", result="error") == errors + 1
    assert _count(metrics.RESYNCS, kind="Deployment", result="ok") == oks + 1
    fake.failing["Deployment"] = ConnectionResetError("reset")  # not a KubeError either
    assert resyncer.run_once() == set()


def test_a_failing_on_changed_does_not_raise(world):
    fake = FakeKube()
    world.index[OWNER] = [dep("minilm-a", 5)]
    fake.listings["Deployment", None] = ([], "10")

    def broken(keys: set) -> None:
        raise RuntimeError("Event loop is closed")

    assert Resyncer(fake, world.cache, [k.DEPLOYMENT], on_changed=broken).run_once() == {OWNER}


def test_the_thread_resyncs_on_trigger_and_stops_promptly(world):
    fake, done = FakeKube(), threading.Event()
    world.index[OWNER] = [dep("minilm-a", 5)]
    fake.listings["Deployment", None] = ([], "10")
    resyncer = Resyncer(fake, world.cache, [k.DEPLOYMENT], period=3600, on_changed=lambda keys: done.set())
    resyncer.start()
    try:
        time.sleep(0.05)
        assert fake.calls == []  # the first resync waits a period: kopf's listing is fresh at the start
        resyncer.trigger()
        assert done.wait(5)
    finally:
        started = time.monotonic()
        resyncer.stop()
        assert time.monotonic() - started < 1.0
    assert resyncer._thread is not None and not resyncer._thread.is_alive()


def test_the_thread_resyncs_every_period(world):
    fake, calls = FakeKube(), threading.Semaphore(0)
    fake.listings["Deployment", None] = ([], "10")
    real = fake.list_with_rv

    def counting(*args: Any, **kw: Any) -> Any:
        calls.release()
        return real(*args, **kw)

    fake.list_with_rv = counting  # type: ignore[method-assign]
    resyncer = Resyncer(fake, world.cache, [k.DEPLOYMENT], period=0.02)
    resyncer.start()
    try:
        assert calls.acquire(timeout=5) and calls.acquire(timeout=5)
    finally:
        resyncer.stop()


def test_a_relist_is_followed_by_one_resync_after_it_settles(world):
    """kopf relists after a 410 and replays every child: each replayed child pushes the resync later, so
    one resync runs once the replay is over, long before the period ends."""
    fake, done = FakeKube(), threading.Event()
    world.index[OWNER] = [dep("minilm-a", 5)]  # deleted while the watch was down: the listing only adds
    fake.listings["Deployment", None] = ([], "10")
    resyncer = Resyncer(
        fake, world.cache, [k.DEPLOYMENT], period=3600, relist_settle=0.2, on_changed=lambda keys: done.set()
    )
    resyncer.start()
    try:
        started = time.monotonic()
        for _ in range(5):  # the replay of a listing
            resyncer.relisted()
            time.sleep(0.1)
        assert fake.calls == []  # still replaying: each listed child pushed the resync later
        assert done.wait(5)
        assert time.monotonic() - started >= 0.6
        assert len(fake.calls) == 1 and world.names() == []
    finally:
        resyncer.stop()


def test_a_period_of_zero_disables_the_resync(world):
    resyncer = Resyncer(FakeKube(), world.cache, [k.DEPLOYMENT], period=0)
    resyncer.start()
    resyncer.trigger()
    assert resyncer._thread is None
    resyncer.stop()


# -------------------------------------------------------------------------------- Kube.list_with_rv
def test_list_with_rv_gives_the_first_pages_resource_version_and_counts_as_asked(monkeypatch):
    kube = k.Kube.for_host("http://127.0.0.1:1")
    pages = [
        {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t", "resourceVersion": "41"}},
        {"items": [{"metadata": {"name": "b"}}], "metadata": {"resourceVersion": "41"}},
    ]
    asked: list[dict] = []

    def call(method: str, path: str, fn: Any, *args: Any, **kw: Any) -> dict:
        asked.append(kw)
        return pages[len(asked) - 1]

    monkeypatch.setattr(kube, "resource", lambda rt: object())
    monkeypatch.setattr(kube, "_dynamic", SimpleNamespace(get=None))  # no discovery
    monkeypatch.setattr(kube, "_call", call)
    before = _count(metrics.READS, kind="Pod", verb="resync")
    items, rv = kube.list_with_rv(k.POD, "ns", b.LABEL_NAME, verb="resync")
    assert ([i["metadata"]["name"] for i in items], rv) == (["a", "b"], "41")
    assert items[0]["kind"] == "Pod" and asked[1]["_continue"] == "t"
    assert asked[0]["label_selector"] == b.LABEL_NAME
    assert _count(metrics.READS, kind="Pod", verb="resync") == before + 1
    kube.close()
