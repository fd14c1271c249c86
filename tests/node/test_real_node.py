"""The real node: Ready with containerd, pods in containers of the imported images, GPUs from the device
plugin (and none without it)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from typing import Any

import pytest
from localcluster import realnode
from localcluster import realnode_config as rc
from localcluster.cluster import Cluster, ClusterError, up
from localcluster.testing import Kube, wait_for

from .support import py, run_pod, server_pod


def test_the_node_is_ready_with_containerd(kube: Kube, real_node: dict[str, Any]) -> None:
    info = real_node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"] == f"containerd://{rc.CONTAINERD_VERSION}"
    assert info["kubeletVersion"] == "v1.37.2"
    wide = kube.kubectl("get", "nodes", "-o", "wide").stdout
    line = next(ln for ln in wide.splitlines() if ln.startswith(rc.NODE_NAME))
    assert " Ready " in line and line.rstrip().endswith(f"containerd://{rc.CONTAINERD_VERSION}"), wide
    assert real_node["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    # kwok's nodes are still there for pods that tolerate them, and nothing else lands on them
    for name in ("gpu-node-0", "cpu-node-0"):
        kwok = kube.get(f"/api/v1/nodes/{name}")
        assert kwok is not None and rc.KWOK_TAINT in kwok["spec"]["taints"]


def test_a_pod_runs_in_a_container_of_the_imported_image(
    kube: Kube, namespace: str, python_image: str, crictl: list[str], cluster: Cluster
) -> None:
    pod, took = run_pod(kube, namespace, server_pod("srv", python_image))
    status = pod["status"]["containerStatuses"][0]
    assert pod["spec"]["nodeName"] == rc.NODE_NAME
    assert status["containerID"].startswith("containerd://")
    image = json.loads(
        subprocess.run(
            [*crictl, "inspecti", "-o", "json", python_image], capture_output=True, text=True, check=True
        ).stdout
    )
    assert status["imageID"] in (image["status"]["id"], *image["status"].get("repoDigests", []))
    net = ipaddress.ip_network(rc.node_pod_cidr(realnode_index(cluster)))
    assert ipaddress.ip_address(pod["status"]["podIP"]) in net
    # logs come from the kubelet (apiserver -> kubelet:10250 -> the CRI log file)
    logs = kube.kubectl("logs", "-n", namespace, "srv").stdout
    assert "NVIDIA_VISIBLE_DEVICES=" in logs
    print(f"pod Ready {took:.2f}s after create (image present)")


def realnode_index(cluster: Cluster) -> int:
    from localcluster.state import ClusterRecord

    rec = ClusterRecord.load(cluster.state_dir)
    assert rec is not None
    return rec.pod_network_index


def test_a_gpu_pod_gets_its_devices_from_the_device_plugin(
    kube: Kube, namespace: str, python_image: str
) -> None:
    run_pod(kube, namespace, server_pod("gpu", python_image, gpus=1))
    env = py(kube, namespace, "gpu", "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])").strip()
    assert env.startswith("fake-gpu-"), env
    assert "NVIDIA_VISIBLE_DEVICES=" + env in kube.kubectl("logs", "-n", namespace, "gpu").stdout


def _allocatable_gpus(kube: Kube) -> str:
    node = kube.get(f"/api/v1/nodes/{rc.NODE_NAME}") or {}
    return str(node.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))


def test_without_the_device_plugin_a_gpu_pod_stays_pending(
    kube: Kube, namespace: str, cluster: Cluster
) -> None:
    realnode.stop_device_plugin(cluster.state_dir)
    try:
        wait_for(lambda: _allocatable_gpus(kube) == "0", timeout=60, what="nvidia.com/gpu allocatable 0")
        pod = server_pod("nogpu", "docker.io/modeldeploy/pause:3.10", gpus=1)
        pod["spec"]["containers"][0].pop("command")
        kube.api.create(f"/api/v1/namespaces/{namespace}/pods", pod)

        def unschedulable() -> str:
            got = kube.get(f"/api/v1/namespaces/{namespace}/pods/nogpu") or {}
            cond = next(c for c in got["status"]["conditions"] if c["type"] == "PodScheduled")
            return cond["status"] == "False" and cond["reason"] == "Unschedulable" and cond["message"]

        message = wait_for(unschedulable, timeout=30, what="PodScheduled False")
        assert "Insufficient nvidia.com/gpu" in message, message
        got = kube.get(f"/api/v1/namespaces/{namespace}/pods/nogpu")
        assert got is not None and got["status"]["phase"] == "Pending" and not got["spec"].get("nodeName")
    finally:
        realnode.start_device_plugin(cluster.state_dir)
        wait_for(lambda: _allocatable_gpus(kube) == str(rc.GPU_DEVICES), timeout=60, what="GPUs back")


def test_a_second_real_node_is_refused_and_the_first_keeps_running(
    kube: Kube, namespace: str, python_image: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The kubelet's device-plugin directory is the machine's: a second ``up --node containerd`` stops
    before it changes the host, and its ``down`` leaves the running node's cgroups and sockets alone."""
    state = tmp_path_factory.mktemp("second")
    with pytest.raises(ClusterError, match="one real node per machine"):
        up(state, node="containerd")
    assert _allocatable_gpus(kube) == str(rc.GPU_DEVICES)
    run_pod(kube, namespace, server_pod("after", python_image, gpus=1))
