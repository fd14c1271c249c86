"""Traefik as the local cluster's Gateway API data plane: its command line, its rights and the Gateway
objects ``up`` creates (pure builders in localcluster.config)."""

from __future__ import annotations

from pathlib import Path

from localcluster import config, podnet


def test_traefik_listens_on_the_anchor_only_with_the_gateway_provider_alone(tmp_path: Path) -> None:
    net = podnet.PodNetwork(3)
    args = config.traefik_args(tmp_path, listen_ip=net.anchor_ip)
    assert args[0] == str(tmp_path / "traefik")
    assert f"--entryPoints.web.address=10.244.3.254:{config.GATEWAY_PORT}" in args
    assert f"--entryPoints.traefik.address=10.244.3.254:{config.TRAEFIK_PING_PORT}" in args
    assert "--providers.kubernetesGateway=true" in args
    assert "--providers.kubernetesGateway.statusAddress.ip=10.244.3.254" in args
    assert "--global.checkNewVersion=false" in args and "--global.sendAnonymousUsage=false" in args
    # no other provider, no dashboard or API, nothing bound to every address
    providers = [a for a in args if a.startswith("--providers.")]
    assert f"--providers.providersThrottleDuration={config.TRAEFIK_THROTTLE}" in providers
    assert not [a for a in providers if "kubernetesGateway" not in a and "ThrottleDuration" not in a]
    assert not [a for a in args if a.startswith("--api")]
    assert not [a for a in args if "0.0.0.0" in a or "address=:" in a]
    # the healthz/metrics ports kube-proxy binds on the same anchor are not taken
    assert {config.GATEWAY_PORT, config.TRAEFIK_PING_PORT}.isdisjoint(
        {config.KUBE_PROXY_HEALTHZ_PORT, config.KUBE_PROXY_METRICS_PORT}
    )


def test_the_gateway_is_shared_by_every_namespace_on_the_traefik_class() -> None:
    objs = {o["kind"]: (path, o) for path, o in config.gateway_objects()}
    _, cls = objs["GatewayClass"]
    assert cls["spec"]["controllerName"] == "traefik.io/gateway-controller"
    path, gw = objs["Gateway"]
    assert path.endswith(f"/namespaces/{config.GATEWAY_NAMESPACE}/gateways")
    assert gw["metadata"] == {"name": "public-gateway", "namespace": config.GATEWAY_NAMESPACE}
    assert gw["spec"]["gatewayClassName"] == cls["metadata"]["name"]
    (listener,) = gw["spec"]["listeners"]
    # Traefik pairs a listener with the entry point of the same port
    assert listener["port"] == config.GATEWAY_PORT and listener["protocol"] == "HTTP"
    assert listener["allowedRoutes"] == {"namespaces": {"from": "All"}}
    assert objs["Namespace"][1]["metadata"]["name"] == config.GATEWAY_NAMESPACE
    # created in order: the namespace before its Gateway
    kinds = [o["kind"] for _, o in config.gateway_objects()]
    assert kinds.index("Namespace") < kinds.index("Gateway")


def test_traefik_may_read_what_its_provider_watches_and_write_only_gateway_status() -> None:
    writes = {
        (g, r) for rule in config.TRAEFIK_RULES for g in rule["apiGroups"] for r in rule["resources"]
        if set(rule["verbs"]) - {"get", "list", "watch"}
    }  # fmt: skip
    assert writes and all(g == "gateway.networking.k8s.io" and r.endswith("/status") for g, r in writes)
    assert all(
        set(rule["verbs"]) <= {"update"}
        for rule in config.TRAEFIK_RULES
        if rule["resources"][0].endswith("/status")
    )
    reads = {(g, r) for rule in config.TRAEFIK_RULES for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "services"), ("discovery.k8s.io", "endpointslices"), ("", "namespaces")} <= reads
    assert {("gateway.networking.k8s.io", k) for k in ("gateways", "gatewayclasses", "httproutes")} <= reads
    assert ("", "pods") not in reads  # only its OpenTelemetry support reads pods


def test_gateway_programmed_reads_the_status_condition() -> None:
    assert not config.gateway_programmed(None)
    assert not config.gateway_programmed({"status": {"conditions": [{"type": "Accepted", "status": "True"}]}})
    assert not config.gateway_programmed(
        {"status": {"conditions": [{"type": "Programmed", "status": "False"}]}}
    )
    assert config.gateway_programmed({"status": {"conditions": [{"type": "Programmed", "status": "True"}]}})
