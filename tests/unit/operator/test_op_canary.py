"""Progressive delivery as a spec: steps, judging, promotion, rollback, warm standby, failback and
restarts (commands, the plugin and history kinds: test_op_rollout_commands.py) -- the reconciler against
the in-memory apiserver, a fake clock and a fake Prometheus (tests/unit/operator/md_canary.py).
Deterministic: no sleeps, no network."""

from __future__ import annotations

import json

import pytest
from md_canary import World, canary_md
from modeldeploy import builders as b
from modeldeploy import metrics, routing
from modeldeploy.analysis import ERROR_RATE, P99, REQUESTS, TPOT, TTFT
from modeldeploy.traffic_split import ready_endpoints


def rollout_metric(result: str) -> float:
    return metrics.ROLLOUTS.labels(result=result)._value.get()


# ---------------------------------------------------------------------------------------------- first


def test_first_revision_goes_straight_to_100_percent():
    w = World()
    rev = w.deploy_first()
    st = w.status
    assert st["stableRevision"] == rev and "canaryRevision" not in st and "step" not in st
    assert w.pods_in_traffic(rev) == 2
    assert [h["outcome"] for h in st["history"]] == ["Deployed"]
    assert st["phase"] == "Healthy"
    assert w.prom.queries == []  # nothing to judge


# ---------------------------------------------------------------------------------------------- promotion


def test_good_revision_is_promoted_through_every_step_with_warm_previous():
    w = World()
    old = w.deploy_first()
    old_pods = set(w.gated(old))
    new = w.new_version("2")
    w.reconcile()
    st = w.status
    assert (st["canaryRevision"], st["step"], st["canaryWeight"]) == (new, 0, 25)
    # replicas mode, 2 replicas, 25 %: one canary pod next to two stable pods -> 33 %
    assert (w.pods_in_traffic(new), w.pods_in_traffic(old)) == (1, 2)
    assert st["achievedCanaryWeight"] == 33
    assert st["phase"] == "Progressing"
    seen = []
    for _ in range(40):
        w.run_for(1)
        st = w.status
        seen.append((st.get("step"), st.get("canaryWeight"), st.get("achievedCanaryWeight")))
        if st["stableRevision"] == new:
            break
    steps = [s for s in dict.fromkeys(seen) if s[0] is not None]
    # at 100 % the second canary pod has to start: a stable pod stands in for it meanwhile (50 %), so the
    # capacity in traffic never drops below the replicas
    assert steps == [(0, 25, 33), (1, 50, 50), (2, 100, 50), (2, 100, 100)]
    assert w.prom.windows(new) == 3  # exactly one judged window per step
    st = w.status
    assert st["stableRevision"] == new and "canaryRevision" not in st
    assert st["previousRevision"] == old and st["previousExpiresAt"]
    assert [h["outcome"] for h in st["history"]] == ["Deployed", "Promoted"]
    # the previous revision keeps one warm pod, out of traffic, one of its original pods (not restarted)
    assert w.pods_in_traffic(new) == 2 and w.pods_in_traffic(old) == 0
    warm = w.gated(old)
    assert len(warm) == 1 and set(warm.values()) == {"False"} and set(warm) <= old_pods
    assert {r["revision"]: r["role"] for r in st["revisions"]} == {new: "stable", old: "previous"}
    assert {"CanaryStarted", "AnalysisPassed", "StepAdvanced", "Promoted"} <= set(w.event_reasons())


