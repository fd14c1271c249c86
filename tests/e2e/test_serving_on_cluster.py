"""End to end on the local cluster: a ModelDeployment of MiniLM becomes a real inference server process
on the GPU node, the model Service's EndpointSlice names that pod, clients reach it through the Service's
ClusterIP (kube-proxy) as they do on a real cluster, real clients work, and Prometheus scrapes the server's
metrics contract from the pod it discovered."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from localcluster.config import GPU_NODE
from localcluster.kubeapi import ready_endpoints, service_url
from localcluster.testing import Kube, wait_for

from .conftest import minilm_model

MD = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
TEXTS = ["Kubernetes schedules pods.", "A canary takes a share of the traffic.", "GPUs are expensive."]


def minilm_md(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": minilm_model(),
            "replicas": 1,
            "resources": {"gpu": 1, "cpu": "1", "memory": "2Gi"},
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "batching": {"maxBatchSize": 16, "maxSequenceLength": 128, "buckets": [32, 128]},
        },
    }


def ready_endpoint(kube: Kube, ns: str, service: str) -> tuple[str, int] | None:
    eps = ready_endpoints(kube.api, ns, service)
    return eps[0] if eps else None


def infer(base: str, texts: list[str]) -> np.ndarray:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)], "data": texts}]}
    r = httpx.post(f"{base}/v2/models/minilm/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


@pytest.fixture(scope="module")
def served(kube: Kube, operator: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ns = "e2e-serving"
    kube.kubectl("create", "namespace", ns)
    kube.apply(minilm_md("minilm"), ns)

    def ready() -> bool:
        md = kube.get(MD.format(ns=ns, name="minilm")) or {}
        return any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in (md.get("status") or {}).get("conditions") or []
        )

    wait_for(ready, timeout=240, what="ModelDeployment Ready")
    ip, port = wait_for(lambda: ready_endpoint(kube, ns, "minilm"), timeout=60, what="a ready endpoint")
    base = service_url(kube.api, ns, "minilm")

    def answered_through_the_service() -> bool:
        # kube-proxy follows the EndpointSlice a moment after it names the pod: refusals until then
        try:
            return httpx.get(f"{base}/v2/health/ready", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(answered_through_the_service, timeout=30, what="the Service's ClusterIP answering")
    return {"ns": ns, "base": base, "ip": ip, "port": port}


def test_the_model_pod_is_a_real_server_on_the_gpu_node(kube: Kube, served: dict[str, Any]) -> None:
    pods = kube.pods(served["ns"], "modeldeploy.io/name=minilm")
    assert len(pods) == 1
    pod = pods[0]
    assert pod["spec"]["nodeName"] == GPU_NODE
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] in ("1", 1)
    assert pod["status"]["podIP"] == served["ip"]
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("process://")


def test_traffic_through_the_service_gives_consistent_embeddings(served: dict[str, Any]) -> None:
    first = infer(served["base"], TEXTS)
    assert first.shape == (3, 384)
    np.testing.assert_allclose(
        np.linalg.norm(first, axis=1), 1.0, atol=1e-4
    )  # normalised sentence embeddings
    for _ in range(10):
        again = infer(served["base"], [TEXTS[1]])
        np.testing.assert_allclose(again[0], first[1], atol=1e-4)
    assert float(first[0] @ first[1]) < 0.99  # different texts, different embeddings


def test_tritonclient_works_through_the_service(served: dict[str, Any]) -> None:
    client = triton.InferenceServerClient(url=served["base"].removeprefix("http://"))
    assert client.is_server_live() and client.is_model_ready("minilm")
    meta = client.get_model_metadata("minilm")
    assert meta["name"] == "minilm"
    inp = triton.InferInput("text", [2], "BYTES")
    inp.set_data_from_numpy(np.array([t.encode() for t in TEXTS[:2]], dtype=np.object_), binary_data=False)
    res = client.infer("minilm", [inp])
    out = res.as_numpy(res.get_response()["outputs"][0]["name"])
    np.testing.assert_allclose(out, infer(served["base"], TEXTS[:2]), atol=1e-4)


def test_prometheus_scrapes_the_servers_metrics_contract(kube: Kube, served: dict[str, Any]) -> None:
    for _ in range(5):
        infer(served["base"], TEXTS)
    prom = kube.cluster.prometheus_url

    def query(q: str) -> list[dict[str, Any]]:
        return httpx.get(f"{prom}/api/v1/query", params={"query": q}, timeout=10).json()["data"]["result"]

    ok = wait_for(
        lambda: [
            r
            for r in query(f'modelserver_requests_total{{namespace="{served["ns"]}",code="200"}}')
            if float(r["value"][1]) >= 5
        ],
        timeout=60,
        what="modelserver_requests_total scraped",
    )
    labels = ok[0]["metric"]
    assert labels["model"] == "minilm" and labels["version"] == "1"
    assert labels["modeldeploy_io_name"] == "minilm"  # pod labels carried over by discovery
    for metric in (
        "modelserver_request_duration_seconds_bucket",
        "modelserver_batch_size_bucket",
        "modelserver_queue_wait_seconds_bucket",
        "modelserver_padding_ratio_bucket",
        "modelserver_queue_depth",
    ):
        assert query(f'{metric}{{namespace="{served["ns"]}"}}'), metric
