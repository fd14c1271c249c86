"""The Gateway API data plane of the local cluster: Traefik (its Kubernetes Gateway provider) serves the
shared Gateway ``gateway-system/public-gateway``; an HTTPRoute's weights and header matches decide which
pod answers, through the real gateway, from the host and from the pod network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import httpx
import pytest
from localcluster import config
from localcluster.testing import Kube, wait_for

from tests.e2e.canary_support import binomial_p_value
from tests.integration.cluster.test_services import GATE, app_pod, pod_network, running_ip, service, set_gate

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("E2E_KUBECONFIG")), reason="the local cluster's gateway (Traefik) only"
)
ROUTES = "/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes"
N = 400  # requests per weight setting
ALPHA = 1e-4  # the split is rejected below this p-value (exact two-sided binomial test)


def route(ns: str, w_a: int, w_b: int) -> dict[str, Any]:
    def ref(name: str, weight: int) -> dict[str, Any]:
        return {"kind": "Service", "name": name, "port": 80, "weight": weight}

    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "split"},
        "spec": {
            "parentRefs": [{"name": config.GATEWAY_NAME, "namespace": config.GATEWAY_NAMESPACE}],
            "hostnames": [f"split.{ns}.test"],
            "rules": [
                {
                    "matches": [
                        {
                            "path": {"type": "PathPrefix", "value": "/"},
                            "headers": [{"type": "Exact", "name": "x-canary", "value": "always"}],
                        }
                    ],
                    "backendRefs": [ref("svc-b", 1)],
                },
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [ref("svc-a", w_a), ref("svc-b", w_b)],
                },
            ],
        },
    }


def applied(kube: Kube, ns: str) -> bool:
    """The gateway accepted the route's current generation (Traefik writes the status after it built
    the configuration)."""
    r = kube.get(f"{ROUTES.format(ns=ns)}/split") or {}
    gen = r.get("metadata", {}).get("generation")
    return any(
        c["type"] == "Accepted" and c["status"] == "True" and c.get("observedGeneration") == gen
        for p in (r.get("status") or {}).get("parents") or []
        for c in p.get("conditions") or []
    )


def through_gateway(url: str, host: str, n: int, headers: dict[str, str] | None = None) -> list[str]:
    """The pod that answered each request (keep-alive: the gateway balances per request), or the status."""
    out = []
    with httpx.Client(timeout=5, headers={"Host": host, **(headers or {})}) as c:
        for _ in range(n):
            r = c.get(url + "/")
            out.append(r.json()["pod"] if r.status_code == 200 else str(r.status_code))
    return out


_POD_CLIENT = """
import http.client, json, sys, urllib.parse
u = urllib.parse.urlsplit(sys.argv[1])
c = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
c.request("GET", "/", headers={"Host": sys.argv[2]})
print(json.loads(c.getresponse().read())["pod"])
"""


def test_the_gateway_routes_by_weight_and_by_header(kube: Kube, namespace: str) -> None:
    ns = namespace
    url = kube.cluster.gateway_url
    assert url, "the cluster records its Gateway's URL"
    assert (kube.cluster.state_dir / "gateway-url").read_text().strip() == url
    gw = kube.get(
        f"/apis/gateway.networking.k8s.io/v1/namespaces/{config.GATEWAY_NAMESPACE}/gateways/{config.GATEWAY_NAME}"
    )
    assert config.gateway_programmed(gw), gw
    kube.apply(app_pod("a", "a"), ns)
    kube.apply(app_pod("b", "b", gates=(GATE,)), ns)
    kube.apply(service("svc-a", "a"), ns)
    kube.apply(service("svc-b", "b"), ns)
    running_ip(kube, ns, "a")
    running_ip(kube, ns, "b")
    set_gate(kube, ns, "b", True)
    wait_for(lambda: kube.endpoint_ips(ns, "svc-b"), what="b ready")
    wait_for(lambda: kube.endpoint_ips(ns, "svc-a"), what="a ready")
    host = f"split.{ns}.test"
    figures: dict[str, Any] = {}
    for w_a, w_b in ((100, 0), (75, 25), (50, 50)):
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-n", ns, "-f", "-",
                     input=json.dumps(route(ns, w_a, w_b)))  # fmt: skip
        wait_for(lambda: applied(kube, ns), timeout=20, interval=0.1, what=f"route {w_a}/{w_b} accepted")
        time.sleep(1.0)  # the status is written as the configuration is handed to the router
        seen = Counter(through_gateway(url, host, N))
        p = binomial_p_value(seen["b"], N, w_b / 100)
        figures[f"{w_a}/{w_b}"] = {"b_share": seen["b"] / N, "p_value": p, "answers": dict(seen)}
        assert set(seen) <= {"a", "b"}, seen  # every request answered by a pod
        assert p >= ALPHA, figures
        # the header match wins over every weight
        assert set(through_gateway(url, host, 30, {"x-canary": "always"})) == {"b"}
    print(f"gateway split (N={N}): {figures}")
    # from inside the pod network too (a pod's client)
    net = pod_network(kube)
    res = subprocess.run(
        [*net.exec_prefix(), sys.executable, "-c", _POD_CLIENT, url, host],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0 and res.stdout.strip() in {"a", "b"}, res.stderr
    # a backend with no ready endpoint: the gateway answers 503 (it never reaches a pod)
    set_gate(kube, ns, "b", False)
    wait_for(lambda: not kube.endpoint_ips(ns, "svc-b"), what="b out of its Service")
    wait_for(
        lambda: set(through_gateway(url, host, 10, {"x-canary": "always"})) == {"503"},
        timeout=10,
        interval=0.2,
        what="503 from the gateway for a backend without a ready endpoint",
    )
    # an unknown host matches no route: 404 from the gateway
    assert set(through_gateway(url, f"nothing.{ns}.test", 3)) == {"404"}
