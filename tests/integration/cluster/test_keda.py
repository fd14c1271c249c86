"""KEDA in the local cluster: its metrics server is registered through the apiserver's aggregation layer
(front-proxy CA, request-header authentication, APIService ``v1beta1.external.metrics.k8s.io``), and a
ScaledObject with a Prometheus trigger makes keda-operator create an HPA that kube-controller-manager's
HPA controller acts on, scaling a Deployment from 1 to N and back.

The signal is a Prometheus query on something the test controls: how many pods of a "source" Deployment
(process-run test apps, scraped by Prometheus) are up. Scaling the source to 3 makes the query answer 3;
with a threshold of 1 per replica the HPA wants 3 replicas of the target (simulated pods); the source
back at 0 makes it answer 0, and the target goes back to its minimum, 1."""

from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any

import pytest
from localcluster import cluster as lc
from localcluster import config
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"
APISERVICE = f"/apis/apiregistration.k8s.io/v1/apiservices/{config.KEDA_APISERVICE}"
SO_API = "/apis/keda.sh/v1alpha1"
HPA_API = "/apis/autoscaling/v2"

pytestmark = [
    pytest.mark.skipif(bool(os.environ.get("E2E_KUBECONFIG")), reason="KEDA as the local cluster starts it"),
    pytest.mark.skipif(not lc.keda_enabled(), reason="LOCALCLUSTER_KEDA=0: the cluster runs no KEDA"),
]


def source_deployment(name: str) -> dict[str, Any]:
    """Process-run test apps that Prometheus scrapes (``up{app=name}`` is 1 for each); none at first."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name},
                    "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080"},
                },
                "spec": {
                    "terminationGracePeriodSeconds": 2,
                    "containers": [
                        {
                            "name": "app",
                            "image": TESTAPP,
                            "args": ["--port", "8080"],
                            "ports": [{"name": "http", "containerPort": 8080}],
                        }
                    ],
                },
            },
        },
    }


def target_deployment(name: str) -> dict[str, Any]:
    """What KEDA scales: simulated pods (kwok), one to start with."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "main", "image": "registry.example/sim:1"}]},
            },
        },
    }


def scaled_object(name: str, *, target: str, prometheus: str, query: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": target},
            "minReplicaCount": 1,
            "maxReplicaCount": 5,
            "pollingInterval": 5,
            # No scale-down stabilization (the HPA's default is 5 minutes).
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {"serverAddress": prometheus, "query": query, "threshold": "1"},
                }
            ],
        },
    }


def condition(obj: dict[str, Any] | None, kind: str) -> str:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status"))
    return ""


def quantity(q: str) -> float:
    """A Kubernetes quantity as the metrics API writes it (``3``, ``500m``, ``2k``)."""
    scale = {"m": 1e-3, "k": 1e3, "M": 1e6}
    return float(q[:-1]) * scale[q[-1]] if q[-1] in scale else float(q)


def prometheus_for_pods(kube: Kube) -> str:
    rec = lc.ClusterRecord.load(kube.cluster.state_dir)
    assert rec is not None and rec.prometheus_url_pods
    return rec.prometheus_url_pods


def test_the_external_metrics_api_is_served_through_the_aggregation_layer(kube: Kube) -> None:
    api_service = kube.get(APISERVICE)
    assert api_service is not None
    assert condition(api_service, "Available") == "True", api_service.get("status")
    assert api_service["spec"]["service"] == {
        "name": config.KEDA_METRICS_SERVICE,
        "namespace": config.KEDA_NAMESPACE,
        "port": 443,
    }
    # kubectl -> kube-apiserver -> (front-proxy client certificate, X-Remote-User) -> keda-adapter
    res = kube.kubectl("get", "--raw", "/apis/external.metrics.k8s.io/v1beta1")
    listing = json.loads(res.stdout)
    assert listing["kind"] == "APIResourceList"
    assert listing["groupVersion"] == "external.metrics.k8s.io/v1beta1"
    # and the aggregated discovery lists the group like a built-in one
    groups = json.loads(kube.kubectl("get", "--raw", "/apis").stdout)["groups"]
    assert "external.metrics.k8s.io" in {g["name"] for g in groups}


