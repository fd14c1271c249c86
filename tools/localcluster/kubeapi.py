"""Path-addressed Kubernetes access for the local cluster's tooling (the node agent, bring-up, the demo,
the test fixtures in ``localcluster.testing``, the benchmarks), through ModelDeploy's one client.

:class:`KubeAPI` holds no transport of its own: it is a :class:`modeldeploy.kube.Kube` (the
``kubernetes`` package's dynamic client: one ApiClient and urllib3 pool, retries of the idempotent
verbs, the kubeconfig's client certificate or token) made from a kubeconfig file, with the calls the
tooling makes addressed by REST path (nodes, CRDs, EndpointSlices, whatever a manifest holds): get,
create, strategic-merge patch, delete (a 404 is None) and a watch stream. Errors are
:class:`modeldeploy.kube.KubeError` (status, parsed Status body), re-exported here; a connection that
fails after the retries raises ``urllib3.exceptions.HTTPError``.

Plus :func:`ready_endpoints`, a Service's ready EndpointSlice addresses, and :func:`service_url`, its
ClusterIP as a URL (kube-proxy answers there, from the host and from pods).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from modeldeploy.kube import Kube, KubeError

__all__ = ["KubeAPI", "KubeError", "ready_endpoints", "service_url"]

USER_AGENT = "localcluster"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


class KubeAPI:
    """The one client, bound to a kubeconfig file, addressed by path."""

    def __init__(self, kubeconfig: Path, timeout: float = 30.0, pool_size: int = 32) -> None:
        # a User-Agent of its own: the audit log must not take the tooling's writes for the operator's
        self.kube = Kube.from_kubeconfig(
            kubeconfig, pool_size=pool_size, timeout=timeout, user_agent=USER_AGENT
        )
        self.server: str = self.kube.host

    def close(self) -> None:
        self.kube.close()

    def request(self, method: str, path: str, **kw: Any) -> dict[str, Any] | None:
        """:meth:`modeldeploy.kube.Kube.request` (``body``, ``content_type``, ``params``, ``ok_missing``)."""
        return self.kube.request(method, path, **kw)

    def get(self, path: str, **kw: Any) -> dict[str, Any] | None:
        return self.request("GET", path, **kw)

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return self.request("POST", path, body=body)

    def strategic_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return self.request("PATCH", path, body=body, content_type="application/strategic-merge-patch+json")

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        return self.request("DELETE", path, body=body, ok_missing=True)

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Iterator[dict[str, Any]]:
        """Yield watch events (``{"type", "object"}``) until the server closes the stream."""
        return self.kube.watch(path, resource_version, timeout_s)

    def crds_established(self, *crds: str) -> bool:
        """Whether every CustomResourceDefinition in ``crds`` (by name) has condition Established=True."""
        for name in crds:
            crd = self.get(f"{CRD_PATH}/{name}", ok_missing=True) or {}
            if not any(
                c.get("type") == "Established" and c.get("status") == "True"
                for c in (crd.get("status") or {}).get("conditions") or []
            ):
                return False
        return True

    def wait_established(self, *crds: str, timeout: float = 60.0) -> None:
        """Until :meth:`crds_established`. Polled: ``kubectl wait --for=condition=Established`` fails at
        once, instead of waiting, on a CRD whose status has no conditions yet -- as right after it was
        created (``.status.conditions accessor error: <nil>``)."""
        deadline = time.monotonic() + timeout
        while not self.crds_established(*crds):
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRDs {', '.join(crds)} not Established within {timeout:.0f}s")
            time.sleep(0.2)


def ready_endpoints(api: KubeAPI, namespace: str, service: str) -> list[tuple[str, int]]:
    """``(ip, port)`` of every ready endpoint in a Service's EndpointSlices (first port of each slice)."""
    slices = (
        api.get(
            f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
            params={"labelSelector": f"kubernetes.io/service-name={service}"},
        )
        or {}
    )
    out: list[tuple[str, int]] = []
    for s in slices.get("items", []):
        port = (s.get("ports") or [{}])[0].get("port")
        for ep in s.get("endpoints") or []:
            if (ep.get("conditions") or {}).get("ready") and port:
                out.extend((ip, int(port)) for ip in ep["addresses"])
    return out


def service_url(api: KubeAPI, namespace: str, service: str, port: int | str | None = None) -> str:
    """``http://<clusterIP>:<port>`` of a Service: its first port, or the one with this number or name."""
    svc = api.get(f"/api/v1/namespaces/{namespace}/services/{service}")
    spec = (svc or {}).get("spec") or {}
    ip = spec.get("clusterIP")
    if not ip or ip == "None":
        raise ValueError(f"service {namespace}/{service} has no ClusterIP")
    ports = spec.get("ports") or []
    chosen = next((p for p in ports if port is None or port in (p["port"], p.get("name"))), None)
    if chosen is None:
        raise ValueError(f"service {namespace}/{service} has no port {port!r}")
    return f"http://{ip}:{chosen['port']}"
