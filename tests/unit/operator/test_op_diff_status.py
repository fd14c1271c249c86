"""needs_apply (subset + hash + quantities), pod facts, conditions and the status diff."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from modeldeploy import builders as b
from modeldeploy.api import Condition, ModelDeploymentStatus
from modeldeploy.diff import mismatches, needs_apply, quantity
from modeldeploy.status import (
    ConditionSpec,
    count_pods,
    merge_conditions,
    phase_of,
    pod_facts,
    status_patch,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def desired():
    return b.stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "s", "labels": {"a": "1"}},
            "spec": {"ports": [{"port": 80}], "resources": {"limits": {"cpu": "500m"}}},
        }
    )


def live_of(obj):
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="x", resourceVersion="7", creationTimestamp="2026-01-01T00:00:00Z")
    live["metadata"]["labels"]["extra"] = "someone else's"
    live["spec"]["clusterIP"] = "10.0.0.1"
    live["spec"]["ports"][0]["protocol"] = "TCP"
    live["status"] = {"loadBalancer": {}}
    return live


def test_no_apply_when_live_holds_desired_plus_defaults():
    d = desired()
    assert not needs_apply(d, live_of(d))


def test_apply_when_missing_drifted_or_rehashed():
    d = desired()
    assert needs_apply(d, None)
    drifted = live_of(d)
    drifted["spec"]["ports"][0]["port"] = 81
    assert needs_apply(d, drifted)
    assert mismatches(d, drifted) == [("spec", "ports", 0, "port")]
    relabelled = live_of(d)
    relabelled["metadata"]["labels"]["a"] = "2"
    assert needs_apply(d, relabelled)
    other = live_of(d)
    other["metadata"]["annotations"][b.ANNOTATION_APPLIED] = "0" * 16
    assert needs_apply(d, other)


def test_removed_list_item_is_drift():
    d = desired()
    live = live_of(d)
    live["spec"]["ports"] = []
    assert needs_apply(d, live)


def test_quantities_compare_by_value():
    d = desired()
    live = live_of(d)
    live["spec"]["resources"]["limits"]["cpu"] = "0.5"
    assert not needs_apply(d, live)
    live["spec"]["resources"]["limits"]["cpu"] = "1"
    assert needs_apply(d, live)


def test_ignored_paths():
    d = desired()
    live = live_of(d)
    live["spec"]["ports"][0]["port"] = 81
    assert not needs_apply(d, live, frozenset({("spec", "ports", 0, "port")}))


def test_quantity():
    assert quantity("2Gi") == 2 * 2**30
    assert quantity("500m") == quantity("0.5")
    assert quantity(2) == quantity("2")
    assert quantity("1e3") == 1000
    assert quantity("lots") is None
    assert quantity(None) is None and quantity(True) is None and quantity("") is None


# ---------------------------------------------------------------------------------------------- pods


def pod(
    name, rev="r1", *, scheduled=True, containers_ready=True, gate="True", unschedulable_msg=None, **meta
):
    conds = []
    if unschedulable_msg:
        conds.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable_msg,
            }
        )
    elif scheduled:
        conds.append({"type": "PodScheduled", "status": "True"})
    conds.append({"type": "ContainersReady", "status": "True" if containers_ready else "False"})
    if gate is not None:
        conds.append({"type": b.READINESS_GATE, "status": gate})
    ready = containers_ready and gate == "True"
    conds.append({"type": "Ready", "status": "True" if ready else "False"})
    return {
        "metadata": {"name": name, "labels": {b.LABEL_NAME: "m", b.LABEL_REVISION: rev}, **meta},
        "spec": {"nodeName": "n"} if scheduled and not unschedulable_msg else {},
        "status": {"phase": "Running" if scheduled else "Pending", "conditions": conds},
    }


def test_pod_facts_read_scheduler_reason_and_gates():
    f = pod_facts(pod("p", unschedulable_msg="0/2 nodes are available: 2 Insufficient nvidia.com/gpu."))
    assert f.unschedulable
    assert f.scheduling_message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    g = pod_facts(pod("q", gate="False"))
    assert g.containers_ready and not g.ready and g.gate == "False"
    h = pod_facts(pod("r", gate=None))
    assert h.gate is None


def test_count_pods_per_revision():
    pods = [
        pod("a"),
        pod("b", containers_ready=False),
        pod("c", gate="False"),
        pod("d", rev="r2", unschedulable_msg="no gpu"),
        pod("e", rev="r2", unschedulable_msg="also no gpu"),
        pod("f", deletionTimestamp="2026-01-01T00:00:00Z"),
    ]
    counts = count_pods(pod_facts(p) for p in pods)
    r1, r2 = counts["r1"], counts["r2"]
    assert (r1.current, r1.ready, r1.pods_in_traffic, r1.unschedulable) == (3, 2, 1, 0)
    assert (r2.current, r2.unschedulable) == (2, 2)
    assert r2.scheduling_message == "also no gpu"  # sorted: stable across pod orders


# ---------------------------------------------------------------------------------------------- conditions


def test_last_transition_time_changes_only_when_status_flips():
    c0 = merge_conditions([], [ConditionSpec("Ready", "False", "ReplicasNotReady", "0/1")], 1, T0)
    assert c0[0].last_transition_time == T0
    same = merge_conditions(c0, [ConditionSpec("Ready", "False", "Other", "still 0/1")], 2, T1)
    assert same[0].last_transition_time == T0
    assert same[0].reason == "Other" and same[0].observed_generation == 2
    flip = merge_conditions(same, [ConditionSpec("Ready", "True", "MinimumReplicasReady", "1/1")], 2, T1)
    assert flip[0].last_transition_time == T1


def test_foreign_conditions_are_kept():
    foreign = Condition(
        type="example.com/Custom", status="True", last_transition_time=T0, reason="X", message=""
    )
    out = merge_conditions([foreign], [ConditionSpec("Ready", "True", "R", "")], 1, T1)
    assert [c.type for c in out] == ["Ready", "example.com/Custom"]


def test_phase():
    assert phase_of(ready=True, progressing=False, degraded=False, paused=False) == "Healthy"
    assert phase_of(ready=False, progressing=True, degraded=False, paused=False) == "Progressing"
    assert phase_of(ready=False, progressing=True, degraded=False, paused=True) == "Paused"
    assert phase_of(ready=True, progressing=False, degraded=True, paused=False) == "Degraded"
    assert phase_of(ready=False, progressing=False, degraded=False, paused=False) == "Pending"


# ---------------------------------------------------------------------------------------------- diff


def test_status_patch_is_none_when_equal_even_in_wire_form():
    st = ModelDeploymentStatus(
        observed_generation=2,
        phase="Healthy",
        conditions=merge_conditions([], [ConditionSpec("Ready", "True", "R", "ok")], 2, T0),
    )
    wire = st.to_api()
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert status_patch(wire, st) is None


def test_status_patch_holds_only_what_changed():
    old = ModelDeploymentStatus(observed_generation=1, phase="Pending", stable_revision="a")
    new = old.model_copy(update={"phase": "Healthy", "stable_revision": None})
    assert status_patch(old.to_api(), new) == {"phase": "Healthy", "stableRevision": None}


def test_status_patch_from_empty():
    patch = status_patch(None, ModelDeploymentStatus(phase="Pending"))
    assert patch == {"phase": "Pending"}


def test_a_legacy_history_without_kinds_is_no_status_change():
    entry = {"revision": "abc", "outcome": "RolledBack", "time": "2026-01-01T00:00:00Z", "reason": "x"}
    new = ModelDeploymentStatus.model_validate({"history": [entry]})
    assert new.to_api()["history"][0]["kind"] == "RolledBack"
    assert status_patch({"history": [entry]}, new) is None
