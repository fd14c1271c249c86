"""Pure builders for the local cluster's configuration: command lines, kubeconfigs, nodes, kwok stages
and the Prometheus configuration. Nothing here starts a process or touches the network."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml

from .pki import KeyPair

# Pod IPs and Service ClusterIPs live in the cluster's own network namespace (see podnet: pods on
# 10.244.N.0/24, ClusterIPs on 10.96.N.0/24, translated there by kube-proxy), since EndpointSlices refuse
# loopback pod IPs and several clusters on one machine must not share ranges or netfilter tables.
NODE_IP = "127.0.0.1"
# Where kube-proxy serves /healthz and /metrics: its pod network's anchor address (inside the namespace,
# so the ports are the namespace's own and never clash with another cluster's or a pod's, which bind
# their pod IP).
KUBE_PROXY_HEALTHZ_PORT = 10256
KUBE_PROXY_METRICS_PORT = 10249

# The Gateway API data plane: Traefik (its Kubernetes Gateway provider) inside the pod network namespace,
# listening on the namespace's anchor address. One shared Gateway, in a namespace of its own, accepts
# HTTPRoutes from every namespace; routes tell themselves apart by their hostnames.
GATEWAY_CONTROLLER = "traefik.io/gateway-controller"
GATEWAY_CLASS = "traefik"
GATEWAY_NAMESPACE = "gateway-system"
GATEWAY_NAME = "public-gateway"
GATEWAY_PORT = 80  # Traefik's entry point `web` and the Gateway's listener (Traefik pairs them by port)
TRAEFIK_PING_PORT = 8080  # Traefik's own entry point `traefik`: /ping
TRAEFIK_THROTTLE = "500ms"  # providersThrottleDuration (Traefik's default: 2s)

GPU_NODE = "gpu-node-0"
CPU_NODE = "cpu-node-0"
GPU_RESOURCE = "nvidia.com/gpu"

# Pods whose containers all use one of these image repositories are run by the process node agent,
# never by kwok's simulated stages.
AGENT_IMAGE_PATTERN = r"^(docker\.io/)?modeldeploy/"


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
) -> list[str]:
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
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--v=1",
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
#: the Gateway API kinds Traefik's Gateway provider reads (and whose status it updates)
GATEWAY_API_RESOURCES = (
    "gatewayclasses",
    "gateways",
    "httproutes",
    "grpcroutes",
    "tcproutes",
    "tlsroutes",
    "referencegrants",
    "backendtlspolicies",
)

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
    *, kubeconfig_path: Path, node_name: str, bind_ip: str, cluster_cidr: str, mode: str
) -> dict[str, Any]:
    """kube-proxy's KubeProxyConfiguration. It runs inside the cluster's pod network namespace
    (``bind_ip`` is that namespace's anchor address): its rules live there, and nothing it does touches
    the host's conntrack limits, timeouts or OOM scores."""
    return {
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


def kube_proxy_args(bin_dir: Path, *, config_path: Path) -> list[str]:
    return [str(bin_dir / "kube-proxy"), f"--config={config_path}"]


def traefik_args(bin_dir: Path, *, listen_ip: str) -> list[str]:
    """Traefik with only its Kubernetes Gateway provider. It reads the apiserver with the kubeconfig in
    ``$KUBECONFIG`` (set by the caller), listens on ``listen_ip`` (the pod network's anchor address, in
    the namespace: reachable from the host and from pods, never a host port) and writes that address into
    the Gateway's status."""
    return [
        str(bin_dir / "traefik"),
        f"--entryPoints.web.address={listen_ip}:{GATEWAY_PORT}",
        f"--entryPoints.traefik.address={listen_ip}:{TRAEFIK_PING_PORT}",
        "--ping=true",
        "--ping.entryPoint=traefik",
        "--providers.kubernetesGateway=true",
        # at most one configuration reload per 0.5 s (Traefik's default waits 2 s after a reload before
        # taking the next change): a route's new weights reach the data plane within a second
        f"--providers.providersThrottleDuration={TRAEFIK_THROTTLE}",
        f"--providers.kubernetesGateway.statusAddress.ip={listen_ip}",
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
        "--log.noColor=true",
    ]


# What Traefik's Kubernetes Gateway provider reads and writes: its documented ClusterRole
# (docs/content/reference/dynamic-configuration/kubernetes-gateway-rbac.yml in the v3.6.12 module) less
# `get pods`, which only OpenTelemetry needs.
TRAEFIK_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["services", "secrets", "configmaps"], "verbs": READ_VERBS},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": list(GATEWAY_API_RESOURCES),
        "verbs": READ_VERBS,
    },
    {
        "apiGroups": ["gateway.networking.k8s.io"],
        "resources": [f"{r}/status" for r in GATEWAY_API_RESOURCES],
        "verbs": ["update"],
    },
]


