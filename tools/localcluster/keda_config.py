"""The aggregation layer's and KEDA's configuration: the apiserver's front-proxy flags, the command lines
and environment of keda-operator and keda-adapter, and KEDA's CRDs, RBAC and metrics APIService as its
module's ``config/`` ships them."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from .pki import KeyPair

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
