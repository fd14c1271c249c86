"""The local cluster's pure configuration builders."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import yaml
from localcluster import config, podnet
from localcluster.pki import KeyPair


def test_default_nodes_are_one_gpu_node_with_8_gpus_and_one_cpu_node() -> None:
    nodes = {n["metadata"]["name"]: n for n in config.default_nodes()}
    gpu, cpu = nodes[config.GPU_NODE], nodes[config.CPU_NODE]
    assert gpu["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert gpu["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert "nvidia.com/gpu" not in cpu["status"]["allocatable"]
    assert "nvidia.com/gpu.present" not in cpu["metadata"]["labels"]
    for n in nodes.values():
        assert n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_services_and_nodes_stay_on_loopback() -> None:
    assert ipaddress.ip_network(config.SERVICE_CIDR).is_loopback
    assert ipaddress.ip_address(config.NODE_IP).is_loopback


def test_pod_networks_are_distinct_routable_slash24s_and_skip_used_indices() -> None:
    a = podnet.choose(set())
    b = podnet.choose({a.index})
    assert a.index != b.index
    for net in (a, b):
        agent, kwok = ipaddress.ip_network(net.agent_cidr), ipaddress.ip_network(net.kwok_cidr)
        assert agent.prefixlen == 24 and kwok.prefixlen == 16 and not agent.overlaps(kwok)
        assert not agent.is_loopback and not agent.is_link_local  # EndpointSlices refuse those
        assert net.host_ip == str(agent[1]) and net.host_ip not in net.pod_ips()
        assert ipaddress.ip_address(net.anchor_ip) in agent and net.anchor_ip not in net.pod_ips()
        assert all(ipaddress.ip_address(ip) in agent for ip in net.pod_ips())
    assert not ipaddress.ip_network(a.agent_cidr).overlaps(ipaddress.ip_network(b.agent_cidr))
    assert a.netns != b.netns and a.host_if != b.host_if


def test_apiserver_serves_host_and_pod_network_with_rbac_and_service_account_keys(tmp_path: Path) -> None:
    pair = KeyPair(tmp_path / "c", tmp_path / "k")
    args = config.apiserver_args(tmp_path, etcd_port=1, secure_port=2, ca=pair, serving=pair, sa=pair)
    assert "--bind-address=0.0.0.0" in args  # reachable from the pod network's host end too
    assert "--authorization-mode=RBAC" in args
    assert any(a.startswith("--service-account-signing-key-file=") for a in args)
    assert f"--service-cluster-ip-range={config.SERVICE_CIDR}" in args


def test_prometheus_keeps_only_annotated_process_pods(tmp_path: Path) -> None:
    pair = KeyPair(tmp_path / "c", tmp_path / "k")
    cfg = config.prometheus_config(
        apiserver="https://127.0.0.1:1", ca=tmp_path / "ca", client=pair, pod_cidr="10.244.3.0/24"
    )
    job = cfg["scrape_configs"][0]
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    keeps = {
        tuple(r["source_labels"]): r["regex"] for r in job["relabel_configs"] if r.get("action") == "keep"
    }
    assert keeps[("__meta_kubernetes_pod_annotation_prometheus_io_scrape",)] == "true"
    ip_re = re.compile(keeps[("__meta_kubernetes_pod_ip",)])
    assert ip_re.fullmatch("10.244.3.17") and not ip_re.fullmatch("10.245.3.17")
    assert not ip_re.fullmatch("10.244.30.1")
    interval = cfg["global"]["scrape_interval"]
    assert interval.endswith("s") and float(interval[:-1]) <= 2


def _stage_dir(tmp_path: Path) -> Path:
    root = tmp_path / "stages"
    (root / "node" / "fast").mkdir(parents=True)
    (root / "node" / "heartbeat-with-lease").mkdir(parents=True)
    (root / "pod" / "general").mkdir(parents=True)
    (root / "node" / "fast" / "node-initialize.yaml").write_text(
        yaml.safe_dump(
            {"kind": "Stage", "metadata": {"name": "n"}, "spec": {"resourceRef": {"kind": "Node"}}}
        )
    )
    (root / "pod" / "general" / "pod-ready.yaml").write_text(
        yaml.safe_dump(
            {
                "kind": "Stage",
                "metadata": {"name": "p"},
                "spec": {"resourceRef": {"kind": "Pod"}, "selector": {"matchExpressions": [{"key": "x"}]}},
            }
        )
    )
    (root / "pod" / "general" / "kustomization.yaml").write_text("resources: []\n")
    return root


def test_kwok_pod_stages_exclude_agent_images_and_node_stages_are_untouched(tmp_path: Path) -> None:
    stages = {s["metadata"]["name"]: s for s in config.kwok_stages(_stage_dir(tmp_path))}
    assert set(stages) == {"n", "p"}
    pod_exprs = stages["p"]["spec"]["selector"]["matchExpressions"]
    assert pod_exprs[0] == {"key": "x"}
    assert pod_exprs[-1]["operator"] == "NotIn" and "modeldeploy/" in pod_exprs[-1]["key"]
    assert "selector" not in stages["n"]["spec"]
