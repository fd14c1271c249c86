"""Service ClusterIPs answer in the local cluster: kube-proxy (nftables) runs inside the cluster's pod
network namespace and translates ClusterIPs there, from the host (routed into the namespace) and from
pods (inside it), to ready endpoints only, following the pod set within seconds."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from localcluster import cluster as lc
from localcluster import podnet
from localcluster.kubeapi import service_url
from localcluster.testing import Kube, wait_for

TESTAPP = "modeldeploy/testapp:dev"
GATE = "modeldeploy.io/in-traffic"
# Within this many seconds of a pod set change the ClusterIP follows (EndpointSlice controller, then
# kube-proxy's next sync: at most one per second).
FOLLOW_S = 8.0

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("E2E_KUBECONFIG")), reason="the local cluster's pod network and kube-proxy only"
)


def app_pod(name: str, app: str, *, gates: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "readinessGates": [{"conditionType": g} for g in gates],
            "containers": [
                {
                    "name": "app",
                    "image": TESTAPP,
                    "args": ["--port", "8080"],
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": "http"},
                        "periodSeconds": 1,
                        "failureThreshold": 1,
                    },
                }
            ],
        },
    }


def service(name: str, app: str, *, publish_not_ready: bool = False) -> dict[str, Any]:
    """Port 80 on the ClusterIP, 8080 (by name) on the pods: kube-proxy translates the port too."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": app},
            "publishNotReadyAddresses": publish_not_ready,
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }


def pod_network(kube: Kube) -> podnet.PodNetwork:
    rec = lc.ClusterRecord.load(kube.cluster.state_dir)
    assert rec is not None
    return podnet.PodNetwork(rec.pod_network_index)


def set_gate(kube: Kube, namespace: str, pod: str, status: bool) -> None:
    patch = json.dumps({"status": {"conditions": [{"type": GATE, "status": str(status)}]}})
    kube.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status", "-p", patch)


def from_host(url: str, n: int = 1) -> list[str]:
    """The pod that answered each of ``n`` requests (a fresh connection each), or the error's name."""
    out = []
    for _ in range(n):
        try:
            out.append(httpx.get(url, timeout=2).json()["pod"])
        except httpx.HTTPError as exc:
            out.append(type(exc).__name__)
    return out


# Runs inside the pod network namespace, like a pod's client: n requests to a URL, each on a fresh
# connection, optionally from a given source address (a pod's own IP).
_CLIENT = """
import http.client, json, sys, urllib.parse
url, n, source = sys.argv[1], int(sys.argv[2]), sys.argv[3]
u = urllib.parse.urlsplit(url)
out = []
for _ in range(n):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=2,
                                   source_address=(source, 0) if source else None)
    try:
        c.request("GET", "/")
        out.append(json.loads(c.getresponse().read())["pod"])
    except OSError as exc:
        out.append(type(exc).__name__)
    finally:
        c.close()
print(json.dumps(out))
"""


def from_pod_network(net: podnet.PodNetwork, url: str, n: int = 1, source: str = "") -> list[str]:
    res = subprocess.run(
        [*net.exec_prefix(), sys.executable, "-c", _CLIENT, url, str(n), source],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout))


def running_ip(kube: Kube, namespace: str, pod: str) -> str:
    path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
    p = wait_for(
        lambda: (
            (q := kube.get(path)) and q["status"].get("phase") == "Running" and q["status"].get("podIP") and q
        ),
        what=f"pod {pod} running",
    )
    return str(p["status"]["podIP"])


def follows(fetch: Callable[[int], list[str]], want: set[str], *, n: int = 20, what: str) -> float:
    """Seconds until ``n`` requests are answered by exactly the pods ``want`` (each at least once)."""
    start = time.monotonic()
    wait_for(lambda: set(fetch(n)) == want, timeout=FOLLOW_S, interval=0.1, what=what)
    return time.monotonic() - start


