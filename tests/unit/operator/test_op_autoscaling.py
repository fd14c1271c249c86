"""Autoscaling: the scale subresource's status, spec.autoscaling as a KEDA ScaledObject owned by the
operator, and the HPA writing spec.replicas in the middle of a canary without fighting it."""

from __future__ import annotations

import pytest
from md_canary import World, canary_md
from modeldeploy import autoscaling
from modeldeploy.api import AutoscalingSpec, ModelDeployment
from modeldeploy.traffic_split import achieved_weight, replica_split
from pydantic import ValidationError

AUTOSCALING = {"minReplicas": 1, "maxReplicas": 6, "metric": "queueWaitP90", "target": 0.05}


def md(**over) -> ModelDeployment:
    body = canary_md()
    body["spec"].update(over)
    return ModelDeployment.from_api(body)


def test_concurrency_is_the_default_signal():
    assert AutoscalingSpec.model_validate({"maxReplicas": 3, "target": 2}).metric == "concurrency"


def test_bounds_are_checked():
    with pytest.raises(ValidationError, match="minReplicas must not exceed maxReplicas"):
        AutoscalingSpec.model_validate({"minReplicas": 4, "maxReplicas": 2, "target": 1})
    with pytest.raises(ValidationError, match="target"):
        AutoscalingSpec.model_validate({"maxReplicas": 2, "target": 0})


