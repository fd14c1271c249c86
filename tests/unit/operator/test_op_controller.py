"""The work queue (coalescing, retries, no concurrent reconcile of one key), the peering gate, the
kopf wiring, and the CLI's status view."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import kopf
import pytest
from modeldeploy import cli, operator
from modeldeploy.childcache import ChildCache
from modeldeploy.controller import Controller, PeeringGate
from modeldeploy.settings import load_settings

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


class Recorder:
    def __init__(self, fail_times: int = 0) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_times = fail_times
        self.active = 0
        self.max_active = 0
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, ns: str, name: str):
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        self.release.wait(5)
        with self.lock:
            self.active -= 1
            self.calls.append((ns, name))
            if self.fail_times > 0:
                self.fail_times -= 1
                raise RuntimeError("boom")


async def drain(c: Controller, want: int, rec: Recorder) -> None:
    for _ in range(2000):
        if len(rec.calls) >= want and c.idle:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"only {len(rec.calls)} reconciles, wanted {want}")


async def test_a_burst_of_events_coalesces():
    rec = Recorder()
    c = Controller(rec, workers=3)
    c.start()
    try:
        for _ in range(50):
            c.enqueue(("ns", "a"))
        c.enqueue(("ns", "b"))
        await drain(c, 2, rec)
        assert sorted(rec.calls) == [("ns", "a"), ("ns", "b")]
    finally:
        await c.stop()


async def test_an_event_during_a_reconcile_causes_exactly_one_more():
    rec = Recorder()
    rec.release.clear()
    c = Controller(rec, workers=4)
    c.start()
    try:
        c.enqueue(("ns", "a"))
        while rec.active == 0:
            await asyncio.sleep(0.001)
        for _ in range(10):
            c.enqueue(("ns", "a"))  # arrives while the first reconcile runs
        rec.release.set()
        await drain(c, 2, rec)
        assert rec.calls == [("ns", "a"), ("ns", "a")]
        assert rec.max_active == 1  # never two reconciles of one key at once
    finally:
        await c.stop()


async def test_failures_are_retried_with_backoff():
    rec = Recorder(fail_times=2)
    c = Controller(rec, workers=1, max_backoff=0.01)
    c.start()
    try:
        c.enqueue(("ns", "a"))
        await drain(c, 3, rec)
        for _ in range(100):  # the last retry timer has fired and nothing is pending
            if not c._timers:
                break
            await asyncio.sleep(0.005)
        assert rec.calls == [("ns", "a")] * 3
        assert c._failures == {}
    finally:
        await c.stop()


async def test_timed_reconciles_ask_the_peering_gate():
    rec = Recorder()

    class Closed(PeeringGate):
        def is_active(self) -> bool:
            return False

    c = Controller(rec, workers=1, gate=Closed(None, identity="me", priority=1, peering_name="p"))
    c.start()
    try:
        c.enqueue_after(("ns", "a"), 0)
        c.enqueue_after(("ns", "b"), 0)
        await asyncio.sleep(0.05)
        c.enqueue(("ns", "a"))  # a watch event: kopf only delivers those while we are active
        await drain(c, 1, rec)
        await asyncio.sleep(0.05)
        # exactly the watch event's reconcile: the timers' were dropped by the gate, not merely late
        assert rec.calls == [("ns", "a")], rec.calls
    finally:
        await c.stop()


async def test_an_event_during_a_timed_reconciles_gate_check_waits_for_it():
    """A timer fires and its worker asks the peering gate (an apiserver GET); a watch event for the same
    key arrives meanwhile. The key counts as running from the moment it is taken off the queue, so the
    event's reconcile follows the timer's instead of running next to it (two applies of one object)."""
    rec = Recorder()
    asked, answer = threading.Event(), threading.Event()

    class Slow(PeeringGate):
        def is_active(self) -> bool:
            asked.set()
            answer.wait(5)
            return True

    c = Controller(rec, workers=2, gate=Slow(None, identity="me", priority=1, peering_name="p"))
    c.start()
    try:
        c.enqueue_after(("ns", "a"), 0)
        assert await asyncio.to_thread(asked.wait, 5)
        rec.release.clear()  # reconciles take a while
        c.enqueue(("ns", "a"))  # the watch event, while the gate is being asked
        await asyncio.sleep(0.05)
        answer.set()
        await asyncio.sleep(0.05)
        rec.release.set()
        await drain(c, 2, rec)
        assert rec.calls == [("ns", "a"), ("ns", "a")]
        assert rec.max_active == 1
    finally:
        answer.set()
        await c.stop()


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict:
    return {
        "priority": priority,
        "lifetime": lifetime,
        "lastseen": (NOW - timedelta(seconds=seconds_ago)).isoformat(),
    }


@pytest.mark.parametrize(
    ("peers", "active"),
    [
        ({}, True),
        ({"me": peer(5)}, True),
        ({"me": peer(5), "other": peer(3)}, True),
        ({"me": peer(5), "other": peer(9)}, False),
        ({"me": peer(5), "other": peer(5)}, False),  # same priority: kopf pauses both
        ({"me": peer(5), "other": peer(9, seconds_ago=120)}, True),  # the other is dead
        ({"me": peer(5), "other": "garbage"}, True),
    ],
)
def test_peering_decision(peers, active):
    assert PeeringGate.decide(peers, "me", 5, NOW) is active


def test_standalone_gate_is_always_active():
    assert PeeringGate(None, identity="me", priority=1, peering_name="p", standalone=True).is_active()


def test_kopf_settings_name_our_finalizer_and_filter_children():
    s = operator.kopf_settings(load_settings(["--priority", "7"], {}))
    assert s.persistence.finalizer == "modeldeploy.io/finalizer"
    assert s.peering.priority == 7 and s.peering.mandatory and not s.peering.standalone
    assert s.posting.enabled is False

    # four kinds of children, the HTTPRoutes and the EndpointSlices, label-filtered; without the last two
    # when asked
    def kinds(settings):
        return {(sel.group, sel.version, sel.any_name) for sel in settings.watching.label_selectors}

    assert kinds(s) == {*operator.CHILD_RESOURCES, operator.HTTPROUTES, operator.ENDPOINTSLICES}
    off = operator.kopf_settings(load_settings(["--no-watch-httproutes"], {}))
    assert kinds(off) == set(operator.CHILD_RESOURCES)


async def test_kopf_writes_nothing_on_a_watched_object_but_strips_only_our_finalizer():
    """kopf's own processing of one watch event (kopf 1.45's process_resource_causes and the touch that
    apply() makes before a patch), with our registry and settings: no handler of ours needs kopf's progress
    or diff-base storage, so nothing is written but the removal of the finalizer of our name -- the
    default kopf marker, which another kopf operator may keep on the object, stays."""
    from kopf._cogs.structs import bodies, patches, references
    from kopf._core.actions import lifecycles, loggers
    from kopf._core.engines import indexing
    from kopf._core.reactor import inventory, processing

    settings = operator.kopf_settings(load_settings([], {}))
    registry = operator.build_registry(Controller(lambda ns, n: None))
    kopf_marker = kopf.OperatorSettings().persistence.finalizer
    raw = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "m-abc",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "1",
            "labels": {"modeldeploy.io/name": "m"},
            "finalizers": [kopf_marker, "modeldeploy.io/finalizer"],
        },
        "spec": {"replicas": 1},
    }
    resource = references.Resource("apps", "v1", "deployments", kind="Deployment", namespaced=True)
    body = bodies.Body(raw)
    patch = patches.Patch(body=body)
    logger = loggers.LocalObjectLogger(body=body, settings=settings)
    delays, _ = await processing.process_resource_causes(
        lifecycle=lifecycles.all_at_once,
        indexers=indexing.OperatorIndexers(),
        registry=registry,
        settings=settings,
        resource=resource,
        raw_event={"type": "MODIFIED", "object": raw},
        body=body,
        patch=patch,
        memory=await inventory.ResourceMemories().recall(raw),
        local_logger=logger,
        event_logger=logger,
        stream_pressure=None,
        operator_paused=None,
        consistency_time=None,
    )
    settings.persistence.progress_storage.touch(body=body, patch=patch, value=None)  # as apply() does
    assert list(delays) == []  # nothing to wait for: kopf never touches the object later
    assert dict(patch) == {}  # no progress, no diff-base, no annotations
    for fn in patch.fns:
        fn(raw)
    assert raw["metadata"]["finalizers"] == [kopf_marker]


def test_default_priority_is_random_and_positive():
    drawn = [load_settings([], {}).priority for _ in range(20)]
    assert all(1 <= p <= 2**30 for p in drawn), drawn
    assert len(set(drawn)) > 1, drawn  # two replicas started with defaults must not tie


def test_registry_has_thin_event_handlers_and_no_finalizer():
    reg = operator.build_registry(Controller(lambda ns, n: None))
    handlers = reg._watching.get_all_handlers()
    assert len(handlers) == 7  # the ModelDeployment, four kinds of children, HTTPRoutes, EndpointSlices
    plurals = {h.selector.any_name for h in handlers if h.selector is not None}
    assert {"httproutes", "endpointslices"} <= plurals
    off = operator.build_registry(Controller(lambda ns, n: None), watch_httproutes=False)
    assert len(off._watching.get_all_handlers()) == 5
    assert not reg._changing.get_all_handlers()  # no change handlers: no progress or diff-base writes
    assert not reg._spawning.get_all_handlers()  # no daemons/timers: no finalizer


def test_a_listed_child_asks_for_a_resync_and_a_watched_change_does_not():
    """A listing (kopf's start, or its relist after a 410) replays each child with event type None; only
    those call ``on_listed`` (the resync after a relist), and each still enqueues its owner."""
    enqueued: list[tuple[str, str]] = []
    controller = Controller(lambda ns, n: None)
    controller.enqueue = enqueued.append  # type: ignore[method-assign]
    listed: list[int] = []
    reg = operator.build_registry(controller, on_listed=lambda: listed.append(1))
    deployments = next(
        h for h in reg._watching.get_all_handlers() if h.selector and h.selector.any_name == "deployments"
    )
    for event_type in (None, "ADDED", "MODIFIED", "DELETED", None):
        asyncio.run(
            deployments.fn(event={"type": event_type}, namespace="ml", labels={operator.LABEL_NAME: "minilm"})
        )
    assert len(listed) == 2
    assert enqueued == [("ml", "minilm")] * 5


def test_children_are_indexed_for_the_child_cache():
    """Every watched kind of child is also indexed (kopf fills indices before any other handler runs),
    and a startup handler hands the indices to the cache."""
    reg = operator.build_registry(Controller(lambda ns, n: None), cache=ChildCache())
    indexed = {h.selector.any_name for h in reg._indexing.get_all_handlers() if h.selector is not None}
    assert indexed == {
        "deployments",
        "services",
        "poddisruptionbudgets",
        "pods",
        "httproutes",
        "endpointslices",
    }
    assert {h.id for h in reg._indexing.get_all_handlers()} == {operator.index_id(p) for p in indexed}
    assert len(reg._activities.get_all_handlers()) >= 2  # login + attaching the cache
    assert not operator.build_registry(Controller(lambda ns, n: None))._indexing.get_all_handlers()


def test_cli_status_view():
    md = {
        "metadata": {"name": "minilm", "namespace": "ml", "generation": 2},
        "spec": {"model": {"name": "minilm", "version": "2"}},
        "status": {
            "observedGeneration": 2,
            "phase": "Progressing",
            "ready": "1/2",
            "revision": "bbb",
            "stableRevision": "aaa",
            "canaryRevision": "bbb",
            "canaryWeight": 25,
            "revisions": [
                {
                    "revision": "aaa",
                    "role": "stable",
                    "replicas": 2,
                    "readyReplicas": 2,
                    "inTrafficReplicas": 2,
                },
                {
                    "revision": "bbb",
                    "role": "canary",
                    "replicas": 1,
                    "unschedulableReplicas": 1,
                    "schedulingMessage": "0/2 nodes are available: Insufficient nvidia.com/gpu",
                },
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "MinimumReplicasReady",
                    "message": "2/2",
                    "lastTransitionTime": "2026-01-01T11:59:00Z",
                }
            ],
            "history": [{"revision": "aaa", "outcome": "Deployed", "time": "2026-01-01T10:00:00Z"}],
        },
    }
    out = cli.render_status(md, now=NOW)
    assert "ml/minilm" in out and "canary bbb" in out and "weight 25" in out
    assert "Insufficient nvidia.com/gpu" in out
    assert "MinimumReplicasReady" in out and "60s" in out
    assert "Deployed" in out and "2h" in out
    assert cli.build_parser().parse_args(["status", "x", "-w"]).watch
