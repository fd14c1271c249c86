"""kube-proxy's configuration: its mode, its KubeProxyConfiguration and its command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Where kube-proxy serves /healthz and /metrics: its pod network's anchor address (inside the namespace,
# so the ports are the namespace's own and never clash with another cluster's or a pod's, which bind
# their pod IP).
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS_PORT = 10249


def proxy_mode(*, have_nft: bool, have_iptables: bool) -> str:
    """kube-proxy's mode: nftables (GA since 1.33, kube-proxy's default from 1.40; one atomic ``nft -f``
    transaction per sync, no iptables-legacy/nft split), else iptables; neither is an error."""
    if have_nft:
        return "nftables"
    if have_iptables:
        return "iptables"
    raise ValueError(
        "kube-proxy needs the `nft` command (Debian package nftables; `make deps` installs it) or iptables"
    )


def kube_proxy_config(
    *,
    kubeconfig_path: Path,
    node_name: str,
    bind_ip: str,
    cluster_cidr: str,
    mode: str,
    masquerade_all: bool = False,
) -> dict[str, Any]:
    """kube-proxy's KubeProxyConfiguration. It runs inside the cluster's pod network namespace
    (``bind_ip`` is that namespace's anchor address): its rules live there, and nothing it does touches
    the host's conntrack limits, timeouts or OOM scores. ``masquerade_all``: the real node's pods share a
    bridge, and without br_netfilter a reply to a pod that reached another through a Service would be
    bridged past the conntrack that undoes the DNAT (:meth:`localcluster.realnode.RealNode.prepare_host`)."""
    cfg: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": node_name,
        "mode": mode,
        "bindAddress": bind_ip,  # also its primary node IP: NodePorts answer on the anchor address
        "healthzBindAddress": f"{bind_ip}:{KUBE_PROXY_HEALTHZ_PORT}",
        "metricsBindAddress": f"{bind_ip}:{KUBE_PROXY_METRICS_PORT}",
        # Sources outside clusterCIDR are masqueraded. The host's packets come from the veth's host end
        # (10.244.N.1), inside it, and need none: the replies pass the namespace's conntrack on their
        # way back. Hairpin traffic (an endpoint reaching itself through its Service) always is.
        "clusterCIDR": cluster_cidr,
        "detectLocalMode": "ClusterCIDR",
        # 0: leave the kernel's conntrack table size and TCP timeouts as they are (no sysctl writes).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "oomScoreAdj": 0,
        "logging": {"verbosity": 1},
    }
    if masquerade_all:
        cfg["masqueradeAll"] = True
    return cfg


def kube_proxy_args(bin_dir: Path, *, config_path: Path) -> list[str]:
    return [str(bin_dir / "kube-proxy"), f"--config={config_path}"]