def test_previous_revision_is_scaled_down_after_its_ttl():
    w = World(canary_md(keepPrevious={"replicas": 1, "ttl": "60s"}, bakeTime="0s"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert w.status["stableRevision"] == new and w.status["previousRevision"] == old
    w.run_for(60)
    assert "previousRevision" not in w.status
    assert w.fake.obj("Deployment", f"minilm-{old}") is None
    assert "PreviousExpired" in w.event_reasons()


def test_a_promotion_with_keep_previous_zero_removes_the_old_revision():
    w = World(canary_md(keepPrevious={"replicas": 0, "ttl": "5m"}))
    old = w.deploy_first()
    w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert "previousRevision" not in w.status
    assert w.fake.obj("Deployment", f"minilm-{old}") is None


# ---------------------------------------------------------------------------------------------- rollback


def test_erroring_canary_is_rolled_back_at_the_first_failed_window():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {ERROR_RATE: 0.2}
    before = rollout_metric("rolled_back")
    w.reconcile()
    w.run_for(9)
    assert w.status["canaryRevision"] == new  # the first window is judged after one interval
    w.run_for(1)
    st = w.status
    assert "canaryRevision" not in st and st["stableRevision"] == old
    assert st["phase"] == "Degraded"
    assert w.cond("Degraded")["reason"] == "RolledBack"
    assert "error-rate" in w.cond("Degraded")["message"]
    h = st["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "RolledBack")
    m = h["measurement"]
    assert m["metric"] == ERROR_RATE and m["value"] == 0.2 and m["threshold"] == 0.01
    assert 'code=~"5..|413|429"' in m["query"] and f'modeldeploy_io_revision="{new}"' in m["query"]
    ev = [e for e in w.fake.events if e["reason"] == "RolledBack" and e["message"].startswith("revision")]
    assert len(ev) == 1 and ev[0]["type"] == "Warning" and "0.2" in ev[0]["message"]
    assert rollout_metric("rolled_back") == before + 1
    # all traffic on the stable revision; the failed revision is gone and stays gone
    assert w.pods_in_traffic(old) == 2 and w.pods(new) == []
    assert w.fake.obj("Deployment", f"minilm-{new}") is None
    w.run_for(30)
    assert w.fake.obj("Deployment", f"minilm-{new}") is None
    assert [h["outcome"] for h in w.status["history"]].count("RolledBack") == 1


def test_rollback_takes_the_canary_out_of_traffic_before_anything_is_deleted():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {ERROR_RATE: 0.5}
    w.reconcile()
    w.clock.tick(10)
    w.fake.writes.clear()
    w.rec.reconcile("default", "minilm")
    canary_pods = {p["metadata"]["name"] for p in w.pods(new)}
    gate_writes = [i for i, wr in enumerate(w.fake.writes) if wr[1] == "Pod/status" and wr[2] in canary_pods]
    delete = w.fake.writes.index(("delete", "Deployment", f"minilm-{new}"))
    assert gate_writes and max(gate_writes) < delete
    assert set(w.gated(new).values()) == {"False"}


def test_slow_canary_is_rolled_back_on_p99():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {P99: 1500.0}
    w.reconcile()
    w.run_for(10)
    h = w.status["history"][-1]
    assert h["outcome"] == "RolledBack" and h["measurement"]["metric"] == P99


def test_latency_ratio_to_stable_is_judged_against_the_stable_revision():
    w = World(canary_md(analysis={"maxLatencyRatioToStable": 1.5}))
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {"latency-ratio-to-stable": 3.0}
    w.reconcile()
    w.run_for(10)
    h = w.status["history"][-1]
    assert h["outcome"] == "RolledBack" and h["measurement"]["metric"] == "latency-ratio-to-stable"
    assert f'modeldeploy_io_revision="{old}"' in h["measurement"]["query"]


def test_failure_limit_needs_consecutive_failures():
    w = World(canary_md(analysis={"failureLimit": 2}))
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {ERROR_RATE: 0.2}
    w.reconcile()
    w.run_for(10)
    st = w.status
    assert st["canaryRevision"] == new and st["step"] == 0
    assert st["analysis"]["consecutiveFailures"] == 1
    w.run_for(10)
    assert w.status["stableRevision"] == old and w.status["history"][-1]["outcome"] == "RolledBack"


def test_a_pass_resets_consecutive_failures():
    w = World(canary_md(analysis={"failureLimit": 2}))
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {ERROR_RATE: 0.2}
    w.reconcile()
    w.run_for(10)
    w.prom.values[new] = {}
    w.run_for(10)
    assert w.status["step"] == 1 and w.status["analysis"]["consecutiveFailures"] == 0


def test_custom_metric_template_and_min_threshold():
    w = World(
        canary_md(
            analysis={
                "metrics": [
                    {
                        "name": "batch-fill",
                        "query": 'avg_over_time(x{namespace="{{namespace}}",rev="{{revision}}",'
                        'n="{{name}}"}[{{interval}}])',
                        "min": 0.5,
                    }
                ]
            }
        )
    )
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {"batch-fill": 0.1}
    w.reconcile()
    w.run_for(10)
    h = w.status["history"][-1]
    assert h["outcome"] == "RolledBack"
    assert h["measurement"]["query"] == f'avg_over_time(x{{namespace="default",rev="{new}",n="minilm"}}[10s])'
    assert h["measurement"]["threshold"] == 0.5


# ---------------------------------------------------------------------------------------------- no data


def test_no_data_holds_then_fails_after_the_timeout():
    w = World(canary_md(analysis={"noDataTimeout": "30s"}))
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {REQUESTS: 3.0}  # under minRequests (20)
    w.reconcile()
    w.run_for(35)
    st = w.status
    assert st["canaryRevision"] == new and st["step"] == 0  # held, never promoted
    assert st["analysis"]["noDataSince"]
    w.run_for(10)
    st = w.status
    assert st["stableRevision"] == old and st["history"][-1]["outcome"] == "RolledBack"
    assert "noDataTimeout" in st["history"][-1]["reason"]


def lose_pods(w: World, revision: str, lost: bool = True) -> None:
    """The node holding ``revision``'s pods is lost (kube-controller-manager marks them not ready) or back."""
    for p in w.pods(revision):
        for c in p["status"]["conditions"]:
            if c["type"] == "ContainersReady":
                c["status"] = "False" if lost else "True"


@pytest.mark.parametrize(("step", "stable_in"), [(0, 2), (1, 1), (2, 2)])
def test_canary_pods_lost_mid_step_hold_the_step_and_the_stable_keeps_serving(step, stable_in):
    """A canary whose pods leave traffic mid-step (their node went NotReady) gets no traffic: its windows
    are no data and hold (nothing judged on no traffic). Below 100 % the stable keeps its share; at 100 %,
    where it had no pod in traffic, its pods stand in for the lost canary pods -- the Service never runs
    out of endpoints. Once the pods are back the step goes on and the revision is promoted."""
    w = World(canary_md(progressDeadline="10m"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    while w.status.get("step") != step or not w.status.get("stepStartedAt"):
        w.run_for(1)
    lose_pods(w, new)
    w.prom.values[new] = {REQUESTS: 0.0}  # no canary traffic reaches Prometheus
    w.run_for(60)
    st = w.status
    assert st["canaryRevision"] == new and st["step"] == step
    assert w.pods_in_traffic(new) == 0 and w.pods_in_traffic(old) == stable_in
    assert [h["outcome"] for h in st["history"]] == ["Deployed"]  # nothing judged on no traffic
    assert "AnalysisHold" in w.event_reasons()
    lose_pods(w, new, lost=False)
    w.prom.values[new] = {}
    w.run_for(120)
    st = w.status
    assert st["stableRevision"] == new
    assert [h["outcome"] for h in st["history"]] == ["Deployed", "Promoted"]


@pytest.mark.parametrize(("policy", "outcome"), [("pass", "step1"), ("fail", "RolledBack")])
def test_on_no_data_pass_and_fail(policy, outcome):
    w = World(canary_md(analysis={"onNoData": policy}))
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {REQUESTS: 0.0}
    w.reconcile()
    w.run_for(10)
    st = w.status
    got = "step1" if st.get("step") == 1 else st["history"][-1]["outcome"]
    assert got == outcome


# ---------------------------------------------------------------------------------------------- changes


def test_a_new_revision_mid_rollout_supersedes_the_canary():
    w = World()
    old = w.deploy_first()
    v2 = w.new_version("2")
    w.reconcile()
    w.run_for(15)
    assert w.status["step"] == 1
    v3 = w.new_version("3")
    w.reconcile()
    st = w.status
    assert (st["canaryRevision"], st["step"], st["stableRevision"]) == (v3, 0, old)
    assert w.fake.obj("Deployment", f"minilm-{v2}") is None
    assert [h["outcome"] for h in st["history"]][-1] == "Superseded"
    assert st["history"][-1]["revision"] == v2


def test_reverting_the_spec_aborts_the_canary():
    w = World()
    old = w.deploy_first()
    body = json.loads(json.dumps(w.raw["spec"]["model"]))
    v2 = w.new_version("2")
    w.reconcile()
    w.edit(model=body)
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st
    assert st["history"][-1]["outcome"] == "Aborted" and st["history"][-1]["revision"] == v2
    assert w.pods(v2) == []


def test_paused_holds_the_step_without_judging():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.edit(rollout={**w.raw["spec"]["rollout"], "paused": True})
    w.run_for(60)
    st = w.status
    assert st["step"] == 0 and st["phase"] == "Paused" and w.prom.windows(new) == 0
    w.edit(rollout={**w.raw["spec"]["rollout"], "paused": False})
    w.run_for(1)
    assert w.status["step"] == 1  # the held step had its interval long ago: judged at once


def test_operator_restart_mid_rollout_resumes_the_same_step():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(15)
    assert w.status["step"] == 1
    judged = w.prom.windows(new)
    w.rec = w.new_operator()  # everything in memory is lost
    w.run_for(4)
    assert w.status["step"] == 1 and w.prom.windows(new) == judged  # no step repeated or skipped
    w.run_for(6)
    assert w.status["step"] == 2 and w.prom.windows(new) == judged + 1


# ---------------------------------------------------------------------------------------------- failback


def test_bad_during_bake_fails_back_to_the_warm_previous_without_restarting_it():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert w.status["stableRevision"] == new
    warm = set(w.gated(old))
    assert len(warm) == 1
    w.prom.values[new] = {ERROR_RATE: 0.3}
    before = rollout_metric("failed_back")
    w.clock.tick(10)
    w.rec.reconcile("default", "minilm")  # the decision: the warm pod goes into traffic first
    st = w.status
    assert st["stableRevision"] == old and "previousRevision" not in st
    assert {n: g for n, g in w.gated(old).items() if n in warm} == dict.fromkeys(warm, "True")
    # make before break: the failed revision keeps its pods in traffic until a pod of the old one is Ready
    assert set(w.gated(new).values()) == {"True"} and len(w.pods(new)) == 2
    w.controllers()  # the kubelet: the warm pod is Ready (its gate is True)
    assert w.pods_in_traffic(old) >= 1 and warm <= set(w.gated(old))
    w.rec.reconcile("default", "minilm")  # its status change: now the failed revision leaves traffic
    assert set(w.gated(new).values()) <= {"False"}
    w.controllers()
    assert w.pods_in_traffic(new) == 0
    w.reconcile()
    assert w.pods_in_traffic(old) == 2 and w.pods(new) == []
    h = w.status["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "FailedBack") and h["measurement"]["metric"] == ERROR_RATE
    assert w.status["phase"] == "Degraded" and w.cond("Degraded")["reason"] == "FailedBack"
    assert rollout_metric("failed_back") == before + 1
    w.run_for(60)
    assert w.status["stableRevision"] == old  # the failed revision is not tried again


def test_analysis_stops_after_the_bake_time():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    w.run_for(31)
    n = w.prom.windows(new)
    w.prom.values[new] = {ERROR_RATE: 0.3}
    w.run_for(60)
    assert w.prom.windows(new) == n and w.status["stableRevision"] == new
    assert w.status["previousRevision"] == old


# ---------------------------------------------------------------------------------------------- gateway


def test_gateway_api_mode_writes_exact_weights_in_an_httproute():
    body = canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {"parentRefs": [{"name": "gw"}]}})
    w = World(body)
    old = w.deploy_first()
    route = w.fake.obj("HTTPRoute", "minilm")
    refs = route["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 100)]
    assert route["spec"]["parentRefs"][0]["name"] == "gw"
    new = w.new_version("2")
    w.reconcile(rounds=4)  # its pod comes up, is gated into traffic, and its endpoint turns ready
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 75), (f"minilm-{new}", 25)]
    assert w.status["achievedCanaryWeight"] == 25
    w.run_for(10)
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [r["weight"] for r in refs] == [50, 50]
    w.prom.values[new] = {ERROR_RATE: 0.5}
    w.run_for(10)
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 100)]
    w.run_for(routing.ROUTE_DRAIN_SECONDS)  # its pods serve on until the gateway surely has the route
    assert w.fake.obj("Service", f"minilm-{new}") is None


def test_gateway_api_mode_weights_the_canary_only_once_a_pod_of_it_is_ready():
    """No weight on a backend without a ready endpoint: a real gateway would answer 503 (KServe #5983). The
    gateway learns of a Ready pod from its Service's EndpointSlice, written a moment after the pod's own
    status (a CI run of the e2e canary test saw 15 503s from Traefik in that moment): the weight waits
    for the slice too."""
    body = canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {"parentRefs": [{"name": "gw"}]}})
    w = World(body)
    old = w.deploy_first()
    new = w.new_version("2")
    w.rec.reconcile("default", "minilm")  # the canary's Deployment exists, no pod of it yet
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 100), (f"minilm-{new}", 0)]
    assert w.status["canaryWeight"] == 25 and w.status["achievedCanaryWeight"] == 0
    w.reconcile(rounds=2)  # its pod comes up and is gated into traffic
    w.rec.reconcile("default", "minilm")  # the pod is Ready, its endpoint not yet
    assert w.pods_in_traffic(new) == 1
    canary_slice = w.fake.obj("EndpointSlice", f"minilm-{new}-slice")
    assert [ep["conditions"]["ready"] for ep in canary_slice["endpoints"]] == [False]
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 100), (f"minilm-{new}", 0)]
    assert w.status["achievedCanaryWeight"] == 0
    w.controllers()  # the EndpointSlice controller writes the ready endpoint
    w.rec.reconcile("default", "minilm")
    refs = w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["weight"]) for r in refs] == [(f"minilm-{old}", 75), (f"minilm-{new}", 25)]
    assert w.status["achievedCanaryWeight"] == 25


