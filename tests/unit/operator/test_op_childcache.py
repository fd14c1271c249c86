"""The children a reconcile observes come from kopf's indices (no LIST), with the operator's own writes laid
over them until the watch catches up -- so a reconcile right after a write neither misses it nor writes
it again."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from modeldeploy import builders as b
from modeldeploy import kube as k
from modeldeploy.childcache import OVERLAY_TTL, ChildCache, index_key


def dep(name: str, rv: int, owner: str = "minilm", uid: str | None = None, replicas: int = 1) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
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


@pytest.fixture
def world() -> Iterator[tuple[ChildCache, dict, Clock]]:
    loop, clock = Loop(), Clock()
    index: dict = {}  # what kopf's index holds: {(namespace, owner): [objects]}
    cache = ChildCache(clock=clock)
    cache.attach(loop.loop, {"Deployment": index})
    try:
        yield cache, index, clock
    finally:
        loop.close()


def names_and_replicas(objs: list[dict]) -> list[tuple[str, int]]:
    return [(o["metadata"]["name"], o["spec"]["replicas"]) for o in objs]


def test_children_come_from_the_index_as_a_list_would_return_them(world):
    cache, index, _ = world
    index[("ml", "minilm")] = [dep("minilm-a", 5)]
    index[("ml", "other")] = [dep("other-a", 6, owner="other")]
    (got,) = cache.children(k.DEPLOYMENT, "ml", "minilm")
    assert got["metadata"]["name"] == "minilm-a"
    assert (got["kind"], got["apiVersion"]) == ("Deployment", "apps/v1")
    got["spec"]["replicas"] = 99  # a copy: the index is untouched
    assert index[("ml", "minilm")][0]["spec"]["replicas"] == 1
    assert cache.children(k.DEPLOYMENT, "ml", "nothing") == []


def test_our_write_is_seen_before_its_watch_event_and_dropped_after(world):
    cache, index, _ = world
    index[("ml", "minilm")] = [dep("minilm-a", 5, replicas=4)]
    cache.wrote({"kind": "Deployment", **dep("minilm-a", 7, replicas=1)})
    assert names_and_replicas(cache.children(k.DEPLOYMENT, "ml", "minilm")) == [("minilm-a", 1)]
    # the watch catches up (and then someone else changes it): the index wins again
    index[("ml", "minilm")] = [dep("minilm-a", 9, replicas=3)]
    assert names_and_replicas(cache.children(k.DEPLOYMENT, "ml", "minilm")) == [("minilm-a", 3)]


def test_a_created_child_is_seen_at_once(world):
    cache, _, _ = world
    cache.wrote({"kind": "Deployment", **dep("minilm-new", 3)})
    assert names_and_replicas(cache.children(k.DEPLOYMENT, "ml", "minilm")) == [("minilm-new", 1)]
    assert cache.children(k.DEPLOYMENT, "ml", "other") == []


def test_a_deleted_child_is_gone_at_once_but_a_new_one_of_the_same_name_is_not(world):
    cache, index, _ = world
    index[("ml", "minilm")] = [dep("minilm-a", 5, uid="u1")]
    cache.gone("Deployment", "ml", "minilm-a", "u1", "minilm")
    assert cache.children(k.DEPLOYMENT, "ml", "minilm") == []
    # recreated (another uid) before the deletion's event: it is there
    index[("ml", "minilm")] = [dep("minilm-a", 8, uid="u2")]
    assert names_and_replicas(cache.children(k.DEPLOYMENT, "ml", "minilm")) == [("minilm-a", 1)]


def test_a_deletion_of_another_owners_child_is_not_confirmed_by_this_owners_view(world):
    cache, index, _ = world
    index[("ml", "other")] = [dep("other-a", 5, owner="other", uid="u9")]
    cache.gone("Deployment", "ml", "other-a", "u9", "other")
    assert cache.children(k.DEPLOYMENT, "ml", "minilm") == []  # must not drop the tombstone
    assert cache.children(k.DEPLOYMENT, "ml", "other") == []


def test_an_unconfirmed_write_expires(world):
    cache, index, clock = world
    index[("ml", "minilm")] = [dep("minilm-a", 5, replicas=4)]
    cache.wrote({"kind": "Deployment", **dep("minilm-a", 7, replicas=1)})
    clock.now += OVERLAY_TTL + 1
    assert names_and_replicas(cache.children(k.DEPLOYMENT, "ml", "minilm")) == [("minilm-a", 4)]


def test_kinds_without_an_index_are_not_served(world):
    cache, _, _ = world
    assert cache.serves("Deployment") and not cache.serves("ScaledObject")
    cache.wrote({"kind": "ScaledObject", **dep("x", 1)})  # ignored, no error


def test_keys():
    assert index_key("ml", {b.LABEL_NAME: "minilm"}) == ("ml", "minilm")
    assert index_key("ml", {}) is None


def test_the_cache_keeps_children_without_their_managed_fields():
    from modeldeploy.childcache import trimmed

    obj = {
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "managedFields": [{"manager": "x"}], "uid": "u"},
        "spec": {"replicas": 2},
    }
    out = trimmed(obj)
    assert out == {
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": {"replicas": 2},
    }
    assert obj["metadata"]["managedFields"] == [{"manager": "x"}]  # the watched object is left as it was