def test_scaled_object_targets_the_modeldeployment_scale_subresource():
    m = md(autoscaling=AUTOSCALING)
    assert m.spec.autoscaling is not None
    so = autoscaling.build_scaled_object(m, m.spec.autoscaling, "http://prom:9090")
    assert so["apiVersion"] == "keda.sh/v1alpha1" and so["kind"] == "ScaledObject"
    assert so["metadata"]["ownerReferences"][0]["uid"] == m.uid
    spec = so["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "name": "minilm",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (1, 6, 15)
    hpa = spec["advanced"]["horizontalPodAutoscalerConfig"]
    assert hpa["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    assert trigger["metadata"]["serverAddress"] == "http://prom:9090"
    assert trigger["metadata"]["threshold"] == "0.05"
    q = trigger["metadata"]["query"]
    assert "histogram_quantile(0.9" in q and "modelserver_queue_wait_seconds_bucket" in q
    assert 'namespace="default",modeldeploy_io_name="minilm"' in q and "[1m]" in q


@pytest.mark.parametrize(
    ("metric", "series", "kind"),
    [
        ("concurrency", "modelserver_inflight_requests", "AverageValue"),
        ("queueDepth", "modelserver_queue_depth", "AverageValue"),
        ("requestRate", "modelserver_requests_total", "AverageValue"),
    ],
)
def test_per_pod_signals_are_average_value_targets(metric, series, kind):
    m = md(autoscaling={**AUTOSCALING, "metric": metric, "target": 8})
    assert m.spec.autoscaling is not None
    q, metric_type = autoscaling.query(m, m.spec.autoscaling)
    assert series in q and metric_type == kind
    assert q.endswith("or vector(0)")  # no traffic is 0, not "no data"


def scaled_objects(w: World) -> list[dict]:
    return w.fake.of_kind("ScaledObject")


def test_the_operator_owns_the_scaled_object_and_removes_it_with_the_setting():
    w = World(canary_md(replicas=2))
    w.edit(autoscaling=AUTOSCALING)
    w.deploy_first()
    (so,) = scaled_objects(w)
    assert so["metadata"]["name"] == "minilm"
    assert w.status["autoscaler"] == "minilm"
    # the scale subresource reads these
    assert w.status["servingReplicas"] == 2
    assert w.status["selector"] == "modeldeploy.io/name=minilm"
    del w.raw["spec"]["autoscaling"]
    w.raw["metadata"]["generation"] += 1
    w.reconcile()
    assert scaled_objects(w) == []
    assert "autoscaler" not in w.status


def test_without_a_prometheus_url_the_autoscaler_is_reported_not_guessed():
    w = World(canary_md(replicas=1))
    w.rec.prometheus_url = ""
    w.edit(autoscaling=AUTOSCALING)
    w.reconcile()
    assert scaled_objects(w) == []
    degraded = w.cond("Degraded")
    assert degraded["status"] == "True" and "spec.autoscaling" in degraded["message"]


def test_hpa_scaling_during_a_canary_keeps_the_weight_within_one_pod():
    """The HPA writes spec.replicas (through the scale subresource) while a canary is at 25 %: the
    operator re-splits the new count, so the achieved weight stays within one pod of the step's."""
    w = World(canary_md(replicas=4))
    w.edit(autoscaling={**AUTOSCALING, "maxReplicas": 12})
    stable = w.deploy_first()
    canary = w.new_version("2")
    w.run_for(3)
    assert w.status["canaryRevision"] == canary and w.status["canaryWeight"] == 25
    for replicas in (8, 12, 3):
        w.raw["spec"]["replicas"] = replicas  # what the HPA does
        w.raw["metadata"]["generation"] += 1
        w.run_for(3)
        w.reconcile()  # settled: no clock tick, so no step change in between
        if w.status.get("canaryRevision") != canary:
            break
        c_in, s_in = w.pods_in_traffic(canary), w.pods_in_traffic(stable)
        weight = w.status["canaryWeight"]
        assert (c_in, s_in) == replica_split(replicas, weight)  # re-split for the new count
        assert c_in + s_in >= replicas  # capacity follows the autoscaler
        achieved = achieved_weight(c_in, s_in)
        assert achieved == w.status["achievedCanaryWeight"]
        assert achieved is not None and abs(achieved - weight) <= 100 / (c_in + s_in)  # within one pod
        assert w.status["servingReplicas"] == replicas


@pytest.mark.parametrize("replicas", [2, 1])
def test_scaling_in_during_a_canary_never_leaves_a_revision_without_a_pod_in_traffic(replicas):
    """The autoscaler scales in (4 -> 2 or 1) while a canary is at 50 %. The operator takes the extra pods
    out of traffic and the ReplicaSets delete pods; the kubelet turns a gated-out pod not Ready only a
    moment later, so a ReplicaSet that scaled at once could delete the very pod the operator kept in
    traffic (its order is its own): the revision would serve from no pod and every client would go to
    the other one (CI saw it: achieved 100 % at a 50 % step). After every reconcile and every round of
    the cluster's controllers each revision keeps a pod in traffic; then the split is 1 + 1."""
    w = World(canary_md(replicas=4, steps=[50, 100], interval="10m"))
    w.edit(autoscaling={**AUTOSCALING, "maxReplicas": 12})
    stable = w.deploy_first()
    canary = w.new_version("2")
    w.run_for(3)
    assert (w.pods_in_traffic(canary), w.pods_in_traffic(stable)) == (2, 2)
    empty: list[str] = []
    reconcile, controllers = w.rec.reconcile, w.controllers

    def check(when: str) -> None:
        for rev in (stable, canary):
            if w.pods_in_traffic(rev) == 0:
                empty.append(f"{when}: {rev} has no pod in traffic ({w.gated(rev)})")

    def checked_reconcile(ns: str, name: str):
        out = reconcile(ns, name)
        check("after a reconcile")
        return out

    def checked_controllers() -> None:
        controllers()
        check("after the controllers")

    w.rec.reconcile, w.controllers = checked_reconcile, checked_controllers  # type: ignore[method-assign]
    w.raw["spec"]["replicas"] = replicas  # what the HPA does
    w.raw["metadata"]["generation"] += 1
    w.run_for(5)
    assert empty == []
    assert (w.pods_in_traffic(canary), w.pods_in_traffic(stable)) == (1, 1)
    # and the extra pods are gone: the canary keeps its pod, the stable its full count (one in traffic)
    assert (len(w.pods(canary)), len(w.pods(stable))) == (1, replicas)
    assert w.status["achievedCanaryWeight"] == 50


def gen_md(**autoscaling) -> ModelDeployment:
    body = canary_md()
    body["spec"]["model"]["task"] = "generation"
    body["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, **autoscaling}
    return ModelDeployment.from_api(body)


@pytest.mark.parametrize(
    ("metric", "series", "kind"),
    [
        # a generation server has no batching queue: requests in it are its sequences, running or waiting
        ("concurrency", "modelserver_generation_requests_running", "AverageValue"),
        ("waitingSequences", "modelserver_generation_requests_waiting", "AverageValue"),
        # a utilisation: the HPA scales by current x mean usage / target
        ("kvCacheUsage", "avg(modelserver_generation_kv_cache_usage_ratio", "Value"),
        ("requestRate", "modelserver_requests_total", "AverageValue"),
    ],
)
def test_a_generation_deployment_scales_on_the_engine_signals_its_pods_export(metric, series, kind):
    m = gen_md(metric=metric, target=0.8)
    assert m.spec.autoscaling is not None
    q, metric_type = autoscaling.query(m, m.spec.autoscaling)
    assert series in q and metric_type == kind, q
    assert "modelserver_inflight_requests" not in q  # the generation server does not export it
    assert q.endswith("or vector(0)")


def test_concurrency_of_a_generation_deployment_counts_waiting_sequences_too():
    m = gen_md(target=4)
    assert m.spec.autoscaling is not None
    q, _ = autoscaling.query(m, m.spec.autoscaling)
    assert "modelserver_generation_requests_waiting" in q and "modelserver_generation_requests_running" in q


@pytest.mark.parametrize(
    ("task", "metric", "message"),
    [
        ("generation", "queueDepth", "queueDepth is an encoder's batching queue"),
        ("generation", "queueWaitP90", "queueWaitP90 is an encoder's batching queue"),
        ("embedding", "waitingSequences", "waitingSequences only for spec.model.task generation"),
        ("embedding", "kvCacheUsage", "kvCacheUsage only for spec.model.task generation"),
    ],
)
def test_a_signal_the_pods_do_not_export_is_refused_naming_the_field(task, metric, message):
    body = canary_md()
    body["spec"]["model"]["task"] = task
    body["spec"]["autoscaling"] = {"maxReplicas": 4, "metric": metric, "target": 0.5}
    with pytest.raises(ValidationError, match=f"spec.autoscaling.metric: {message}"):
        ModelDeployment.from_api(body)


def test_a_kv_cache_target_is_a_share_at_most_1():
    with pytest.raises(ValidationError, match="kvCacheUsage is a share of the KV cache, at most 1"):
        AutoscalingSpec.model_validate({"maxReplicas": 2, "metric": "kvCacheUsage", "target": 80})
    full = AutoscalingSpec.model_validate({"maxReplicas": 2, "metric": "kvCacheUsage", "target": 1})
    assert full.target == 1


def test_the_old_spelling_prometheus_url_is_still_read_with_one_deprecation_warning():
    w = World(canary_md(replicas=1))
    w.edit(autoscaling={**AUTOSCALING, "prometheusUrl": "http://old.example:9090"})
    w.deploy_first()
    w.reconcile()
    (so,) = scaled_objects(w)
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://old.example:9090"
    warned = [e for e in w.fake.events if e["reason"] == "DeprecatedField"]
    assert len(warned) == 1 and warned[0]["type"] == "Warning"
    assert "spec.autoscaling.prometheusURL" in warned[0]["message"]
    w.edit(autoscaling={**AUTOSCALING, "prometheusURL": "http://new.example:9090"})
    w.reconcile()
    (so,) = scaled_objects(w)
    assert so["spec"]["triggers"][0]["metadata"]["serverAddress"] == "http://new.example:9090"
    assert len([e for e in w.fake.events if e["reason"] == "DeprecatedField"]) == 1


def test_both_spellings_of_prometheus_url_are_refused_naming_the_old_one():
    both = {**AUTOSCALING, "prometheusURL": "http://a:9090", "prometheusUrl": "http://b:9090"}
    with pytest.raises(ValidationError, match=r"spec\.autoscaling\.prometheusUrl is the deprecated spelling"):
        AutoscalingSpec.model_validate(both)