def test_a_cluster_ip_answers_from_the_host_and_from_inside_the_pod_network(
    kube: Kube, namespace: str
) -> None:
    net = pod_network(kube)
    kube.apply(service("web", "web"), namespace)
    kube.apply(app_pod("web-0", "web"), namespace)
    url = service_url(kube.api, namespace, "web")
    ip = ipaddress.ip_address(url.removeprefix("http://").rsplit(":", 1)[0])
    assert ip in ipaddress.ip_network(net.service_cidr) and url.endswith(":80")
    assert kube.cluster.service_cidr == net.service_cidr
    wait_for(lambda: from_host(url) == ["web-0"], timeout=60, what="the ClusterIP answering from the host")
    assert from_host(url, 10) == ["web-0"] * 10
    assert from_pod_network(net, url, 10) == ["web-0"] * 10
    # By port name too, and the `kubernetes` Service reaches the apiserver from pods (TLS, its SANs).
    assert service_url(kube.api, namespace, "web", "http") == url
    with pytest.raises(ValueError):
        service_url(kube.api, namespace, "web", 81)
    probe = (
        "import ssl, sys, urllib.request; "
        "print(urllib.request.urlopen(sys.argv[1], context=ssl.create_default_context(cafile=sys.argv[2]), "
        "timeout=3).read().decode())"
    )
    res = subprocess.run(
        [
            *net.exec_prefix(),
            sys.executable,
            "-c",
            probe,
            f"https://{net.kubernetes_service_ip}/readyz",
            str(kube.cluster.state_dir / "pki" / "ca.crt"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_only_ready_endpoints_get_traffic_and_the_cluster_ip_follows_the_pod_set(
    kube: Kube, namespace: str
) -> None:
    net = pod_network(kube)
    kube.apply(service("pool", "pool"), namespace)
    kube.apply(app_pod("a", "pool"), namespace)
    kube.apply(app_pod("b", "pool", gates=(GATE,)), namespace)  # gate unset: never Ready
    b_ip = running_ip(kube, namespace, "b")
    url = service_url(kube.api, namespace, "pool")
    wait_for(lambda: from_host(url) == ["a"], timeout=60, what="a answering on the ClusterIP")
    # b runs and answers on its pod IP, but is not Ready: the ClusterIP never sends it anything.
    assert httpx.get(f"http://{b_ip}:8080/", timeout=2).json()["pod"] == "b"
    assert set(from_host(url, 30)) == {"a"}
    assert set(from_pod_network(net, url, 30)) == {"a"}

    set_gate(kube, namespace, "b", True)
    took = follows(
        lambda n: from_host(url, n), {"a", "b"}, what="both pods behind the ClusterIP once b is Ready"
    )
    assert set(from_pod_network(net, url, 30)) == {"a", "b"}

    kube.kubectl("delete", "pod", "a", "-n", namespace, "--wait=false")
    took = max(took, follows(lambda n: from_host(url, n), {"b"}, what="only b once a is deleted"))

    set_gate(kube, namespace, "b", False)  # no ready endpoint left: refused at once, not a timeout
    took = max(took, follows(lambda n: from_host(url, n), {"ConnectError"}, what="refused with no endpoint"))
    assert from_pod_network(net, url, 3) == ["ConnectionRefusedError"] * 3
    assert took < FOLLOW_S


def test_publish_not_ready_addresses_reaches_a_not_ready_pod(kube: Kube, namespace: str) -> None:
    net = pod_network(kube)
    kube.apply(service("strict", "lonely"), namespace)
    kube.apply(service("eager", "lonely", publish_not_ready=True), namespace)
    kube.apply(app_pod("lonely", "lonely", gates=(GATE,)), namespace)  # never Ready
    running_ip(kube, namespace, "lonely")
    eager, strict = service_url(kube.api, namespace, "eager"), service_url(kube.api, namespace, "strict")
    wait_for(lambda: from_host(eager) == ["lonely"], timeout=60, what="the not-ready pod behind 'eager'")
    assert from_pod_network(net, eager, 5) == ["lonely"] * 5
    assert from_host(strict, 5) == ["ConnectError"] * 5


def test_a_pod_reaches_its_own_service_hairpin(kube: Kube, namespace: str) -> None:
    net = pod_network(kube)
    kube.apply(service("self", "self"), namespace)
    kube.apply(app_pod("self-0", "self"), namespace)
    ip = running_ip(kube, namespace, "self-0")
    url = service_url(kube.api, namespace, "self")
    wait_for(lambda: from_host(url) == ["self-0"], timeout=60, what="the ClusterIP answering")
    # From the pod's own address to its own Service and back to itself.
    assert from_pod_network(net, url, 10, source=ip) == ["self-0"] * 10


def _nft_tables(net: podnet.PodNetwork | None) -> str:
    prefix = net.exec_prefix() if net else []
    return subprocess.run(
        [*prefix, "nft", "list", "tables"], capture_output=True, text=True, check=True
    ).stdout


def test_two_clusters_each_keep_their_rules_in_their_own_namespace(
    kube: Kube, namespace: str, tmp_path: Path
) -> None:
    net = pod_network(kube)
    kube.apply(service("steady", "steady"), namespace)
    kube.apply(app_pod("steady-0", "steady"), namespace)
    url = service_url(kube.api, namespace, "steady")
    wait_for(lambda: from_host(url) == ["steady-0"], timeout=60, what="the ClusterIP answering")
    other_state = tmp_path / "other"
    lc.up(other_state)
    try:
        rec = lc.ClusterRecord.load(other_state)
        assert rec is not None
        other = podnet.PodNetwork(rec.pod_network_index)
        assert other.index != net.index
        assert not ipaddress.ip_network(other.service_cidr).overlaps(ipaddress.ip_network(net.service_cidr))
        assert "kube-proxy" in {p.name for p in rec.processes}
        for n in (net, other):
            assert "table ip kube-proxy" in _nft_tables(n)
        assert "kube-proxy" not in _nft_tables(None)  # the host's own netfilter is untouched
        assert from_host(url, 10) == ["steady-0"] * 10
    finally:
        lc.down(other_state)
    routes = subprocess.run(["ip", "route", "show", other.service_cidr], capture_output=True, text=True)
    assert routes.stdout.strip() == ""  # gone with the veth
    assert from_host(url, 10) == ["steady-0"] * 10  # the first cluster's rules never moved


_RESOLVE = """
import json, socket, sys, time
out = {}
for name in sys.argv[1:]:
    t0 = time.monotonic()
    try:
        found = socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)
        out[name] = sorted({a[4][0] for a in found})
    except socket.gaierror as exc:
        out[name] = f"gaierror {exc.errno}"
    out[name + " s"] = round(time.monotonic() - t0, 2)
print(json.dumps(out))
"""


def test_pods_resolve_service_names_through_the_cluster_dns_and_nothing_outside_it(
    kube: Kube, namespace: str
) -> None:
    net = pod_network(kube)
    kube.apply(service("dns-web", "dns-web"), namespace)
    kube.apply(app_pod("dns-web-0", "dns-web"), namespace)
    ip = service_url(kube.api, namespace, "dns-web").removeprefix("http://").rsplit(":", 1)[0]
    fqdn = f"dns-web.{namespace}.svc.cluster.local"
    names = [
        fqdn,
        f"dns-web.{namespace}",
        "kubernetes.default.svc.cluster.local",
        f"absent.{namespace}.svc.cluster.local",
        "pypi.org",
    ]
    res = subprocess.run(
        [*net.exec_prefix(), sys.executable, "-c", _RESOLVE, *names],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got[fqdn] == [ip] and got[f"dns-web.{namespace}"] == [ip]  # the search list has svc.cluster.local
    assert got["kubernetes.default.svc.cluster.local"] == [net.kubernetes_service_ip]
    assert str(got[f"absent.{namespace}.svc.cluster.local"]).startswith("gaierror")
    # a name outside the cluster is refused at once (nothing leaves this machine), never a slow timeout
    assert str(got["pypi.org"]).startswith("gaierror") and got["pypi.org s"] < 1.0, got
    # by name, through kube-proxy, to the pod -- as a stable server reaches its shadow revision
    running_ip(kube, namespace, "dns-web-0")
    wait_for(lambda: from_pod_network(net, f"http://{fqdn}:80") == ["dns-web-0"], timeout=60, what="by name")
