"""A thin, synchronous Kubernetes REST client over plain dicts (JSON in, JSON out).

The ``kubernetes`` package is used only to load the connection settings (``KUBECONFIG`` or the
in-cluster service account); requests go through one ``urllib3`` pool. Every write is counted in the
operator metrics (``modeldeploy_writes_total{kind,verb}``), which is how the benchmark and the tests
see that a reconcile with nothing to change writes nothing.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from . import metrics

log = logging.getLogger(__name__)


class KubeError(Exception):
    """A non-2xx answer of the apiserver."""

    def __init__(self, status: int, body: dict[str, Any] | str, method: str, path: str):
        self.status = status
        self.body = body
        self.method = method
        self.path = path
        msg = body.get("message", "") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{method} {path}: {status} {msg}")

    @property
    def namespace_terminating(self) -> bool:
        """A write refused because the namespace is being deleted or gone (nothing to do there)."""
        if not isinstance(self.body, dict):
            return False
        if self.status == 404:
            return (self.body.get("details") or {}).get("kind") == "namespaces"
        if self.status != 403:
            return False
        causes = (self.body.get("details") or {}).get("causes") or []
        return any(c.get("type") == "NamespaceTerminating" for c in causes) or (
            "because it is being terminated" in self.message
        )

    @property
    def message(self) -> str:
        return self.body.get("message", "") if isinstance(self.body, dict) else str(self.body)


@dataclass(frozen=True)
class ResourceType:
    """Where a kind lives in the REST API."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name)}"
        if sub is not None:
            base += f"/{sub}"
        return base


