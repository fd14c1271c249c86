"""Autoscaling on a serving signal, end to end: the operator's KEDA ScaledObject reads the servers'
concurrency from Prometheus, KEDA's HPA (kube-controller-manager) writes the ModelDeployment's
``spec.replicas`` through its scale subresource, and the operator splits them between revisions.

The model is the noop model with a fixed service time and one item per batch: a pod's capacity is fixed
(10 requests/s), as a GPU's is, so more pods really are more capacity. MiniLM on this machine's two CPU
cores would not be: its pods share the same cores, and adding one adds no throughput.
"""

from __future__ import annotations

import math
import time
from typing import Any

from localcluster.testing import Kube, wait_for

from .canary_support import LoadGenerator, md_status, noop_md

NAME = "elastic"
SERVICE_TIME_MS = 100
MD = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
SCALE = MD + "/scale"
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 4,
    "metric": "concurrency",
    "target": 2,
    "window": "30s",
    "pollingInterval": "5s",
    "scaleDownStabilization": "20s",
}


def elastic_md(kube: Kube, version: str, **rollout: Any) -> dict[str, Any]:
    body = noop_md(NAME, version, f"noop://?delay_ms={SERVICE_TIME_MS}&rev={version}", **rollout)
    body["spec"]["batching"] = {"maxBatchSize": 1, "maxQueueDelayMs": 1, "maxQueueSize": 256}
    # KEDA runs in the pod network: Prometheus as pods reach it
    prometheus = kube.cluster.prometheus_url_pods or kube.cluster.prometheus_url
    body["spec"]["autoscaling"] = {**AUTOSCALING, "prometheusUrl": prometheus}
    del body["spec"]["replicas"]  # the HPA owns it
    return body


def replicas(kube: Kube, ns: str) -> int:
    return int((kube.get(SCALE.format(ns=ns, name=NAME)) or {}).get("spec", {}).get("replicas", 0))


def quantile(latencies: list[float], q: float) -> float:
    xs = sorted(latencies)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def test_load_scales_the_modeldeployment_out_and_back_in(kube: Kube, operator: Any, namespace: str) -> None:
    ns = namespace
    kube.apply(elastic_md(kube, "1"), ns)
    wait_for(lambda: md_status(kube, ns, NAME).get("readyReplicas") == 1, timeout=120, what="v1 ready")
    so = kube.get(f"/apis/keda.sh/v1alpha1/namespaces/{ns}/scaledobjects/{NAME}")
    assert so is not None and so["spec"]["scaleTargetRef"]["kind"] == "ModelDeployment"
    scale = kube.get(SCALE.format(ns=ns, name=NAME))
    assert scale is not None and scale["status"]["selector"] == f"modeldeploy.io/name={NAME}"

    # 6 clients, each always waiting for an answer: 6 requests in the servers -> ceil(6 / 2) = 3 pods
    load = LoadGenerator(kube, ns, NAME, workers=6, pause=0.0, max_seconds=300).wait_serving().start()
    started = time.monotonic()
    try:
        wait_for(lambda: replicas(kube, ns) >= 3, timeout=150, what="scaled out to >= 3")
        scaled_out = time.monotonic()
        wait_for(
            lambda: md_status(kube, ns, NAME).get("readyReplicas", 0) >= 3,
            timeout=120,
            what="3 pods in traffic",
        )
        in_traffic = time.monotonic()
        time.sleep(15)  # a window of traffic on the larger fleet
        hpa = kube.get(f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{NAME}")
        assert hpa is not None and hpa["spec"]["scaleTargetRef"]["kind"] == "ModelDeployment"
    finally:
        load.stop()
    before = [r.latency for r in load.snapshot() if r.kind == "ok" and r.t < started + 15]
    after = [r.latency for r in load.snapshot(since=in_traffic + 2) if r.kind == "ok"]
    print(
        f"scaled out {scaled_out - started:.1f}s after the load began, pods in traffic after "
        f"{in_traffic - started:.1f}s; on 1 pod p50/p99 {quantile(before, 0.5):.3f}/"
        f"{quantile(before, 0.99):.3f}s ({len(before)} requests), on >= 3 pods "
        f"{quantile(after, 0.5):.3f}/{quantile(after, 0.99):.3f}s ({len(after)} requests)"
    )
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    assert before and after
    # one pod: each request waits behind the other 5 clients' (~0.6 s); three or more: a fraction of that
    # (kube-proxy balances connections at random, so some queueing remains)
    assert quantile(after, 0.5) < quantile(before, 0.5) / 1.5
    # load gone: back to minReplicas after the stabilization window
    wait_for(lambda: replicas(kube, ns) == 1, timeout=180, what="back to 1 replica")
    wait_for(lambda: md_status(kube, ns, NAME).get("servingReplicas") == 1, timeout=30, what="status follows")


def test_scaling_during_a_canary_keeps_the_weight_within_one_pod(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    kube.apply(elastic_md(kube, "1"), ns)
    wait_for(lambda: md_status(kube, ns, NAME).get("readyReplicas") == 1, timeout=120, what="v1 ready")
    load = LoadGenerator(kube, ns, NAME, workers=6, pause=0.0, max_seconds=300).wait_serving().start()
    seen: list[tuple[int, int, int]] = []
    try:
        wait_for(lambda: replicas(kube, ns) >= 3, timeout=150, what="scaled out to >= 3")
        # a canary that holds at 50 % while the autoscaler keeps working
        kube.apply(elastic_md(kube, "2", steps=[50, 100], interval="10m"), ns)
        wait_for(
            lambda: md_status(kube, ns, NAME).get("canaryWeight") == 50, timeout=60, what="canary at 50%"
        )
        load.stop()  # the load goes: the autoscaler scales in during the canary
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            st = md_status(kube, ns, NAME)
            if st.get("canaryWeight") is not None and st.get("achievedCanaryWeight") is not None:
                pods = sum(r.get("inTrafficReplicas", 0) for r in st.get("revisions") or [])
                seen.append((st["canaryWeight"], st["achievedCanaryWeight"], pods))
            if replicas(kube, ns) == 1 and seen and seen[-1][2] <= 2:
                break
            time.sleep(0.5)
    finally:
        load.stop()
    print(f"(requested, achieved, pods in traffic) while scaling in: {sorted(set(seen))}")
    assert replicas(kube, ns) == 1, "the autoscaler did not scale in during the canary"
    assert {s[0] for s in seen} == {50}  # the canary was neither promoted nor rolled back by scaling
    settled = [s for s in seen if s[2] > 0]
    assert settled
    for requested, achieved, pods in settled:
        # within one pod's share of the requested weight (the operator re-splits every new count)
        assert abs(achieved - requested) <= math.ceil(100 / pods), (requested, achieved, pods)
    # at rest on one replica: one canary pod next to one stable pod
    wait_for(
        lambda: md_status(kube, ns, NAME).get("achievedCanaryWeight") == 50,
        timeout=60,
        what="50% on 1+1 pods",
    )