def test_an_endpoint_counts_for_the_gateway_only_when_ready_and_serving():
    """Traefik routes to endpoints whose ``ready`` is true; a shadow target's Service publishes not-ready
    addresses (every endpoint ready, ``serving`` the pod's own readiness), so both must hold."""

    def sl(service: str, *conditions: dict[str, bool]) -> dict:
        eps = [{"addresses": [f"10.0.0.{i}"], "conditions": c} for i, c in enumerate(conditions)]
        return {"metadata": {"labels": {"kubernetes.io/service-name": service}}, "endpoints": eps}

    slices = [
        sl("m-a", {"ready": True, "serving": True}, {"ready": False, "serving": False}),
        sl("m-a", {"ready": True}),  # a second slice of the same Service; serving absent: as ready says
        sl("m-shadow", {"ready": True, "serving": False}),  # published, not Ready
        {
            "metadata": {"labels": {}},
            "endpoints": [{"addresses": ["10.0.0.9"], "conditions": {"ready": True}}],
        },
    ]
    assert ready_endpoints(slices) == {"m-a": 2, "m-shadow": 0}


def test_revision_services_and_deployment_labels_stay_per_revision():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    svc = w.fake.obj("Service", f"minilm-{new}")
    assert svc["spec"]["selector"][b.LABEL_REVISION] == new
    assert w.fake.obj("Service", f"minilm-{old}") is not None