MODELDEPLOYMENT = ResourceType("modeldeploy.io", "v1alpha1", "modeldeployments", "ModelDeployment")
DEPLOYMENT = ResourceType("apps", "v1", "deployments", "Deployment")
SERVICE = ResourceType("", "v1", "services", "Service")
PDB = ResourceType("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
POD = ResourceType("", "v1", "pods", "Pod")
EVENT = ResourceType("", "v1", "events", "Event")
CLUSTER_PEERING = ResourceType(
    "kopf.dev", "v1", "clusterkopfpeerings", "ClusterKopfPeering", namespaced=False
)
PEERING = ResourceType("kopf.dev", "v1", "kopfpeerings", "KopfPeering")
HTTPROUTE = ResourceType("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute")
SCALEDOBJECT = ResourceType("keda.sh", "v1alpha1", "scaledobjects", "ScaledObject")

BY_KIND: dict[str, ResourceType] = {
    rt.kind: rt
    for rt in (
        MODELDEPLOYMENT,
        DEPLOYMENT,
        SERVICE,
        PDB,
        POD,
        EVENT,
        CLUSTER_PEERING,
        PEERING,
        HTTPROUTE,
        SCALEDOBJECT,
    )
}


def resource_type_of(obj: Mapping[str, Any]) -> ResourceType:
    return BY_KIND[obj["kind"]]


class Kube:
    """Synchronous JSON client; thread-safe (one urllib3 pool shared by the reconcile threads)."""

    def __init__(
        self,
        host: str,
        *,
        ca_cert: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        verify: bool = True,
        token: str | None = None,
        token_refresher: Any = None,
        pool_size: int = 8,
        timeout: float = 30.0,
    ):
        self.host = host.rstrip("/")
        self._token = token
        self._token_refresher = token_refresher
        self._lock = threading.Lock()
        kwargs: dict[str, Any] = {"maxsize": pool_size, "block": True, "retries": False}
        if self.host.startswith("https"):
            kwargs["cert_reqs"] = ssl.CERT_REQUIRED if verify else ssl.CERT_NONE
            if not verify:  # the kubeconfig asked for it (insecure-skip-tls-verify); say it once
                log.warning("TLS verification of the apiserver is off (insecure-skip-tls-verify)")
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            if ca_cert:
                kwargs["ca_certs"] = ca_cert
            if cert_file:
                kwargs["cert_file"] = cert_file
            if key_file:
                kwargs["key_file"] = key_file
        self._pool = urllib3.PoolManager(num_pools=4, **kwargs)
        self._timeout = urllib3.Timeout(connect=5.0, read=timeout)

    # -------------------------------------------------------------------------------- construction
    @classmethod
    def from_environment(cls, pool_size: int = 8) -> Kube:
        """In-cluster service account when running in a pod, otherwise ``KUBECONFIG`` (or ~/.kube/config)."""
        from kubernetes import client, config  # imported lazily: only for the settings

        cfg = client.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            config.load_incluster_config(client_configuration=cfg)
        else:
            config.load_kube_config(client_configuration=cfg)
        auth = cfg.auth_settings().get("BearerToken")
        token = auth["value"] if auth else None
        refresher = cfg.refresh_api_key_hook
        return cls(
            cfg.host,
            ca_cert=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
            token=token,
            token_refresher=(lambda: (refresher(cfg), cfg.auth_settings()["BearerToken"]["value"])[1])
            if refresher
            else None,
            pool_size=pool_size,
        )

    # -------------------------------------------------------------------------------- transport
    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "modeldeploy-operator"}
        if content_type:
            headers["Content-Type"] = content_type
        token = self._token
        if self._token_refresher is not None:
            with self._lock:
                token = self._token = self._token_refresher()
        if token:
            headers["Authorization"] = token if token.startswith("Bearer ") else f"Bearer {token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        url = self.host + path
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            content_type = content_type or "application/json"
        resp = self._pool.request(
            method, url, body=data, headers=self._headers(content_type), timeout=self._timeout
        )
        raw = resp.data
        try:
            parsed: Any = json.loads(raw) if raw else {}
        except ValueError:
            parsed = raw.decode(errors="replace")
        if resp.status >= 400:
            raise KubeError(resp.status, parsed, method, path)
        return parsed if isinstance(parsed, dict) else {}

    # -------------------------------------------------------------------------------- reads
    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        metrics.READS.labels(kind=rt.kind, verb="get").inc()
        try:
            return self.request("GET", rt.path(namespace, name))
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def list(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        query: dict[str, Any] = {"labelSelector": label_selector, "limit": 500}
        metrics.READS.labels(kind=rt.kind, verb="list").inc()
        while True:
            page = self.request("GET", rt.path(namespace), query=query)
            for item in page.get("items", []):
                item.setdefault("apiVersion", rt.api_version)
                item.setdefault("kind", rt.kind)
                out.append(item)
            cont = page.get("metadata", {}).get("continue")
            if not cont:
                return out
            query["continue"] = cont

    # -------------------------------------------------------------------------------- writes
    def apply(self, obj: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of a whole object (the field manager owns exactly what ``obj`` holds)."""
        rt = resource_type_of(obj)
        meta = obj["metadata"]
        metrics.WRITES.labels(kind=rt.kind, verb="apply").inc()
        return self.request(
            "PATCH",
            rt.path(meta.get("namespace"), meta["name"]),
            query={"fieldManager": field_manager, "force": "true" if force else None},
            body=obj,
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        rt = resource_type_of(obj)
        metrics.WRITES.labels(kind=rt.kind, verb="create").inc()
        return self.request("POST", rt.path(obj["metadata"].get("namespace")), body=obj)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); False when it was already gone."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        metrics.WRITES.labels(kind=rt.kind, verb="delete").inc()
        try:
            self.request("DELETE", rt.path(namespace, name), body=body)
            return True
        except KubeError as e:
            if e.status in (404, 409):
                return False
            raise

    def _patch(
        self,
        content_type: str,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        sub: str | None,
    ) -> dict[str, Any]:
        metrics.WRITES.labels(kind=rt.kind if sub is None else f"{rt.kind}/{sub}", verb="patch").inc()
        return self.request("PATCH", rt.path(namespace, name, sub), body=patch, content_type=content_type)

    def merge_patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        sub: str | None = None,
    ) -> dict[str, Any]:
        return self._patch("application/merge-patch+json", rt, namespace, name, patch, sub)

    def strategic_patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch: dict[str, Any],
        sub: str | None = None,
    ) -> dict[str, Any]:
        return self._patch("application/strategic-merge-patch+json", rt, namespace, name, patch, sub)
