"""Pure builders for the local cluster's configuration: command lines, kubeconfigs, nodes, kwok stages
and the Prometheus configuration. Nothing here starts a process or touches the network."""

from __future__ import annotations

import base64
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

# The cluster's S3-compatible object store: versitygw (POSIX backend) inside the pod network namespace on
# the anchor address, like Traefik: the host and pods reach the same URL, and no host port is taken.
S3_PORT = 9000
S3_REGION = "us-east-1"
S3_HEALTH_PATH = "/health"

GPU_NODE = "gpu-node-0"
#: the annotation kwok manages nodes by (``=fake``): without it a node gets no heartbeat
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
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


def versitygw_args(bin_dir: Path, *, listen_ip: str, data_dir: Path, access_log: Path) -> list[str]:
    """versitygw serving ``data_dir`` (each top-level directory a bucket, each file below an object) on
    ``listen_ip:S3_PORT``, with an S3 server access log (one line per request) in ``access_log``. The
    root credentials come from the environment (``ROOT_ACCESS_KEY_ID``/``ROOT_SECRET_ACCESS_KEY``), so
    they appear in no command line, log or ``cluster.json``. ``--quiet``: no per-request lines on
    stdout (the access log has them)."""
    return [
        str(bin_dir / "versitygw"),
        f"--port={listen_ip}:{S3_PORT}",
        f"--region={S3_REGION}",
        f"--health={S3_HEALTH_PATH}",
        f"--access-log={access_log}",
        "--quiet",
        "posix",
        str(data_dir),
    ]


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
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
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


# ----- The aggregation layer and KEDA ----------------------------------------------------------------
# kube-apiserver proxies registered API groups (APIService objects) to extension servers, signing each
# proxied request with the front-proxy client certificate (its own CA, kept apart from the cluster's) and
# naming the user in request headers, which the extension server trusts because the apiserver publishes
# that CA and the headers' names in kube-system/extension-apiserver-authentication.
FRONT_PROXY_CLIENT = "front-proxy-client"  # the client certificate's CN, the one allowed name

# KEDA: keda-operator (ScaledObjects -> HPAs; it runs the scalers and serves their values over gRPC) and
# keda-adapter (its metrics server, external.metrics.k8s.io, which asks the operator). Both run inside the
# pod network namespace, like Traefik, listening on its anchor address (reachable from the host, where
# the apiserver is, and from pods); they reach the apiserver at the host end, and Prometheus there too.
KEDA_NAMESPACE = "keda"
KEDA_SERVICE_ACCOUNT = "keda-operator"  # the subject of KEDA's own RBAC (config/rbac, config/metrics-server)
KEDA_USER = f"system:serviceaccount:{KEDA_NAMESPACE}:{KEDA_SERVICE_ACCOUNT}"
KEDA_METRICS_SERVICE = "keda-metrics-apiserver"
KEDA_APISERVICE = "v1beta1.external.metrics.k8s.io"
KEDA_GRPC_PORT = 9666  # keda-operator's metrics service (gRPC, mutual TLS), KEDA's default
KEDA_OPERATOR_METRICS_PORT = 8180  # KEDA's default 8080 is Traefik's /ping port in the namespace
KEDA_OPERATOR_PROBE_PORT = 8181
KEDA_ADAPTER_PORT = 6443  # the external metrics API (HTTPS), KEDA's default
# The adapter's own /metrics: KEDA binds it on every address of the namespace (no flag for the address),
# so a pod must not listen on this port.
KEDA_ADAPTER_METRICS_PORT = 9022
# How often kube-controller-manager's HPA controller re-evaluates every HPA (its default: 15s).
HPA_SYNC_PERIOD = "5s"


def aggregation_layer_args(*, front_proxy_ca: Path, proxy_client: KeyPair) -> list[str]:
    """kube-apiserver flags for the aggregation layer. ``--enable-aggregator-routing``: the apiserver
    dials an APIService's endpoint (from the Service's EndpointSlices) rather than its ClusterIP, which
    only kube-proxy inside the pod network namespace translates."""
    return [
        f"--requestheader-client-ca-file={front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-username-headers=X-Remote-User",
        f"--proxy-client-cert-file={proxy_client.cert}",
        f"--proxy-client-key-file={proxy_client.key}",
        "--enable-aggregator-routing=true",
    ]


def keda_operator_args(bin_dir: Path, *, listen_ip: str, cert_dir: Path) -> list[str]:
    """keda-operator without certificate rotation: ``cert_dir`` holds ``ca.crt``, ``tls.crt`` and
    ``tls.key`` (issued by the cluster's CA), which its gRPC server and the adapter's client share.
    Every address it binds is ``listen_ip``. Environment: see :func:`keda_env`."""
    return [
        str(bin_dir / "keda-operator"),
        "--leader-elect=false",
        "--enable-cert-rotation=false",
        "--enable-webhook-patching=false",
        "--enable-apiservice-patching=false",
        f"--cert-dir={cert_dir}",
        f"--metrics-bind-address={listen_ip}:{KEDA_OPERATOR_METRICS_PORT}",
        f"--health-probe-bind-address={listen_ip}:{KEDA_OPERATOR_PROBE_PORT}",
        f"--metrics-service-bind-address={listen_ip}:{KEDA_GRPC_PORT}",
        "--zap-log-level=info",
        "--zap-encoder=console",
        "--zap-time-encoding=rfc3339",
    ]


