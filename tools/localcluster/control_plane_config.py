"""The control plane's configuration: kubeconfigs, the command lines of etcd, kube-apiserver (with its
audit policy), kube-controller-manager and kube-scheduler, and the ``default/kubernetes`` EndpointSlice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .pki import KeyPair

# How often kube-controller-manager's HPA controller re-evaluates every HPA (its default: 15s).
HPA_SYNC_PERIOD = "5s"


def kubeconfig(server: str, ca: Path, client: KeyPair, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "localcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate": str(client.cert), "client-key": str(client.key)},
            }
        ],
        "contexts": [{"name": "localcluster", "context": {"cluster": "localcluster", "user": user}}],
        "current-context": "localcluster",
    }


def etcd_args(bin_dir: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    return [
        str(bin_dir / "etcd"),
        "--name=localcluster",
        f"--data-dir={data_dir}",
        f"--listen-client-urls=http://127.0.0.1:{client_port}",
        f"--advertise-client-urls=http://127.0.0.1:{client_port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=localcluster=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
    ]


def apiserver_args(
    bin_dir: Path,
    *,
    etcd_port: int,
    secure_port: int,
    ca: KeyPair,
    serving: KeyPair,
    sa: KeyPair,
    service_cidr: str,
    audit_log: Path | None = None,
    audit_policy: Path | None = None,
    kubelet_client: KeyPair | None = None,
) -> list[str]:
    """``kubelet_client``: the cluster has a real kubelet (``up --node containerd``), so the apiserver
    authorizes nodes (the Node authorizer: a kubelet reads and writes only its own node and its pods'
    objects) and reaches the kubelet's 10250 (logs, exec) with this client certificate, checking the
    kubelet's serving certificate against the cluster CA, at the node's InternalIP."""
    args = [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        # All addresses: host clients use 127.0.0.1, pods in the pod network use its host end.
        "--bind-address=0.0.0.0",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",  # the reconciler refuses loopback advertise addresses
        f"--secure-port={secure_port}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={ca.cert}",
        f"--service-account-key-file={sa.cert}",
        f"--service-account-signing-key-file={sa.key}",
        f"--service-account-issuer=https://127.0.0.1:{secure_port}",
        f"--service-cluster-ip-range={service_cidr}",
        "--authorization-mode=" + ("Node,RBAC" if kubelet_client else "RBAC"),
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--v=1",
    ]
    if kubelet_client:
        args += [
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            f"--kubelet-certificate-authority={ca.cert}",
            "--kubelet-preferred-address-types=InternalIP",
        ]
    if audit_log and audit_policy:
        args += [
            f"--audit-log-path={audit_log}",
            f"--audit-policy-file={audit_policy}",
            "--audit-log-format=json",
            "--audit-log-mode=batch",
            "--audit-log-batch-max-wait=1s",
        ]
    return args


WRITE_VERBS = ["create", "update", "patch", "delete", "deletecollection"]
READ_VERBS = ["get", "list", "watch"]


AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived", "ResponseStarted"],
    "rules": [
        # The controllers' own service accounts (kube-controller-manager runs each controller with one):
        # their reads are many and nobody checks them.
        {"level": "None", "userGroups": ["system:serviceaccounts:kube-system"], "verbs": READ_VERBS},
        # Every write: tests count them to prove that idle reconciles write nothing.
        {"level": "Metadata", "verbs": WRITE_VERBS},
        # Every request of every other service account, reads included, so that a refused get, list or
        # watch (403) of a pod's credentials -- the chart's operator -- is in the log like a refused write.
        {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
        {"level": "None"},
    ],
}


def controller_manager_args(
    bin_dir: Path, *, kubeconfig_path: Path, port: int, ca: KeyPair, sa: KeyPair
) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig_path}",
        f"--authentication-kubeconfig={kubeconfig_path}",
        f"--authorization-kubeconfig={kubeconfig_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--service-account-private-key-file={sa.key}",
        f"--root-ca-file={ca.cert}",
        f"--cluster-signing-cert-file={ca.cert}",
        f"--cluster-signing-key-file={ca.key}",
        "--use-service-account-credentials=true",
        "--controllers=*",
        "--leader-elect=false",
        "--concurrent-deployment-syncs=10",
        "--concurrent-replicaset-syncs=10",
        "--concurrent-gc-syncs=10",
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
        "--v=1",
    ]


def scheduler_args(bin_dir: Path, *, kubeconfig_path: Path, port: int) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        f"--kubeconfig={kubeconfig_path}",
        f"--authentication-kubeconfig={kubeconfig_path}",
        f"--authorization-kubeconfig={kubeconfig_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        "--v=1",
    ]


def kubernetes_endpointslice(*, host_ip: str, port: int) -> dict[str, Any]:
    """An EndpointSlice for ``default/kubernetes`` (the apiserver runs with ``--endpoint-reconciler-type=
    none``, which writes none): the apiserver at the pod network's host end, so pods reach it at the
    Service's ClusterIP like in a real cluster."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "localcluster",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
