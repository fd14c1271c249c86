"""The cluster's DNS: CoreDNS (built by tools/build-binaries.sh from tools/coredns) with its kubernetes
plugin, inside the pod network, answering ``<service>.<namespace>.svc.cluster.local`` from the apiserver.

It listens on the namespace's anchor address (port 53, UDP and TCP), and the namespace's resolv.conf
(:meth:`localcluster.podnet.PodNetwork.create`) names it, so every process in the pod network -- pods,
kube-proxy, Traefik -- resolves Service names as on a node. A real kubelet writes each pod a resolv.conf
with ``<its namespace>.svc.cluster.local`` first in ``search``; here one file serves the whole network, so
its search list has ``svc.cluster.local`` and ``cluster.local`` only: a short name needs its namespace
(``name.namespace``) and fully qualified names work as everywhere. Only ``cluster.local`` is served:
every other name is refused at once (nothing leaves this machine).

CoreDNS reads the apiserver as the user ``localcluster-coredns``, bound to the rules of the
``system:coredns`` ClusterRole that kubeadm installs (:data:`RULES`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
USER = "localcluster-coredns"
DNS_PORT = 53
READY_PORT = 8182  # the ready plugin's /ready (CoreDNS's default 8181 is KEDA's probe port here)

#: kubeadm's ``system:coredns`` ClusterRole (cmd/kubeadm/app/phases/addons/dns/manifests.go)
RULES: list[dict[str, Any]] = [
    {
        "apiGroups": [""],
        "resources": ["endpoints", "services", "pods", "namespaces"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
]


def rbac_objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): the ClusterRole and its binding to :data:`USER`."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    role = "localcluster:coredns"
    return [
        (f"{rbac}/clusterroles", {"metadata": {"name": role}, "rules": RULES}),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
            },
        ),
    ]


def corefile(*, listen_ip: str, kubeconfig: Path) -> str:
    """One server block, ``cluster.local`` only, no cache (a Service is found the moment it exists)."""
    return (
        f"{CLUSTER_DOMAIN}:{DNS_PORT} {{\n"
        f"    bind {listen_ip}\n"
        "    errors\n"
        f"    ready {listen_ip}:{READY_PORT}\n"
        f"    kubernetes {CLUSTER_DOMAIN} {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods disabled\n"
        "    }\n"
        "}\n"
    )


def args(bin_dir: Path, *, corefile_path: Path) -> list[str]:
    return [str(bin_dir / "coredns"), "-conf", str(corefile_path)]


def resolv_conf(nameserver: str) -> str:
    """The pod network's /etc/resolv.conf (``ip netns exec`` bind-mounts it): quick to give up, since
    every name this server cannot answer is refused, never slow."""
    return (
        f"nameserver {nameserver}\n"
        f"search svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\n"
        "options ndots:1 timeout:1 attempts:2\n"
    )


def ready_url(listen_ip: str) -> str:
    return f"http://{listen_ip}:{READY_PORT}/ready"