# ---------------------------------------------------------------------------------------------- capacity


def test_a_canary_whose_pods_never_come_is_aborted_after_the_progress_deadline():
    w = World(canary_md(progressDeadline="60s"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.rec.reconcile("default", "minilm")  # the canary's Deployment exists, its pods cannot be scheduled
    for i in range(1):
        w.fake.put(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"minilm-{new}-x{i}",
                    "labels": {b.LABEL_NAME: "minilm", b.LABEL_REVISION: new},
                },
                "spec": {},
                "status": {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                        }
                    ],
                },
            }
        )
    for _ in range(59):
        w.clock.tick(1)
        w.rec.reconcile("default", "minilm")
    st = w.status
    assert st["canaryRevision"] == new and st["stepWaitingSince"] and "stepStartedAt" not in st
    assert w.cond("Degraded")["reason"] == "PodsUnschedulable" and "Unschedulable" in w.event_reasons()
    assert w.prom.windows(new) == 0
    w.clock.tick(1)
    w.rec.reconcile("default", "minilm")
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st
    h = st["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "Aborted")
    assert "progressDeadline" in h["reason"] and "Insufficient nvidia.com/gpu" in h["reason"]
    assert w.fake.obj("Deployment", f"minilm-{new}") is None


def test_the_progress_deadline_does_not_count_once_the_step_is_in_traffic():
    w = World(canary_md(progressDeadline="5s", interval="30s"))
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(20)
    st = w.status
    assert st["canaryRevision"] == new and st["stepStartedAt"] and "stepWaitingSince" not in st


def test_operator_metrics_follow_the_rollout():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {P99: 42.0}
    w.reconcile()
    weight = metrics.CANARY_WEIGHT.labels(namespace="default", name="minilm")
    assert weight._value.get() == 33
    w.run_for(10)
    value = metrics.ANALYSIS_VALUE.labels(namespace="default", name="minilm", metric=P99)
    assert value._value.get() == 42.0
    before = rollout_metric("promoted")
    w.run_for(25)
    assert w.status["stableRevision"] == new
    assert rollout_metric("promoted") == before + 1 and weight._value.get() == 0


def generation_md(**analysis: object) -> dict:
    body = canary_md(analysis=dict(analysis))
    body["spec"]["model"]["task"] = "generation"
    return body


def new_generation(w: World, version: str) -> str:
    return w.edit(
        model={"name": "tiny", "version": version, "uri": f"file:///models/v{version}", "task": "generation"}
    )


def test_a_generative_canary_with_a_3x_slower_first_token_is_rolled_back_on_ttft():
    w = World(generation_md(maxTTFTP99Ms=300, maxTimePerOutputTokenP99Ms=50))
    w.deploy_first()
    new = new_generation(w, "2")
    # its whole answers take seconds (p99-latency-ms would fail any stream): not asked for generation
    w.prom.values[new] = {TTFT: 900.0, P99: 20000.0}
    w.reconcile()
    w.run_for(10)
    h = w.status["history"][-1]
    assert h["outcome"] == "RolledBack" and h["measurement"]["metric"] == TTFT
    assert "modelserver_generation_time_to_first_token_seconds_bucket" in h["measurement"]["query"]
    asked = {m for r, m, _ in w.prom.queries if r == new}
    assert P99 not in asked and TPOT in asked


def test_a_generative_canary_within_its_token_latencies_is_promoted():
    w = World(generation_md(maxTTFTP99Ms=300, maxTimePerOutputTokenP99Ms=50))
    w.deploy_first()
    new = new_generation(w, "2")
    w.prom.values[new] = {TTFT: 120.0, TPOT: 20.0, P99: 20000.0}
    w.reconcile()
    w.run_for(80)
    assert w.status["stableRevision"] == new
    assert w.status["history"][-1]["outcome"] == "Promoted"