def gateway_objects() -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): the GatewayClass served by Traefik, the Gateway's namespace and the
    shared Gateway, one HTTP listener accepting routes from every namespace."""
    gw = "/apis/gateway.networking.k8s.io/v1"
    return [
        (
            f"{gw}/gatewayclasses",
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GatewayClass",
                "metadata": {"name": GATEWAY_CLASS},
                "spec": {"controllerName": GATEWAY_CONTROLLER},
            },
        ),
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": GATEWAY_NAMESPACE}},
        ),
        (
            f"{gw}/namespaces/{GATEWAY_NAMESPACE}/gateways",
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "Gateway",
                "metadata": {"name": GATEWAY_NAME, "namespace": GATEWAY_NAMESPACE},
                "spec": {
                    "gatewayClassName": GATEWAY_CLASS,
                    "listeners": [
                        {
                            "name": "web",
                            "protocol": "HTTP",
                            "port": GATEWAY_PORT,
                            "allowedRoutes": {"namespaces": {"from": "All"}},
                        }
                    ],
                },
            },
        ),
    ]


def gateway_programmed(gateway: dict[str, Any] | None) -> bool:
    """The Gateway's controller accepted it and programmed its listener (status conditions)."""
    conditions = ((gateway or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Programmed" and c.get("status") == "True" for c in conditions)


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


def kwok_args(
    bin_dir: Path, *, kubeconfig_path: Path, config_files: list[Path], server_port: int, pod_cidr: str
) -> list[str]:
    args = [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig_path}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={pod_cidr}",
        f"--node-ip={NODE_IP}",
        f"--server-address=127.0.0.1:{server_port}",
        "--node-lease-duration-seconds=40",
    ]
    args += [f"--config={p}" for p in config_files]
    return args


def prometheus_args(bin_dir: Path, *, config: Path, data_dir: Path, port: int) -> list[str]:
    return [
        str(bin_dir / "prometheus"),
        f"--config.file={config}",
        f"--storage.tsdb.path={data_dir}",
        f"--web.listen-address=0.0.0.0:{port}",  # host clients and pods (via the pod network's host end)
        "--storage.tsdb.retention.time=2h",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def prometheus_config(
    *, apiserver: str, ca: Path, client: KeyPair, pod_cidr: str, scrape_interval: str = "1s"
) -> dict[str, Any]:
    """Scrape pods that carry the usual ``prometheus.io/*`` annotations, discovered from the apiserver.

    Only pods with an IP in ``pod_cidr`` (the process-run pods' /24) are kept: simulated pods have no
    process behind them and are never scraped.
    """
    net = ipaddress.ip_network(pod_cidr)
    if net.prefixlen != 24:
        raise ValueError(f"pod_cidr must be a /24, got {pod_cidr}")
    ip_regex = re.escape(str(net.network_address).rsplit(".", 1)[0] + ".") + r"\d+"
    k8s_tls = {"ca_file": str(ca), "cert_file": str(client.cert), "key_file": str(client.key)}
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "kubernetes-pods",
                "scrape_timeout": scrape_interval,
                "kubernetes_sd_configs": [{"role": "pod", "api_server": apiserver, "tls_config": k8s_tls}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                        "action": "keep",
                        "regex": "true",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_ip"],
                        "action": "keep",
                        "regex": ip_regex,
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_phase"],
                        "action": "keep",
                        "regex": "Running",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                        "action": "replace",
                        "target_label": "__metrics_path__",
                        "regex": "(.+)",
                    },
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_ip",
                            "__meta_kubernetes_pod_annotation_prometheus_io_port",
                        ],
                        "action": "replace",
                        "regex": r"(.+);(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }


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
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
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
