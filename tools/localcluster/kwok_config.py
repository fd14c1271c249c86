"""The nodes' configuration: kwok's fake GPU and CPU nodes, its command line and its stages (with the pods
the process node agent runs left out of them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

# Pod IPs and Service ClusterIPs live in the cluster's own network namespace (see podnet: pods on
# 10.244.N.0/24, ClusterIPs on 10.96.N.0/24, translated there by kube-proxy), since EndpointSlices refuse
# loopback pod IPs and several clusters on one machine must not share ranges or netfilter tables.
NODE_IP = "127.0.0.1"

GPU_NODE = "gpu-node-0"
#: the annotation kwok manages nodes by (``=fake``): without it a node gets no heartbeat
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
CPU_NODE = "cpu-node-0"
GPU_RESOURCE = "nvidia.com/gpu"

# Pods whose containers all use one of these image repositories are run by the process node agent,
# never by kwok's simulated stages.
AGENT_IMAGE_PATTERN = r"^(docker\.io/)?modeldeploy/"


def kwok_args(
    bin_dir: Path, *, kubeconfig_path: Path, config_files: list[Path], server_port: int, pod_cidr: str
) -> list[str]:
    args = [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig_path}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--cidr={pod_cidr}",
        f"--node-ip={NODE_IP}",
        f"--server-address=127.0.0.1:{server_port}",
        "--node-lease-duration-seconds=40",
    ]
    args += [f"--config={p}" for p in config_files]
    return args


def node_manifest(name: str, *, gpus: int, cpu: str = "32", memory: str = "256Gi") -> dict[str, Any]:
    """A kwok-managed fake node. GPU nodes carry NVIDIA's device-plugin label and resource."""
    capacity: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": "2000"}
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
    }
    if gpus:
        capacity[GPU_RESOURCE] = str(gpus)
        labels["nvidia.com/gpu.present"] = "true"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def default_nodes() -> list[dict[str, Any]]:
    return [node_manifest(GPU_NODE, gpus=8), node_manifest(CPU_NODE, gpus=0)]


def _not_agent_pod() -> dict[str, Any]:
    return {
        "key": f"[.spec.containers.[].image | test({json.dumps(AGENT_IMAGE_PATTERN)})] | any",
        "operator": "NotIn",
        "values": ["true"],
    }


def kwok_stages(stage_root: Path) -> list[dict[str, Any]]:
    """kwok's own node and pod stages, with pods of agent-run images excluded from the pod stages."""
    files = sorted((stage_root / "node" / "fast").glob("*.yaml"))
    files += sorted((stage_root / "node" / "heartbeat-with-lease").glob("*.yaml"))
    files += sorted((stage_root / "pod" / "general").glob("*.yaml"))
    stages: list[dict[str, Any]] = []
    for f in files:
        if f.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") != "Stage":
                continue
            doc = copy.deepcopy(doc)
            if doc["spec"]["resourceRef"]["kind"] == "Pod":
                sel = doc["spec"].setdefault("selector", {})
                sel.setdefault("matchExpressions", []).append(_not_agent_pod())
            stages.append(doc)
    return stages
