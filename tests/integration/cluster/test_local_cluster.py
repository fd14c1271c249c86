"""The local cluster is a real Kubernetes control plane: real scheduling on GPU capacity, real
controllers, process-run pods with real readiness, EndpointSlices and Prometheus discovery."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from localcluster import cluster as lc
from localcluster import podnet
from localcluster.config import CPU_NODE, GPU_NODE
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"


def deployment(
    name: str, *, gpus: int = 0, image: str = "registry.example/sim:1", replicas: int = 1
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    }


def make_testapp_pod(
    name: str, *, args: list[str] = (), gates: list[str] = (), port: int = 8080
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": name},
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(port)},
        },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "readinessGates": [{"conditionType": g} for g in gates],
            "containers": [
                {
                    "name": "app",
                    "image": TESTAPP,
                    "args": ["--port", str(port), *args],
                    "ports": [{"name": "http", "containerPort": port}],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": "http"},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                }
            ],
        },
    }


def service(name: str, port: int = 8080) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port, "targetPort": port}]},
    }


def _net_index(kube: Kube) -> int:
    rec = lc.ClusterRecord.load(kube.cluster.state_dir)
    assert rec is not None
    return rec.pod_network_index


def pod_condition(pod: dict[str, Any], ctype: str) -> str | None:
    return next(
        (c["status"] for c in pod.get("status", {}).get("conditions") or [] if c["type"] == ctype), None
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def container_pid(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))


# --- scheduling and controllers ------------------------------------------------------------------


def test_gpu_deployment_is_scheduled_on_the_gpu_node_through_a_replicaset(kube: Kube, namespace: str) -> None:
    kube.apply(deployment("one-gpu", gpus=1, replicas=2), namespace)
    pods = wait_for(
        lambda: (
            [p for p in kube.pods(namespace, "app=one-gpu") if p["spec"].get("nodeName")]
            if len([p for p in kube.pods(namespace, "app=one-gpu") if p["spec"].get("nodeName")]) == 2
            else None
        ),
        timeout=60,
        what="2 scheduled pods",
    )
    assert {p["spec"]["nodeName"] for p in pods} == {GPU_NODE}
    owners = {p["metadata"]["ownerReferences"][0]["kind"] for p in pods}
    assert owners == {"ReplicaSet"}
    rs_name = pods[0]["metadata"]["ownerReferences"][0]["name"]
    rs = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets/{rs_name}")
    assert rs is not None and rs["metadata"]["ownerReferences"][0]["name"] == "one-gpu"
    # kwok simulates pods of foreign images: they become Running with a loopback pod IP.
    wait_for(  # raises on timeout
        lambda: all(p["status"].get("phase") == "Running" for p in kube.pods(namespace, "app=one-gpu")),
        what="simulated pods running",
    )
    kwok_net = ipaddress.ip_network(podnet.PodNetwork(_net_index(kube)).kwok_cidr)
    for p in kube.pods(namespace, "app=one-gpu"):
        assert ipaddress.ip_address(p["status"]["podIP"]) in kwok_net


def test_cpu_deployment_may_land_anywhere_but_nine_gpus_never_fit(kube: Kube, namespace: str) -> None:
    kube.apply(deployment("nine-gpus", gpus=9), namespace)

    def unschedulable() -> dict[str, Any] | None:
        pods = kube.pods(namespace, "app=nine-gpus")
        for p in pods:
            for c in p.get("status", {}).get("conditions") or []:
                if (
                    c["type"] == "PodScheduled"
                    and c["status"] == "False"
                    and c.get("reason") == "Unschedulable"
                ):
                    return p
        return None

    pod = wait_for(unschedulable, timeout=60, what="Unschedulable condition")
    assert pod["status"]["phase"] == "Pending"
    assert not pod["spec"].get("nodeName")
    msg = next(c["message"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "nvidia.com/gpu" in msg


def test_deleting_a_deployment_garbage_collects_its_pods(kube: Kube, namespace: str) -> None:
    kube.apply(deployment("gc-me", replicas=3), namespace)
    wait_for(lambda: len(kube.pods(namespace, "app=gc-me")) == 3, what="3 pods")
    nodes = {p["spec"].get("nodeName") for p in kube.pods(namespace, "app=gc-me")}
    assert nodes <= {GPU_NODE, CPU_NODE}
    kube.kubectl("delete", "deployment", "gc-me", "-n", namespace, "--wait=false")
    wait_for(lambda: not kube.pods(namespace, "app=gc-me"), timeout=60, what="pods garbage-collected")
    rs = kube.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets") or {}
    assert not rs.get("items")


# --- process-run pods ----------------------------------------------------------------------------


def test_mapped_image_pod_is_a_real_process_with_probe_driven_endpoints(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    unready = tmp_path / "unready"
    unready.touch()
    gate = "modeldeploy.io/in-traffic"
    kube.apply(service("web"), namespace)
    kube.apply(make_testapp_pod("web", args=["--unready-file", str(unready)], gates=[gate]), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/web"
    pod = wait_for(
        lambda: (
            (p := kube.get(path)) and p["status"].get("phase") == "Running" and p["status"].get("podIP") and p
        ),
        what="pod running",
    )
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(podnet.PodNetwork(_net_index(kube)).agent_cidr)
    pid = container_pid(pod)
    assert pid_alive(pid)
    # The process answers on its pod IP ...
    body = wait_for(lambda: httpx.get(f"http://{ip}:8080/", timeout=2).json(), what="HTTP answer")
    assert body["pid"] == pid and body["pod"] == "web"
    # ... but its readiness probe fails, so it is not a ready endpoint.
    time.sleep(3)
    assert pod_condition(kube.get(path) or {}, "ContainersReady") == "False"
    assert ip not in kube.endpoint_ips(namespace, "web")
    # Probe passes; the readiness gate is still missing: still not in the slice.
    unready.unlink()
    wait_for(
        lambda: pod_condition(kube.get(path) or {}, "ContainersReady") == "True", what="containers ready"
    )
    time.sleep(2)
    assert pod_condition(kube.get(path) or {}, "Ready") == "False"
    assert ip not in kube.endpoint_ips(namespace, "web")
    # Gate True -> Ready -> listed.
    patch = '{"status":{"conditions":[{"type":"%s","status":"%s"}]}}'
    kube.kubectl("patch", "pod", "web", "-n", namespace, "--subresource=status", "-p", patch % (gate, "True"))
    wait_for(lambda: ip in kube.endpoint_ips(namespace, "web"), what="endpoint listed")
    # Gate False -> removed from the slice, the same process keeps running.
    kube.kubectl(
        "patch", "pod", "web", "-n", namespace, "--subresource=status", "-p", patch % (gate, "False")
    )
    wait_for(lambda: ip not in kube.endpoint_ips(namespace, "web"), what="endpoint removed")
    pod = kube.get(path) or {}
    assert container_pid(pod) == pid and pid_alive(pid)
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert httpx.get(f"http://{ip}:8080/", timeout=2).json()["pid"] == pid
    # Deleting the pod stops the process and removes the object.
    kube.kubectl("delete", "pod", "web", "-n", namespace, "--wait=false")
    wait_for(lambda: not pid_alive(pid), timeout=30, what="process stopped")
    wait_for(lambda: kube.get(path) is None, timeout=30, what="pod object removed")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://{ip}:8080/", timeout=1)
    # It was asked to stop (SIGTERM, handled by the app), not killed.
    uid = pod["metadata"]["uid"]
    logs = list((kube.cluster.state_dir / "agent" / "pods").glob(f"{namespace}_web_{uid[:8]}/app.log"))
    assert logs and "testapp stopped" in logs[0].read_text()


def test_crashed_container_is_restarted_and_counted(kube: Kube, namespace: str) -> None:
    kube.apply(make_testapp_pod("crashy", args=["--exit-after", "1.5"]), namespace)
    path = f"/api/v1/namespaces/{namespace}/pods/crashy"
    pod = wait_for(
        lambda: (
            (p := kube.get(path))
            and (p["status"].get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1
            and p
        ),
        timeout=60,
        what="a restart",
    )
    st = pod["status"]["containerStatuses"][0]
    assert st["lastState"]["terminated"]["exitCode"] == 3


def test_prometheus_discovers_and_scrapes_a_process_pod(kube: Kube, namespace: str) -> None:
    kube.apply(make_testapp_pod("scraped"), namespace)
    prom = kube.cluster.prometheus_url

    def sample() -> list[Any]:
        r = httpx.get(
            f"{prom}/api/v1/query",
            params={"query": f'testapp_requests_total{{namespace="{namespace}",pod="scraped"}}'},
        )
        return r.json()["data"]["result"]

    try:
        result = wait_for(sample, timeout=60, what="a Prometheus sample for the pod")
    except AssertionError:
        targets = httpx.get(f"{prom}/api/v1/targets").json()["data"]["activeTargets"]
        seen = [(t["labels"].get("pod"), t["health"], t["lastError"]) for t in targets]
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/scraped")
        raise AssertionError(f"targets: {seen}; pod status: {(pod or {}).get('status')}") from None
    assert result[0]["metric"]["app"] == "scraped"


# --- lifecycle -----------------------------------------------------------------------------------


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_up_and_down_twice_leave_no_process_and_no_port(tmp_path: Path) -> None:
    if os.environ.get("E2E_KUBECONFIG"):
        pytest.skip("lifecycle of the local cluster only")  # not counted as the local-cluster proof
    for round_ in range(2):
        state = tmp_path / f"c{round_}"
        c = lc.up(state)
        rec = lc.ClusterRecord.load(state)
        assert rec is not None
        pids = [p.pid for p in rec.processes]
        ports = list(rec.ports.values())
        assert c.kubeconfig.exists() and (state / "prometheus-url").read_text().strip() == c.prometheus_url
        net = podnet.PodNetwork(rec.pod_network_index)
        assert net.netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        lc.down(state)
        assert not state.exists()
        assert net.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert not net.etc_dir.exists()
        assert [p for p in pids if pid_alive(p)] == []
        assert [p for p in ports if not _port_free(p)] == []


def test_gateway_api_crds_are_installed_and_validate_httproute_weights(kube: Kube, namespace: str) -> None:
    def route(weight: int) -> dict[str, Any]:
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "split", "namespace": namespace},
            "spec": {
                "parentRefs": [{"name": "gw"}],
                "rules": [{"backendRefs": [{"name": "a", "port": 8080, "weight": weight}]}],
            },
        }

    kube.apply(route(95), namespace)
    stored = kube.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/httproutes/split") or {}
    assert stored["spec"]["rules"][0]["backendRefs"][0]["weight"] == 95
    res = kube.kubectl("apply", "-f", "-", input=json.dumps(route(-1)), check=False)
    assert res.returncode != 0 and "weight" in res.stderr


def test_the_audit_log_records_a_refused_read_of_a_service_account(kube: Kube, namespace: str) -> None:
    """The chart-RBAC checks read the audit log for 403s of the operator's ServiceAccount: a refused
    get, list or watch must be there like a refused write (config.AUDIT_POLICY)."""
    from localcluster.audit import completed

    kube.api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "nobody"}})
    token = kube.kubectl("create", "token", "nobody", "-n", namespace).stdout.strip()
    ca = Path(kube.cluster.state_dir) / "pki" / "ca.crt"
    user = f"system:serviceaccount:{namespace}:nobody"
    with httpx.Client(
        base_url=kube.cluster.apiserver_url, verify=str(ca), headers={"Authorization": f"Bearer {token}"}
    ) as c:
        assert c.get("/api/v1/namespaces/kube-system/secrets").status_code == 403  # list
        assert c.get("/api/v1/namespaces/kube-system/configmaps/nope").status_code == 403  # get
        assert c.get("/api/v1/pods", params={"watch": "1", "timeoutSeconds": "1"}).status_code == 403
    log = Path(kube.cluster.state_dir) / "logs" / "audit.log"

    def refused() -> set[str] | None:
        verbs = {
            ev["verb"]
            for ev in completed(log)
            if (ev.get("user") or {}).get("username") == user
            and (ev.get("responseStatus") or {}).get("code") == 403
        }
        return verbs if {"list", "get", "watch"} <= verbs else None

    assert wait_for(refused, timeout=15, what="the three refused reads in the audit log (batched every 1 s)")
