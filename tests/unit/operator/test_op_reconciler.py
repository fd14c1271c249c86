"""The plan and one reconcile against an in-memory apiserver: create, idempotence, drift repair,
traffic gates, a new revision, unschedulable pods, invalid specs, restarts, status that a newer operator
or a hand edit wrote (unknown fields ignored; an unreadable one reported, never replaced)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest
from md_canary import World
from md_fakekube import FakeKube
from modeldeploy import builders as b
from modeldeploy import metrics
from modeldeploy.api import ModelDeployment
from modeldeploy.plan import Observed, plan
from modeldeploy.reconciler import NameConflict, Reconciler
from modeldeploy.status import normalize
from prometheus_client import REGISTRY

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float = 10) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def world(md_body):
    fake = FakeKube()
    fake.put(md_body)
    clock = Clock()
    return fake, Reconciler(fake, clock=clock), clock  # type: ignore[arg-type]


def md_raw(fake: FakeKube) -> dict:
    return fake.obj("ModelDeployment", "minilm")  # type: ignore[return-value]


def status(fake: FakeKube) -> dict:
    return md_raw(fake).get("status") or {}


def cond(fake: FakeKube, type_: str) -> dict:
    return next(c for c in status(fake)["conditions"] if c["type"] == type_)


def edit_spec(fake: FakeKube, **changes) -> None:
    raw = md_raw(fake)
    raw["spec"].update(changes)
    raw["metadata"]["generation"] += 1


def spawn_pods(fake: FakeKube, revision: str, n: int, *, ready=True, unschedulable: str | None = None):
    """What the ReplicaSet controller, the scheduler and the kubelet would do (gate left as it is)."""
    for i in range(n):
        name = f"minilm-{revision}-{i}"
        conds = (
            [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}]
            if unschedulable
            else [
                {"type": "PodScheduled", "status": "True"},
                {"type": "ContainersReady", "status": "True" if ready else "False"},
            ]
        )
        fake.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": "default",
                    "labels": {b.LABEL_NAME: "minilm", b.LABEL_REVISION: revision},
                },
                "spec": {} if unschedulable else {"nodeName": "gpu-node-0"},
                "status": {"phase": "Pending" if unschedulable else "Running", "conditions": conds},
            }
        )


def kubelet_sync(fake: FakeKube) -> None:
    """Ready = containers ready and every readiness gate True (as the kubelet/node agent computes it)."""
    for p in fake.of_kind("Pod"):
        conds = {c["type"]: c for c in p["status"]["conditions"]}
        ready = (
            conds.get("ContainersReady", {}).get("status") == "True"
            and conds.get(b.READINESS_GATE, {}).get("status") == "True"
        )
        conds["Ready"] = {"type": "Ready", "status": "True" if ready else "False"}
        p["status"]["conditions"] = list(conds.values())


def revision(fake: FakeKube) -> str:
    return b.spec_revision(ModelDeployment.from_api(md_raw(fake)).spec)


def settle(fake, rec, rounds=4):
    for _ in range(rounds):
        rec.reconcile("default", "minilm")
        kubelet_sync(fake)


# ---------------------------------------------------------------------------------------------- create


def test_first_reconcile_creates_children_and_status(world):
    fake, rec, _ = world
    result = rec.reconcile("default", "minilm")
    rev = revision(fake)
    kinds = sorted((w[1], w[2]) for w in fake.writes if w[0] == "apply")
    assert kinds == [
        ("Deployment", f"minilm-{rev}"),
        ("PodDisruptionBudget", "minilm"),
        ("Service", "minilm"),
        ("Service", f"minilm-{rev}"),
    ]
    assert result.writes == 5  # four children and the status
    st = status(fake)
    assert st["observedGeneration"] == 1
    assert st["stableRevision"] == rev and st["revision"] == rev
    assert st["phase"] == "Progressing"
    assert cond(fake, "Ready")["status"] == "False"
    assert cond(fake, "Progressing")["reason"] == "ScalingUp"
    assert cond(fake, "Degraded")["status"] == "False"
    assert st["history"][0]["outcome"] == "Deployed"
    reasons = [e["reason"] for e in fake.events]
    assert reasons.count("Created") == 1 and "Deployed" in reasons  # one event for the four children
    (created,) = [e["message"] for e in fake.events if e["reason"] == "Created"]
    for kind, obj in (("Deployment", f"minilm-{rev}"), ("Service", "minilm"), ("Service", f"minilm-{rev}")):
        assert f"{kind} {obj}" in created
    assert "PodDisruptionBudget" in created
    for e in fake.events:
        assert e["involvedObject"]["kind"] == "ModelDeployment" and e["involvedObject"]["uid"] == "md-uid-1"


def test_second_reconcile_writes_nothing(world):
    fake, rec, clock = world
    rec.reconcile("default", "minilm")
    writes, events = len(fake.writes), len(fake.events)
    clock.tick(60)
    assert rec.reconcile("default", "minilm").writes == 0
    assert len(fake.writes) == writes and len(fake.events) == events


def test_pods_get_the_traffic_gate_and_become_ready(world):
    fake, rec, clock = world
    rec.reconcile("default", "minilm")
    rev = revision(fake)
    spawn_pods(fake, rev, 1)
    clock.tick()
    rec.reconcile("default", "minilm")
    pod = fake.obj("Pod", f"minilm-{rev}-0")
    gate = next(c for c in pod["status"]["conditions"] if c["type"] == b.READINESS_GATE)
    assert gate["status"] == "True"
    kubelet_sync(fake)
    clock.tick()
    rec.reconcile("default", "minilm")
    st = status(fake)
    assert st["phase"] == "Healthy" and st["ready"] == "1/1"
    assert cond(fake, "Ready")["status"] == "True"
    assert cond(fake, "Ready")["lastTransitionTime"] == "2026-01-01T00:00:20Z"
    assert cond(fake, "Progressing")["status"] == "False"
    (r,) = st["revisions"]
    assert (r["role"], r["replicas"], r["readyReplicas"], r["inTrafficReplicas"]) == ("stable", 1, 1, 1)
    # and at rest, nothing more is written, even by a brand-new operator (a restart)
    before = len(fake.writes)
    clock.tick(600)
    assert rec.reconcile("default", "minilm").writes == 0
    restarted = Reconciler(fake, clock=clock)  # type: ignore[arg-type]
    assert restarted.reconcile("default", "minilm").writes == 0
    assert len(fake.writes) == before


# ---------------------------------------------------------------------------------------------- drift


def test_edited_child_is_restored(world):
    fake, rec, _ = world
    rec.reconcile("default", "minilm")
    rev = revision(fake)
    dep = fake.obj("Deployment", f"minilm-{rev}")
    dep["spec"]["replicas"] = 5
    dep["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:latest"
    rec.reconcile("default", "minilm")
    dep = fake.obj("Deployment", f"minilm-{rev}")
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "modeldeploy/modelserver:dev"
    updated = [e for e in fake.events if e["reason"] == "Updated"]
    assert updated and "spec.replicas" in updated[0]["message"]


def test_deleted_child_is_recreated(world):
    fake, rec, _ = world
    rec.reconcile("default", "minilm")
    fake.objects.pop(("Service", "default", "minilm"))
    fake.objects.pop(("PodDisruptionBudget", "default", "minilm"))
    rec.reconcile("default", "minilm")
    assert fake.obj("Service", "minilm") is not None
    assert fake.obj("PodDisruptionBudget", "minilm") is not None


def test_replicas_apply_in_place(world):
    fake, rec, _ = world
    rec.reconcile("default", "minilm")
    rev = revision(fake)
    edit_spec(fake, replicas=3)
    rec.reconcile("default", "minilm")
    assert revision(fake) == rev
    assert fake.obj("Deployment", f"minilm-{rev}")["spec"]["replicas"] == 3
    assert len(fake.of_kind("Deployment")) == 1
    assert status(fake)["observedGeneration"] == 2


def test_objects_not_owned_are_left_alone(world):
    fake, rec, _ = world
    fake.put(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "hand-made", "namespace": "default", "labels": {b.LABEL_NAME: "minilm"}},
            "spec": {},
        }
    )
    rec.reconcile("default", "minilm")
    assert fake.obj("Service", "hand-made") is not None
    assert not [w for w in fake.writes if w[2] == "hand-made"]


@pytest.mark.parametrize("labelled", [False, True])
def test_an_object_of_the_same_name_that_is_not_ours_is_never_taken_over(world, labelled):
    """A Service ``minilm`` that this ModelDeployment does not own (made by hand, or by another tool;
    with our labels or without): nothing is written to it -- no selector, no ownerReference that would
    make deleting the ModelDeployment garbage-collect it. Degraded (reason NameConflict) and a Warning
    Event say whose it is; once it is gone the ModelDeployment creates its own."""
    fake, rec, _ = world
    theirs = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "minilm",
            "namespace": "default",
            "labels": {b.LABEL_NAME: "minilm"} if labelled else {"app": "payments"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": "payments",
                    "uid": "p-1",
                    "controller": True,
                }
            ],
        },
        "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80}]},
    }
    fake.put(theirs)
    before = copy.deepcopy(fake.obj("Service", "minilm"))
    with pytest.raises(NameConflict):
        rec.reconcile("default", "minilm")
    assert fake.obj("Service", "minilm") == before
    assert not [w for w in fake.writes if w[1] == "Service" and w[2] == "minilm"]
    degraded = cond(fake, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "NameConflict"
    assert degraded["message"].startswith(
        "Service minilm exists and is not this ModelDeployment's (owned by Deployment payments)"
    )
    assert [e["type"] for e in fake.events if e["reason"] == "NameConflict"] == ["Warning"]
    fake.objects.pop(("Service", "default", "minilm"))
    settle(fake, rec)
    ours = fake.obj("Service", "minilm")
    assert ours is not None and ours["metadata"]["ownerReferences"][0]["uid"] == "md-uid-1"
    assert cond(fake, "Degraded")["status"] == "False"


# ---------------------------------------------------------------------------------------------- revisions


def test_new_revision_starts_a_canary_next_to_the_untouched_old_one(world):
    """The canary's steps, promotion and rollback are in test_op_canary.py."""
    fake, rec, clock = world
    rec.reconcile("default", "minilm")
    old = revision(fake)
    spawn_pods(fake, old, 1)
    settle(fake, rec)
    assert status(fake)["phase"] == "Healthy"

    edit_spec(fake, model={"name": "minilm", "version": "2", "uri": "file:///models/minilm-v2"})
    new = revision(fake)
    assert new != old
    clock.tick()
    rec.reconcile("default", "minilm")
    st = status(fake)
    assert st["stableRevision"] == old and st["canaryRevision"] == new
    assert st["phase"] == "Progressing"
    assert {r["revision"]: r["role"] for r in st["revisions"]} == {old: "stable", new: "canary"}
    assert fake.obj("Deployment", f"minilm-{old}") is not None
    new_dep = fake.obj("Deployment", f"minilm-{new}")
    env = {e["name"]: e["value"] for e in new_dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODELSERVER_MODEL_VERSION"] == "2"
    # the old Deployment is untouched by the new revision (its pods are not restarted)
    old_dep = fake.obj("Deployment", f"minilm-{old}")
    assert old_dep["spec"]["template"]["spec"]["containers"][0]["env"][2]["value"] == "1"

    spawn_pods(fake, new, 1)
    clock.tick()
    settle(fake, rec)
    st = status(fake)
    assert st["stableRevision"] == old and st["canaryRevision"] == new and st["step"] == 0
    assert st["canaryWeight"] == 5 and st["achievedCanaryWeight"] == 50  # 1 replica: 1 pod of each
    assert fake.obj("Deployment", f"minilm-{old}") is not None
    assert [h["outcome"] for h in st["history"]] == ["Deployed"]
    assert "CanaryStarted" in {e["reason"] for e in fake.events}
    # nothing more to do until the step's interval is over
    assert rec.reconcile("default", "minilm").writes == 0


# ---------------------------------------------------------------------------------------------- scheduling


def test_unschedulable_pods_are_reported_with_the_scheduler_reason(world):
    fake, rec, clock = world
    edit_spec(fake, resources={"gpu": 16})
    rec.reconcile("default", "minilm")
    rev = revision(fake)
    msg = "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) didn't match selector."
    spawn_pods(fake, rev, 1, unschedulable=msg)
    clock.tick()
    rec.reconcile("default", "minilm")
    st = status(fake)
    assert st["phase"] == "Degraded"
    degraded = cond(fake, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PodsUnschedulable"
    assert msg in degraded["message"]
    assert st["revisions"][0]["unschedulableReplicas"] == 1
    assert st["revisions"][0]["schedulingMessage"] == msg
    warnings = [e for e in fake.events if e["reason"] == "Unschedulable"]
    assert len(warnings) == 1 and msg in warnings[0]["message"] and warnings[0]["type"] == "Warning"
    clock.tick()
    rec.reconcile("default", "minilm")
    assert len([e for e in fake.events if e["reason"] == "Unschedulable"]) == 1


# ---------------------------------------------------------------------------------------------- failures


def test_invalid_spec_is_reported_not_acted_on(world):
    fake, rec, _ = world
    raw = md_raw(fake)
    raw["spec"]["rollout"] = {"steps": [50, 10]}
    rec.reconcile("default", "minilm")
    assert fake.of_kind("Deployment") == []
    assert status(fake)["phase"] == "Failed"
    assert cond(fake, "Degraded")["reason"] == "InvalidSpec"
    assert "rollout.steps" in cond(fake, "Degraded")["message"]
    n = len(fake.writes)
    rec.reconcile("default", "minilm")
    assert len(fake.writes) == n


def test_failure_is_an_event_and_degraded_status(world, monkeypatch):
    fake, rec, _ = world
    rec.reconcile("default", "minilm")

    def broken(obj, manager, force=True):
        raise RuntimeError("apiserver said no")

    fake.objects.pop(("Service", "default", "minilm"))
    monkeypatch.setattr(fake, "apply", broken)
    with pytest.raises(RuntimeError):
        rec.reconcile("default", "minilm")
    assert [e for e in fake.events if e["reason"] == "ReconcileError"]
    assert cond(fake, "Degraded")["reason"] == "ReconcileError"


def test_deleted_modeldeployment_is_not_reconciled(world):
    fake, rec, _ = world
    fake.objects.pop(("ModelDeployment", "default", "minilm"))
    assert rec.reconcile("default", "minilm").writes == 0
    assert fake.writes == []


def series(name: str) -> list[dict[str, str]]:
    """The label sets of the operator's series of metric ``name`` that belong to default/minilm."""
    return [
        s.labels
        for m in REGISTRY.collect()
        if m.name == name
        for s in m.samples
        if s.labels.get("namespace") == "default" and s.labels.get("name") == "minilm"
    ]


def test_a_deleted_modeldeployments_metric_series_are_removed(world):
    """Many teams, many ModelDeployments over time: the per-ModelDeployment series go with them."""
    fake, rec, _ = world
    settle(fake, rec)
    metrics.ANALYSIS_VALUE.labels(namespace="default", name="minilm", metric="error-rate").set(0.01)
    metrics.ANALYSIS_VALUE.labels(namespace="default", name="other", metric="error-rate").set(0.02)
    assert series("modeldeploy_canary_weight") and series("modeldeploy_analysis_value")
    fake.objects.pop(("ModelDeployment", "default", "minilm"))
    rec.reconcile("default", "minilm")
    for name in ("modeldeploy_canary_weight", "modeldeploy_analysis_value", "modeldeploy_fallback_active"):
        assert series(name) == [], name
    others = [
        s.labels for m in REGISTRY.collect() if m.name == "modeldeploy_analysis_value" for s in m.samples
    ]
    assert {"namespace": "default", "name": "other", "metric": "error-rate"} in others


# ---------------------------------------------------------------------------------------------- plan


def test_plan_is_pure_and_deterministic(md_body):
    before = copy.deepcopy(md_body)
    md = ModelDeployment.from_api(md_body)
    p1 = plan(md, Observed(), T0)
    p2 = plan(md, Observed(), T0)
    assert p1.apply == p2.apply and p1.status == p2.status and p1.events == p2.events
    assert md_body == before
    assert md.status.conditions == []  # the input model is not mutated either


def test_plan_gates_pods_out_of_unknown_revisions_untouched(md_body):
    md = ModelDeployment.from_api(md_body)
    stray = {
        "metadata": {"name": "x", "labels": {b.LABEL_NAME: "minilm", b.LABEL_REVISION: "gone"}},
        "status": {"conditions": []},
    }
    assert plan(md, Observed(pods=[stray]), T0).pod_gates == []


def test_a_terminating_namespace_is_not_an_error(world, monkeypatch):
    from modeldeploy.kube import KubeError

    fake, rec, _ = world

    def refused(obj, manager, force=True):
        raise KubeError(
            403,
            {
                "message": "unable to create new content in namespace default because it is being terminated",
                "details": {"causes": [{"type": "NamespaceTerminating"}]},
            },
            "PATCH",
            "x",
        )

    monkeypatch.setattr(fake, "apply", refused)
    assert rec.reconcile("default", "minilm").writes == 0
    assert not [e for e in fake.events if e["reason"] == "ReconcileError"]


# ---------------------------------------------------------------------------------------------- status reads


def mid_canary() -> tuple[World, str, str]:
    """A canary at its first step next to the stable revision (rollout state only in status)."""
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    assert (w.status["stableRevision"], w.status["canaryRevision"], w.status["step"]) == (old, new, 0)
    return w, old, new


def deployments(w: World) -> dict[str, int]:
    return {d["metadata"]["name"]: d["spec"]["replicas"] for d in w.fake.of_kind("Deployment")}


def test_unknown_status_fields_at_any_depth_reconcile_exactly_like_none():
    """Fields this operator does not know (a newer operator's, a hand edit's) are ignored, never a reason
    to treat the status as missing: the same writes, events and outcome as without them."""
    plain, _, new = mid_canary()
    marked, _, _ = mid_canary()
    st = marked.raw["status"]
    st["rolloutStrategy"] = {"name": "future"}
    st["history"][0]["decidedBy"] = "a newer operator"
    st["revisions"][0]["zone"] = "eu-1"
    st["conditions"][0]["hint"] = "x"
    st["analysis"] = {**st.get("analysis", {}), "window": "1m"}
    for w in (plain, marked):
        w.fake.writes.clear()
        w.reconcile()
    assert marked.fake.writes == plain.fake.writes == []  # mid-step: nothing to do, for both
    for w in (plain, marked):
        w.run_for(60)
    assert marked.fake.writes == plain.fake.writes
    assert marked.event_reasons() == plain.event_reasons()
    assert normalize(marked.status) == normalize(plain.status)
    assert marked.status["stableRevision"] == new and "Promoted" in marked.event_reasons()
    assert deployments(marked) == deployments(plain)
    assert marked.status["rolloutStrategy"] == {"name": "future"}  # not ours to remove
    assert "InvalidSpec" not in marked.event_reasons()


@pytest.mark.parametrize(
    ("field", "corrupt"),
    [
        ("status.step", lambda st: st.update(step="two")),
        ("status.history.0.time", lambda st: st["history"][0].update(time="yesterday")),
        ("status.history.0.kind", lambda st: st["history"][0].update(kind="Teleported")),
        ("status.stableRevision", lambda st: st.update(stableRevision=7)),
        ("status.conditions", lambda st: st.update(conditions="broken")),
    ],
    ids=["step", "history-time", "history-kind", "stable-revision", "conditions"],
)
def test_an_unreadable_status_is_reported_and_nothing_is_done(field, corrupt):
    """A status field of the wrong type (or a value this operator does not know) is never replaced by an
    empty status: no child is applied, scaled or deleted, no revision goes to 100 %, the rollout fields
    stay as they are; Degraded/InvalidStatus and one Warning event name the field. Fixed, the rollout
    resumes where it was."""
    w, old, new = mid_canary()
    before = copy.deepcopy(w.status)
    deps = deployments(w)
    corrupt(w.raw["status"])
    corrupted = copy.deepcopy(w.status)
    w.fake.writes.clear()
    w.fake.events.clear()
    w.run_for(120)  # far past the step interval and the bake time: timers and watch events keep coming
    assert deployments(w) == deps
    assert [x for x in w.fake.writes if x[1] != "ModelDeployment/status"] == []
    st = w.status
    for key in ("stableRevision", "canaryRevision", "step", "canaryWeight", "history", "revisions"):
        assert st.get(key) == corrupted.get(key), key
    assert st["stableRevision"] == before["stableRevision"] or field == "status.stableRevision"
    warnings = [e for e in w.fake.events if e["reason"] == "InvalidStatus"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning" and field in warnings[0]["message"]
    if field == "status.conditions":
        assert w.fake.writes == [] and st["conditions"] == "broken"  # nothing we can write safely
    else:
        assert len(w.fake.writes) == 1  # the report, once
        degraded = w.cond("Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "InvalidStatus")
        assert field in degraded["message"] and st["phase"] == "Degraded"
    assert not {"Deployed", "Promoted", "Deleted", "InvalidSpec"} & set(w.event_reasons())

    # fixed by hand: the rollout resumes from the state it was in (the canary is judged, then promoted)
    for key in ("step", "history", "stableRevision", "conditions"):
        w.raw["status"][key] = copy.deepcopy(before[key])
    w.reconcile()
    assert (w.status["stableRevision"], w.status["canaryRevision"]) == (old, new)
    assert w.cond("Degraded")["reason"] != "InvalidStatus"
    w.run_for(60)
    assert w.status["stableRevision"] == new
    assert [h["outcome"] for h in w.status["history"]] == ["Deployed", "Promoted"]


def test_an_invalid_spec_keeps_the_rollout_state_in_status():
    """The InvalidSpec report changes only the Degraded condition, phase and observedGeneration: fixed,
    the canary goes on from its step instead of starting over or going straight to 100 %."""
    w, old, new = mid_canary()
    st = w.raw["status"]
    st["history"][0]["decidedBy"] = "a newer operator"  # an unknown field is no reason to give up the state
    before = copy.deepcopy(w.status)
    spec = copy.deepcopy(w.raw["spec"])
    w.raw["spec"]["rollout"] = {"steps": [50, 10]}
    w.fake.writes.clear()
    w.reconcile()
    assert w.fake.writes == [("patch", "ModelDeployment/status", "minilm")]
    assert w.cond("Degraded")["reason"] == "InvalidSpec"
    assert "spec.rollout.steps" in w.cond("Degraded")["message"]
    for key in ("stableRevision", "canaryRevision", "step", "history", "revisions", "analysis"):
        assert w.status.get(key) == before.get(key), key

    w.raw["spec"] = spec
    w.reconcile()
    assert (w.status["stableRevision"], w.status["canaryRevision"], w.status["step"]) == (old, new, 0)
    assert "Deleted" not in w.event_reasons()


def test_a_wrong_status_and_an_invalid_spec_report_the_status_first():
    w, _, _ = mid_canary()
    w.raw["status"]["step"] = "two"
    w.raw["spec"]["rollout"] = {"steps": [50, 10]}
    deps = deployments(w)
    w.reconcile()
    assert deployments(w) == deps and w.status["step"] == "two"
    assert w.cond("Degraded")["reason"] == "InvalidStatus"
