"""The local cluster's pure configuration builders."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
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


def test_nodes_stay_on_loopback() -> None:
    assert ipaddress.ip_address(config.NODE_IP).is_loopback


def test_every_pod_network_has_a_service_range_of_its_own_that_clashes_with_nothing() -> None:
    nets = [podnet.PodNetwork(i) for i in range(1, podnet.MAX_INDEX + 1)]
    services = [ipaddress.ip_network(n.service_cidr) for n in nets]
    others = [ipaddress.ip_network(c) for n in nets for c in (n.agent_cidr, n.kwok_cidr)]
    for net, svc in zip(nets, services, strict=True):
        assert svc.prefixlen == 24 and svc.is_private and not svc.is_loopback and not svc.is_link_local
        assert str(svc) == f"10.96.{net.index}.0/24"
        assert net.kubernetes_service_ip == str(svc[1])  # what the apiserver gives `kubernetes`
        assert all(ipaddress.ip_address(ip) not in svc for ip in (net.anchor_ip, net.host_ip))
    assert len(set(services)) == len(services)  # no two clusters share ClusterIPs
    assert not any(s.overlaps(o) for s in services for o in others)  # nor with any pod range


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
    args = config.apiserver_args(
        tmp_path, etcd_port=1, secure_port=2, ca=pair, serving=pair, sa=pair, service_cidr="10.96.7.0/24"
    )
    assert "--bind-address=0.0.0.0" in args  # reachable from the pod network's host end too
    assert "--authorization-mode=RBAC" in args
    assert any(a.startswith("--service-account-signing-key-file=") for a in args)
    assert "--service-cluster-ip-range=10.96.7.0/24" in args


def test_kube_proxy_prefers_nftables_then_iptables_and_needs_one() -> None:
    assert config.proxy_mode(have_nft=True, have_iptables=True) == "nftables"
    assert config.proxy_mode(have_nft=True, have_iptables=False) == "nftables"
    assert config.proxy_mode(have_nft=False, have_iptables=True) == "iptables"
    with pytest.raises(ValueError, match="nftables"):
        config.proxy_mode(have_nft=False, have_iptables=False)


def test_kube_proxy_binds_its_namespace_anchor_and_leaves_host_settings_alone(tmp_path: Path) -> None:
    net = podnet.PodNetwork(5)
    cfg = config.kube_proxy_config(
        kubeconfig_path=tmp_path / "kp.kubeconfig",
        node_name=config.GPU_NODE,
        bind_ip=net.anchor_ip,
        cluster_cidr=net.agent_cidr,
        mode="nftables",
    )
    assert cfg["kind"] == "KubeProxyConfiguration" and cfg["mode"] == "nftables"
    assert cfg["clientConnection"]["kubeconfig"] == str(tmp_path / "kp.kubeconfig")
    assert cfg["hostnameOverride"] == config.GPU_NODE  # an existing Node: kube-proxy waits for it
    # Its ports are on the anchor address, never 0.0.0.0, where they would take ports from pods.
    for key in ("bindAddress", "healthzBindAddress", "metricsBindAddress"):
        assert cfg[key].split(":")[0] == "10.244.5.254"
    assert cfg["clusterCIDR"] == "10.244.5.0/24" and cfg["detectLocalMode"] == "ClusterCIDR"
    conntrack = cfg["conntrack"]
    assert conntrack["maxPerCore"] == 0 and conntrack["tcpEstablishedTimeout"] == "0s"
    assert cfg["oomScoreAdj"] == 0
    args = config.kube_proxy_args(tmp_path, config_path=tmp_path / "kp.yaml")
    assert args == [str(tmp_path / "kube-proxy"), f"--config={tmp_path / 'kp.yaml'}"]


def test_the_kubernetes_service_gets_the_apiserver_at_the_pod_networks_host_end() -> None:
    s = config.kubernetes_endpointslice(host_ip="10.244.3.1", port=6443)
    assert s["metadata"]["namespace"] == "default"
    assert s["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"
    assert s["endpoints"] == [{"addresses": ["10.244.3.1"], "conditions": {"ready": True}}]
    assert s["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]  # the Service's port name


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