def keda_adapter_args(bin_dir: Path, *, listen_ip: str, cert_dir: Path, kubeconfig_path: Path) -> list[str]:
    """keda-adapter, KEDA's external metrics server: HTTPS on ``listen_ip`` with the certificate in
    ``cert_dir`` (also its gRPC client's), authenticating the apiserver's proxied requests through
    kube-system/extension-apiserver-authentication and authorizing them with SubjectAccessReviews."""
    return [
        str(bin_dir / "keda-adapter"),
        f"--bind-address={listen_ip}",
        f"--secure-port={KEDA_ADAPTER_PORT}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={cert_dir / 'tls.crt'}",
        f"--tls-private-key-file={cert_dir / 'tls.key'}",
        f"--client-ca-file={cert_dir / 'ca.crt'}",
        f"--lister-kubeconfig={kubeconfig_path}",
        f"--authentication-kubeconfig={kubeconfig_path}",
        f"--authorization-kubeconfig={kubeconfig_path}",
        f"--metrics-service-address={listen_ip}:{KEDA_GRPC_PORT}",
        f"--port={KEDA_ADAPTER_METRICS_PORT}",
        "--zap-log-level=info",
        "--zap-encoder=console",
        "--zap-time-encoding=rfc3339",
    ]


def keda_env(kubeconfig_path: Path) -> dict[str, str]:
    """What KEDA's commands read from the environment (in a pod: its manifests and the SA mount)."""
    return {
        "KUBECONFIG": str(kubeconfig_path),
        "WATCH_NAMESPACE": "",  # every namespace
        "POD_NAMESPACE": KEDA_NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
    }


def json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add``/``remove``/``replace`` (what KEDA's CRD patches use) on a copy of ``doc``."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node: Any = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        kind = op["op"]
        if kind not in ("add", "remove", "replace"):
            raise ValueError(f"unsupported JSON patch op {kind!r}")
        if isinstance(node, list):
            if kind == "add":
                node.insert(len(node) if last == "-" else int(last), copy.deepcopy(op["value"]))
            elif kind == "remove":
                del node[int(last)]
            else:
                node[int(last)] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del node[last]
        else:
            if kind == "replace" and last not in node:
                raise KeyError(op["path"])
            node[last] = copy.deepcopy(op["value"])
    return out


def keda_crds(crd_dir: Path) -> list[dict[str, Any]]:
    """KEDA's CRDs as its ``config/crd`` kustomization makes them: the bases it lists, with its patches
    (JSON 6902, targeted by CRD name) applied."""
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    patches: dict[str, list[dict[str, Any]]] = {}
    for p in kustomization.get("patches") or []:
        ops = yaml.safe_load((crd_dir / p["path"]).read_text())
        patches.setdefault(p["target"]["name"], []).extend(ops)
    crds = []
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((crd_dir / resource).read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                crds.append(json_patch(doc, patches.get(doc["metadata"]["name"], [])))
    return crds


_RBAC_COLLECTIONS = {
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "Role": "roles",
    "RoleBinding": "rolebindings",
}


def keda_rbac(config_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) for KEDA's own RBAC, as shipped in its module: the operator's roles
    (``config/rbac``) and the metrics server's (``config/metrics-server``: auth delegation, the
    extension-apiserver-authentication reader, and external metrics for the HPA controller). Namespaced
    objects without a namespace go to :data:`KEDA_NAMESPACE` (its kustomization's ``namespace``)."""
    files = [
        config_dir / "rbac" / "role.yaml",
        config_dir / "rbac" / "role_binding.yaml",
        config_dir / "rbac" / "aggregate_cluster_roles.yaml",
        config_dir / "metrics-server" / "role.yaml",
        config_dir / "metrics-server" / "role_binding.yaml",
    ]
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    out: list[tuple[str, dict[str, Any]]] = []
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc or doc.get("kind") not in _RBAC_COLLECTIONS:
                continue
            collection = _RBAC_COLLECTIONS[doc["kind"]]
            if doc["kind"] in ("Role", "RoleBinding"):
                ns = doc["metadata"].setdefault("namespace", KEDA_NAMESPACE)
                out.append((f"{rbac}/namespaces/{ns}/{collection}", doc))
            else:
                out.append((f"{rbac}/{collection}", doc))
    return out


def keda_metrics_objects(
    config_dir: Path, *, ca_bundle: bytes, endpoint_ip: str
) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object): KEDA's namespace and ServiceAccount, the metrics server's Service
    (no selector: there is no pod) with an EndpointSlice to ``endpoint_ip`` (the adapter in the pod
    network), and KEDA's APIService ``v1beta1.external.metrics.k8s.io`` (``config/metrics-server``)
    trusting ``ca_bundle`` for the adapter's serving certificate."""
    api_service = next(
        d
        for d in yaml.safe_load_all((config_dir / "metrics-server" / "api_service.yaml").read_text())
        if d and d.get("kind") == "APIService"
    )
    api_service["spec"]["caBundle"] = base64.b64encode(ca_bundle).decode()
    api_service["spec"].pop("insecureSkipTLSVerify", None)
    ns, svc = KEDA_NAMESPACE, KEDA_METRICS_SERVICE
    labels = {"app.kubernetes.io/name": svc, "app.kubernetes.io/part-of": "keda-operator"}
    return [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        (
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": KEDA_SERVICE_ACCOUNT}},
        ),
        (
            f"/api/v1/namespaces/{ns}/services",
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": svc, "namespace": ns, "labels": labels},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": KEDA_ADAPTER_PORT}]},
            },
        ),
        (
            f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": svc,
                    "namespace": ns,
                    "labels": {
                        "kubernetes.io/service-name": svc,
                        "endpointslice.kubernetes.io/managed-by": "localcluster",
                    },
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [endpoint_ip], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": KEDA_ADAPTER_PORT, "protocol": "TCP"}],
            },
        ),
        ("/apis/apiregistration.k8s.io/v1/apiservices", api_service),
    ]


def api_service_available(api_service: dict[str, Any] | None) -> bool:
    conditions = ((api_service or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)