def test_the_apiserver_publishes_the_front_proxy_ca_to_extension_servers(kube: Kube) -> None:
    cm = kube.get("/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
    assert cm is not None
    data = cm["data"]
    assert "requestheader-client-ca-file" in data
    assert data["client-ca-file"] != data["requestheader-client-ca-file"]  # a CA of its own
    assert json.loads(data["requestheader-allowed-names"]) == [config.FRONT_PROXY_CLIENT]
    assert json.loads(data["requestheader-username-headers"]) == ["X-Remote-User"]


def test_a_scaled_object_with_a_prometheus_trigger_scales_a_deployment_up_and_back(
    kube: Kube, namespace: str
) -> None:
    ns = namespace
    kube.apply(source_deployment("source"), namespace=ns)
    kube.apply(target_deployment("target"), namespace=ns)
    query = f'count(up{{namespace="{ns}", app="source"}} == 1) or vector(0)'
    so = scaled_object("target", target="target", prometheus=prometheus_for_pods(kube), query=query)
    kube.apply(so, namespace=ns)

    # keda-operator makes the HPA and reports the ScaledObject Ready (its scaler reached Prometheus).
    hpa_path = f"{HPA_API}/namespaces/{ns}/horizontalpodautoscalers/keda-hpa-target"
    hpa = wait_for(lambda: kube.get(hpa_path), timeout=90, what="KEDA's HPA for the ScaledObject")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "target"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 5)
    [metric] = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    metric_name = metric["external"]["metric"]["name"]
    so_path = f"{SO_API}/namespaces/{ns}/scaledobjects/target"
    wait_for(lambda: condition(kube.get(so_path), "Ready") == "True", timeout=90, what="ScaledObject Ready")

    def external_value() -> float:
        selector = urllib.parse.quote("scaledobject.keda.sh/name=target", safe="")
        raw = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric_name}?labelSelector={selector}"
        items = json.loads(kube.kubectl("get", "--raw", raw).stdout)["items"]
        return quantity(items[0]["value"])

    def target_replicas() -> tuple[int, int]:
        d = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/target") or {}
        return d["spec"]["replicas"], (d.get("status") or {}).get("readyReplicas", 0)

    # nothing up yet: the query answers 0, the HPA keeps the minimum
    wait_for(lambda: external_value() == 0, timeout=60, what="the external metric at 0")
    wait_for(lambda: condition(kube.get(hpa_path), "ScalingActive") == "True", timeout=90, what="HPA active")
    assert target_replicas()[0] == 1

    kube.kubectl("scale", "deployment/source", "--replicas=3", "-n", ns)
    wait_for(lambda: external_value() == 3, timeout=120, what="the external metric at 3 (3 sources up)")
    wait_for(lambda: target_replicas() == (3, 3), timeout=120, what="the HPA scaling the target to 3")
    hpa = kube.get(hpa_path) or {}
    assert hpa["status"]["desiredReplicas"] == 3
    [current] = hpa["status"]["currentMetrics"]
    assert current["external"]["metric"]["name"] == metric_name

    kube.kubectl("scale", "deployment/source", "--replicas=0", "-n", ns)
    wait_for(lambda: external_value() == 0, timeout=120, what="the external metric back at 0")
    wait_for(lambda: target_replicas() == (1, 1), timeout=120, what="the HPA scaling the target back to 1")

    # Deleting the ScaledObject deletes its HPA (owner reference), and the Deployment keeps its size.
    kube.api.delete(so_path)
    wait_for(lambda: kube.get(hpa_path) is None, timeout=60, what="the HPA gone with its ScaledObject")
    assert target_replicas()[0] == 1
