"""A thin synchronous Kubernetes REST client (httpx) for the local cluster's tooling: the node agent,
bring-up, the demo, the test fixtures (``localcluster.testing``) and the operator benchmark.

It reads a kubeconfig's current context and authenticates with its client certificate (the kubeconfigs
``localcluster`` writes) or, when the user has one, its bearer token (e.g. a service account's).
JSON in, JSON out: get, create, strategic-merge patch, delete (a 404 is None) and a watch stream; plus
:func:`ready_endpoints`, a Service's ready EndpointSlice addresses, and :func:`service_url`, its ClusterIP
as a URL (kube-proxy answers there, from the host and from pods). The operator has its own client
(``modeldeploy.kube``); this one keeps the cluster tooling free of any Kubernetes client library.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml


class KubeError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class KubeAPI:
    def __init__(self, kubeconfig: Path, timeout: float = 30.0) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        self.server = cluster["server"]
        headers = {}
        self._ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        if "token" in user:
            headers["Authorization"] = f"Bearer {user['token']}"
        else:
            self._ssl.load_cert_chain(user["client-certificate"], user["client-key"])
        self._client = httpx.Client(base_url=self.server, verify=self._ssl, headers=headers, timeout=timeout)
        self._headers = headers

    def close(self) -> None:
        self._client.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
        ok_missing: bool = False,
    ) -> dict[str, Any] | None:
        content = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        r = self._client.request(method, path, content=content, headers=headers, params=params)
        if r.status_code == 404 and ok_missing:
            return None
        if r.status_code >= 400:
            raise KubeError(method, path, r.status_code, r.text)
        return r.json() if r.content else {}

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
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        with (
            httpx.Client(
                base_url=self.server,
                verify=self._ssl,
                headers=self._headers,
                timeout=httpx.Timeout(timeout_s + 10, connect=10),
            ) as c,
            c.stream("GET", path, params=params) as r,
        ):
            if r.status_code >= 400:
                r.read()
                raise KubeError("WATCH", path, r.status_code, r.text)
            for line in r.iter_lines():
                if line:
                    yield json.loads(line)


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
