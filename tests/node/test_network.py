"""The real node's pod network: pods on the CNI bridge reach the apiserver through the ``kubernetes``
Service, another pod through its Service (ClusterIP and DNS name) and themselves (hairpin); the host
reaches pod IPs (Prometheus and Traefik do) and ClusterIPs."""

from __future__ import annotations

import httpx
from localcluster.cluster import Cluster
from localcluster.testing import Kube, wait_for

from .support import py, run_pod, server_pod

GET = "import urllib.request; print(urllib.request.urlopen('{url}', timeout=5).status)"

API = (
    "import ssl, urllib.request; "
    "sa = '/var/run/secrets/kubernetes.io/serviceaccount/'; "
    "ctx = ssl.create_default_context(cafile=sa + 'ca.crt'); "
    "req = urllib.request.Request('https://kubernetes.default.svc/api', "
    "headers={'Authorization': 'Bearer ' + open(sa + 'token').read()}); "
    "print(urllib.request.urlopen(req, timeout=5, context=ctx).status)"
)


def _service(kube: Kube, ns: str, name: str) -> str:
    kube.api.create(
        f"/api/v1/namespaces/{ns}/services",
        {
            "metadata": {"name": name},
            "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    svc = kube.get(f"/api/v1/namespaces/{ns}/services/{name}")
    assert svc is not None
    return str(svc["spec"]["clusterIP"])


def test_pods_reach_the_apiserver_services_and_the_host_reaches_pods(
    kube: Kube, namespace: str, python_image: str
) -> None:
    server, _ = run_pod(kube, namespace, server_pod("server", python_image))
    run_pod(kube, namespace, server_pod("client", python_image))
    ip = _service(kube, namespace, "server")
    wait_for(lambda: kube.endpoint_ips(namespace, "server"), timeout=30, what="server's endpoint ready")
    # the apiserver through the kubernetes Service's ClusterIP (DNS name, its CA, the pod's token)
    assert py(kube, namespace, "client", API).strip() == "200"
    # another pod through its Service: the ClusterIP (kube-proxy in the pod network, at its next sync:
    # refused until then) and the DNS name
    for url in (f"http://{ip}/", f"http://server.{namespace}.svc.cluster.local/"):
        wait_for(
            lambda url=url: py(kube, namespace, "client", GET.format(url=url), check=False).strip() == "200",
            timeout=15,
            what=f"client -> {url}",
        )
    # a pod through its own Service (hairpin)
    assert py(kube, namespace, "server", GET.format(url=f"http://{ip}/")).strip() == "200"
    # the host: the pod IP (routed into the pod network's namespace) and the ClusterIP
    assert httpx.get(f"http://{server['status']['podIP']}:8080/", timeout=5).status_code == 200
    assert httpx.get(f"http://{ip}/", timeout=5).status_code == 200


def test_prometheus_on_the_host_scrapes_a_pod_on_the_real_node(
    kube: Kube, namespace: str, python_image: str, cluster: Cluster
) -> None:
    pod = server_pod("scraped", python_image)
    pod["metadata"]["annotations"] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics.txt",  # text/plain: Prometheus 3 refuses octet-stream
    }
    run_pod(kube, namespace, pod)
    query = f'node_test_served{{namespace="{namespace}", pod="scraped"}}'

    def scraped() -> bool:
        r = httpx.get(f"{cluster.prometheus_url}/api/v1/query", params={"query": query}, timeout=5)
        return bool(r.json()["data"]["result"])

    wait_for(scraped, timeout=30, what=f"{query} in Prometheus")
