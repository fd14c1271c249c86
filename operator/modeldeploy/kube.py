"""The one Kubernetes client of ModelDeploy: a thin wrapper over the ``kubernetes`` package's
:class:`~kubernetes.dynamic.DynamicClient`, plain dicts in and out.

The operator, the ``kubectl-modeldeploy`` plugin, the local cluster's tooling (``localcluster``: the
node agent, bring-up, the demo, the test fixtures) and the benchmarks all talk to the apiserver through
:class:`Kube`:

- connection settings, TLS, auth plugins and token refresh from ``kubernetes.config`` (``KUBECONFIG``,
  a given kubeconfig file, or the in-cluster service account);
- one :class:`kubernetes.client.ApiClient` (one urllib3 pool, sized for the caller's threads,
  ``Configuration.connection_pool_maxsize``), retries on connection errors and on 429/5xx answers for
  the idempotent verbs only (GET, HEAD, PUT, DELETE, OPTIONS: urllib3 ``Retry`` via
  ``Configuration.retries``; a PATCH or POST is never sent twice);
- discovery by the dynamic client, in memory (no cache file): a :class:`ResourceType` is looked up once
  and memoized, so a call costs no discovery round trip; a kind the server did not serve when the
  client was made (a CRD installed later: ModelDeployment, KEDA's ScaledObject, HTTPRoute) refreshes
  discovery once on the miss, and a kind still unknown answers like the apiserver would, a 404;
- server-side apply with our field manager (``force``), get, list (paged), create, delete (background
  propagation, optional uid precondition), JSON merge and strategic merge patches (also of a
  subresource), and for the local cluster's tooling the same calls addressed by path plus a watch;
- one error type, :class:`KubeError` (status, parsed Status body, method, path), for every non-2xx
  answer; connection failures left after the retries propagate as ``urllib3.exceptions.HTTPError``;
- every write counted in ``modeldeploy_writes_total{kind,verb}`` and every typed read in
  ``modeldeploy_reads_total{kind,verb}`` (operator metrics), which is how the benchmark and the tests
  see that a reconcile with nothing to change writes nothing.

Responses are not wrapped in the dynamic client's ``ResourceInstance``: its serializer is replaced by the
identity, so an answer is the parsed JSON dict the pure code, the childcache and the tests work on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client as kclient
from kubernetes import config as kconfig
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.discovery import LazyDiscoverer
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from kubernetes.watch.watch import iter_resp_lines
from urllib3.util.retry import Retry

from . import metrics

log = logging.getLogger(__name__)

#: the verbs a retry cannot apply twice (urllib3 retries reads and status answers only for these)
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
#: the operator's User-Agent: the audit log tells its requests (and the benchmark its writes) by it
USER_AGENT = "modeldeploy-operator"


def default_retries() -> Retry:
    """Connection errors for any verb (nothing was sent); read errors and 429/5xx answers only for the
    idempotent verbs; ``Retry-After`` honoured; the last answer returned, not raised, when they run out."""
    return Retry(
        total=4,
        connect=3,
        read=2,
        status=3,
        backoff_factor=0.2,
        status_forcelist=RETRY_STATUS,
        allowed_methods=IDEMPOTENT,
        respect_retry_after_header=True,
        raise_on_status=False,
    )


class KubeError(Exception):
    """A non-2xx answer of the apiserver (or a kind it does not serve: 404)."""

    def __init__(self, status: int, body: dict[str, Any] | str, method: str = "", path: str = ""):
        self.status = status
        self.body = body
        self.method = method
        self.path = path
        super().__init__(f"{method} {path}: {status} {self.message[:500]}")

    @classmethod
    def from_api_exception(cls, e: ApiException, method: str, path: str) -> KubeError:
        raw = e.body
        if isinstance(raw, bytes):
            raw = raw.decode(errors="replace")
        body: dict[str, Any] | str = raw or e.reason or ""
        if isinstance(raw, str) and raw.startswith("{"):
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                body = parsed
        return cls(int(e.status or 0), body, method, path)

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
        return str(self.body.get("message", "")) if isinstance(self.body, dict) else str(self.body)


@dataclass(frozen=True)
class ResourceType:
    """A kind the operator addresses (the dynamic client resolves it to its REST resource)."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        """The REST path (for messages and for the path-addressed calls)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{name}"
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
ENDPOINTSLICE = ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")

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
        ENDPOINTSLICE,
        SCALEDOBJECT,
    )
}


