"""The Gateway API data plane's configuration: Traefik's command line and RBAC, the GatewayClass and the
shared Gateway."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .control_plane_config import READ_VERBS

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