def resource_type_of(obj: Mapping[str, Any]) -> ResourceType:
    return BY_KIND[obj["kind"]]


def _as_is(_client: Any, obj: Any) -> Any:
    """The dynamic client's serializer hook: keep the parsed JSON (no ``ResourceInstance``)."""
    return obj


class _DynamicClient(DynamicClient):
    """The dynamic client with a default (connect, read) timeout on every request, its own discovery's
    included (the library sends those without one: a hung apiserver would hang the caller forever)."""

    request_timeout: tuple[float, float] = (5.0, 30.0)

    def request(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        params.setdefault("_request_timeout", self.request_timeout)
        return super().request(method, path, body=body, **params)


class _InMemoryDiscoverer(LazyDiscoverer):
    """The dynamic client's lazy discovery without its cache file (a file in /tmp shared by every
    process that talks to the same host: stale across local clusters, written concurrently, and not
    writable in a read-only pod). Each client discovers once, then refreshes on a miss."""

    def _write_cache(self) -> None:
        pass


#: a cache path that never exists, so the discoverer starts from the server (and never writes it)
_NO_CACHE_FILE = "/nonexistent/modeldeploy-discovery-in-memory.json"


def _plural_of(path: str) -> str:
    """``pods`` for ``/api/v1/namespaces/ns/pods/x/status`` (the label of a path-addressed call)."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    parts = parts[2:] if parts and parts[0] == "api" else parts[3:]  # drop api/v1 or apis/g/v
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    return parts[0] if parts else "?"


#: how long a kind the server does not serve is taken as still not served, before discovery is asked again
MISS_TTL = 10.0


def _not_served(rt: ResourceType) -> KubeError:
    return KubeError(
        404,
        {
            "kind": "Status",
            "status": "Failure",
            "reason": "NotFound",
            "message": f"the server does not serve {rt.kind} ({rt.api_version})",
            "code": 404,
        },
        "DISCOVER",
        rt.path(),
    )


class Kube:
    """Synchronous client over plain dicts; thread-safe (one pool shared by the caller's threads)."""

    def __init__(
        self,
        configuration: kclient.Configuration,
        *,
        pool_size: int = 8,
        timeout: float = 30.0,
        user_agent: str = USER_AGENT,
    ):
        configuration.connection_pool_maxsize = pool_size
        if configuration.retries is None:
            configuration.retries = default_retries()
        if not configuration.verify_ssl and configuration.host.startswith("https"):
            log.warning("TLS verification of the apiserver is off (insecure-skip-tls-verify)")
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.configuration = configuration
        self.host = configuration.host
        self.api_client = kclient.ApiClient(configuration)
        self.api_client.user_agent = user_agent
        self._timeout = (5.0, timeout)  # connect, read
        self._lock = threading.Lock()
        self._dynamic: DynamicClient | None = None
        self._resources: dict[tuple[str, str, str | None], Any] = {}
        # kinds the server did not serve, and when discovery last said so: asked again after MISS_TTL (a
        # reconcile that needs an absent CRD must not refresh the whole discovery every time)
        self._missing: dict[tuple[str, str], float] = {}
        self._clock: Callable[[], float] = time.monotonic

    # -------------------------------------------------------------------------------- construction
    @classmethod
    def from_environment(cls, pool_size: int = 8, timeout: float = 30.0, **kw: Any) -> Kube:
        """In-cluster service account when running in a pod, otherwise ``KUBECONFIG`` (or ~/.kube/config)."""
        cfg = kclient.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
            kconfig.load_incluster_config(client_configuration=cfg)
        else:
            kconfig.load_kube_config(client_configuration=cfg)
        return cls(cfg, pool_size=pool_size, timeout=timeout, **kw)

    @classmethod
    def from_kubeconfig(cls, path: str | Path, pool_size: int = 8, timeout: float = 30.0, **kw: Any) -> Kube:
        """A kubeconfig file's current context (client certificate, token or exec plugin)."""
        cfg = kclient.Configuration()
        kconfig.load_kube_config(config_file=str(path), client_configuration=cfg)
        return cls(cfg, pool_size=pool_size, timeout=timeout, **kw)

    @classmethod
    def for_host(cls, host: str, token: str | None = None, **kw: Any) -> Kube:
        """A plain URL with an optional bearer token (tests, ``kubectl proxy``)."""
        cfg = kclient.Configuration(host=host)
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cls(cfg, **kw)

    def close(self) -> None:
        self.api_client.close()

    # -------------------------------------------------------------------------------- discovery
    @property
    def dynamic(self) -> DynamicClient:
        """The dynamic client, made on first use (its discovery asks the server for /version, /apis)."""
        dyn = self._dynamic
        if dyn is None:
            with self._lock:
                if self._dynamic is None:
                    try:
                        made = _DynamicClient(
                            self.api_client, cache_file=_NO_CACHE_FILE, discoverer=_InMemoryDiscoverer
                        )
                    except ApiException as e:
                        raise KubeError.from_api_exception(e, "GET", "/apis (discovery)") from None
                    made.request_timeout = self._timeout
                    self._dynamic = made
                dyn = self._dynamic
        return dyn

    def resource(self, rt: ResourceType, sub: str | None = None) -> Any:
        """The dynamic ``Resource`` (or ``Subresource``) of a kind, memoized; a 404 :class:`KubeError`
        when the server does not serve it (discovery is refreshed once before saying so)."""
        key = (rt.api_version, rt.kind, sub)
        res = self._resources.get(key)
        if res is not None:
            return res
        missed = self._missing.get(key[:2])
        if missed is not None and self._clock() - missed < MISS_TTL:
            raise _not_served(rt)
        dyn = self.dynamic
        with self._lock:  # the discoverer is not thread-safe (a miss rebuilds its cache)
            try:
                # LazyDiscoverer.search invalidates its cache and searches again on a miss: a CRD
                # installed after this client was made is found on the first call after MISS_TTL
                res = dyn.resources.get(api_version=rt.api_version, kind=rt.kind)
            except ResourceNotFoundError:
                self._missing[key[:2]] = self._clock()
                raise _not_served(rt) from None
            except ApiException as e:  # discovery itself refused (403, 5xx after the retries)
                raise KubeError.from_api_exception(e, "GET", f"{rt.path()} (discovery)") from None
            self._missing.pop(key[:2], None)
            if sub is not None:
                parent = res
                res = parent.subresources.get(sub)
                if res is None:
                    raise KubeError(
                        404,
                        {"reason": "NotFound", "message": f"{rt.kind} has no subresource {sub}"},
                        "DISCOVER",
                        rt.path(sub=sub),
                    )
            self._resources[key] = res
        return res

    # -------------------------------------------------------------------------------- transport
    def _call(self, method: str, path: str, fn: Any, *args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, serializer=_as_is, **kw)
        except ApiException as e:
            raise KubeError.from_api_exception(e, method, path) from None

    # -------------------------------------------------------------------------------- reads
    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        metrics.READS.labels(kind=rt.kind, verb="get").inc()
        try:
            res = self.resource(rt)
            return self._call(
                "GET", rt.path(namespace, name), self.dynamic.get, res, name=name, namespace=namespace
            )
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    def list_with_rv(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None, verb: str = "list"
    ) -> tuple[list[dict[str, Any]], str | None]:
        """:meth:`list`, and the list's ``metadata.resourceVersion``: the point in time every page shows
        (later pages are served at the first one's), which tells what was deleted before it from what
        was created after it. ``verb`` labels the request in ``modeldeploy_reads_total`` (the resync's
        LISTs are not a reconcile's)."""
        metrics.READS.labels(kind=rt.kind, verb=verb).inc()
        res = self.resource(rt)
        out: list[dict[str, Any]] = []
        cont: str | None = None
        rv: str | None = None
        while True:
            page = self._call(
                "GET",
                rt.path(namespace),
                self.dynamic.get,
                res,
                namespace=namespace,
                label_selector=label_selector,
                limit=500,
                _continue=cont,
            )
            for item in page.get("items") or []:
                item.setdefault("apiVersion", rt.api_version)
                item.setdefault("kind", rt.kind)
                out.append(item)
            meta = page.get("metadata") or {}
            rv = rv or meta.get("resourceVersion")
            cont = meta.get("continue")
            if not cont:
                return out, rv

    def list(
        self, rt: ResourceType, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        return self.list_with_rv(rt, namespace, label_selector)[0]

    # -------------------------------------------------------------------------------- writes
    def apply(self, obj: dict[str, Any], field_manager: str, force: bool = True) -> dict[str, Any]:
        """Server-side apply of a whole object (the field manager owns exactly what ``obj`` holds)."""
        rt = resource_type_of(obj)
        meta = obj["metadata"]
        metrics.WRITES.labels(kind=rt.kind, verb="apply").inc()
        return self._call(
            "PATCH",
            rt.path(meta.get("namespace"), meta["name"]),
            self.dynamic.server_side_apply,
            self.resource(rt),
            body=obj,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=field_manager,
            force_conflicts=True if force else None,
        )

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        rt = resource_type_of(obj)
        ns = obj["metadata"].get("namespace")
        metrics.WRITES.labels(kind=rt.kind, verb="create").inc()
        return self._call("POST", rt.path(ns), self.dynamic.create, self.resource(rt), body=obj, namespace=ns)

    def delete(self, rt: ResourceType, namespace: str | None, name: str, uid: str | None = None) -> bool:
        """Delete (background propagation); False when it was already gone (or the uid is another's)."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        metrics.WRITES.labels(kind=rt.kind, verb="delete").inc()
        try:
            self._call(
                "DELETE",
                rt.path(namespace, name),
                self.dynamic.delete,
                self.resource(rt),
                name=name,
                namespace=namespace,
                body=body,
            )
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
        return self._call(
            "PATCH",
            rt.path(namespace, name, sub),
            self.dynamic.patch,
            self.resource(rt, sub),
            body=patch,
            name=name,
            namespace=namespace,
            content_type=content_type,
        )

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

    # -------------------------------------------------------------------------------- by path
    # The local cluster's tooling addresses objects by REST path (nodes, CRDs, EndpointSlices, whatever a
    # manifest holds); these go through the same ApiClient, retries, errors and counters.
    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str | None = None,
        params: Mapping[str, Any] | None = None,
        ok_missing: bool = False,
    ) -> dict[str, Any] | None:
        """One request to a REST path; the parsed answer (``{}`` when it is not a JSON object), or None
        for a 404 when ``ok_missing``."""
        method = method.upper()
        verb = {"GET": "get", "POST": "create", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}
        label = (_plural_of(path), verb.get(method, method.lower()))
        (metrics.READS if method == "GET" else metrics.WRITES).labels(kind=label[0], verb=label[1]).inc()
        query = [(k, v) for k, v in (params or {}).items() if v is not None]
        kw: dict[str, Any] = {"query_params": query}
        if content_type:
            kw["content_type"] = content_type
        try:
            answer = self._call(method, path, self.dynamic.request, method, path, body=body, **kw)
        except KubeError as e:
            if ok_missing and e.status == 404:
                return None
            raise
        return answer if isinstance(answer, dict) else {}

    def watch(
        self,
        path: str,
        resource_version: str,
        timeout_s: int = 60,
        params: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Yield the raw watch events (``{"type", "object"}``, BOOKMARK and ERROR included) of a
        collection path from ``resource_version`` until the server closes the stream."""
        metrics.READS.labels(kind=_plural_of(path), verb="watch").inc()
        query: list[tuple[str, Any]] = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(timeout_s)),
        ]
        query += [(k, v) for k, v in (params or {}).items() if v is not None]
        try:
            resp = self.dynamic.request(
                "GET", path, query_params=query, serialize=False, _request_timeout=(10.0, timeout_s + 10)
            )
        except ApiException as e:
            raise KubeError.from_api_exception(e, "WATCH", path) from None
        try:
            for line in iter_resp_lines(resp):
                if line:
                    yield json.loads(line)
        finally:  # as kubernetes.watch does: a stream left early must not go back to the pool unread
            resp.close()
            resp.release_conn()
