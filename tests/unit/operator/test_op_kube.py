"""The one client (a wrapper of the dynamic client) against a tiny local HTTP apiserver: discovery,
apply, pagination, the error mapping, retries of idempotent verbs only, and the write counting."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException
from modeldeploy import kube as k
from modeldeploy import metrics


def _resources(*names: tuple[str, str, bool]) -> list[dict[str, Any]]:
    return [
        {"name": plural, "kind": kind, "namespaced": namespaced, "verbs": ["get", "list", "patch"]}
        for plural, kind, namespaced in names
    ]


DISCOVERY = {
    "/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.2"},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            *_resources(("pods", "Pod", True), ("services", "Service", True), ("events", "Event", True)),
            {"name": "pods/status", "kind": "Pod", "namespaced": True, "verbs": ["get", "patch"]},
        ],
    },
    "/apis/apps/v1": {
        "kind": "APIResourceList",
        "groupVersion": "apps/v1",
        "resources": _resources(("deployments", "Deployment", True)),
    },
    "/apis/modeldeploy.io/v1alpha1": {
        "kind": "APIResourceList",
        "groupVersion": "modeldeploy.io/v1alpha1",
        "resources": [
            *_resources(("modeldeployments", "ModelDeployment", True)),
            {"name": "modeldeployments/status", "kind": "ModelDeployment", "namespaced": True},
        ],
    },
    "/apis/keda.sh/v1alpha1": {
        "kind": "APIResourceList",
        "groupVersion": "keda.sh/v1alpha1",
        "resources": _resources(("scaledobjects", "ScaledObject", True)),
    },
}


def _group(name: str, version: str) -> dict[str, Any]:
    gv = {"groupVersion": f"{name}/{version}", "version": version}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


class Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []
    keda_installed: ClassVar[bool] = False
    fail_next: ClassVar[list[int]] = []  # statuses answered (then removed) before the real answer
    discovery_refused: ClassVar[bool] = False

    def log_message(self, *args) -> None:
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        url = urlsplit(self.path)
        rec = {
            "method": self.command,
            "path": url.path,
            "query": parse_qs(url.query),
            "content_type": self.headers.get("Content-Type"),
            "auth": self.headers.get("Authorization"),
            "agent": self.headers.get("User-Agent"),
            "body": json.loads(self.rfile.read(n)) if n else None,
        }
        Handler.seen.append(rec)
        return rec

    def _failing(self) -> bool:
        if Handler.fail_next:
            status = Handler.fail_next.pop(0)
            self._reply(status, {"kind": "Status", "code": status, "message": "try again"})
            return True
        return False

    def do_GET(self) -> None:
        rec = self._record()
        path = rec["path"]
        if path == "/apis" and Handler.discovery_refused:
            return self._reply(403, {"kind": "Status", "reason": "Forbidden", "message": "no discovery"})
        if path == "/apis":
            groups = [_group("apps", "v1"), _group("modeldeploy.io", "v1alpha1")]
            if Handler.keda_installed:
                groups.append(_group("keda.sh", "v1alpha1"))
            return self._reply(200, {"kind": "APIGroupList", "groups": groups})
        if path in DISCOVERY and (Handler.keda_installed or "keda" not in path):
            return self._reply(200, DISCOVERY[path])
        if self._failing():
            return None
        if path == "/api/v1/pods" and rec["query"].get("watch") == ["true"]:
            events = [
                {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
            ]
            data = b"".join(json.dumps(e).encode() + b"\n" for e in events)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return None
        if path.endswith("/slow"):
            time.sleep(1.0)
            with contextlib.suppress(OSError):  # the client gave up waiting and closed the connection
                self._reply(200, {})
            return None
        if path.endswith("/missing"):
            return self._reply(404, {"kind": "Status", "message": "not found", "reason": "NotFound"})
        if path == "/api/v1/namespaces/ns/pods":
            if "continue" not in rec["query"]:
                return self._reply(
                    200, {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t"}}
                )
            return self._reply(200, {"items": [{"metadata": {"name": "b"}}], "metadata": {}})
        if path == "/apis/keda.sh/v1alpha1/namespaces/ns/scaledobjects":
            return self._reply(200, {"items": [], "metadata": {}})
        return self._reply(200, {"metadata": {"name": "x"}})

    def do_PATCH(self) -> None:
        rec = self._record()
        if self._failing():
            return None
        if rec["path"].endswith("/conflict/status"):
            return self._reply(
                409, {"kind": "Status", "reason": "Conflict", "message": "the object has been modified"}
            )
        if rec["path"].startswith("/api/v1/namespaces/dying/"):
            return self._reply(
                403,
                {
                    "kind": "Status",
                    "message": 'pods "p" is forbidden: unable to create new content in namespace '
                    "dying because it is being terminated",
                    "details": {"causes": [{"type": "NamespaceTerminating"}]},
                },
            )
        return self._reply(200, rec["body"])

    def do_POST(self) -> None:
        rec = self._record()
        self._reply(201, rec["body"])

    def do_DELETE(self) -> None:
        self._record()
        self._reply(404, {"message": "gone"})


@pytest.fixture
def client():
    Handler.seen = []
    Handler.keda_installed = False
    Handler.fail_next = []
    Handler.discovery_refused = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    kube = k.Kube.for_host(f"http://127.0.0.1:{server.server_address[1]}", token="tkn")
    kube.configuration.retries.backoff_factor = 0  # no sleeping between the retries in these tests
    try:
        yield kube
    finally:
        kube.close()
        server.shutdown()


def _calls(method: str | None = None) -> list[dict]:
    """The requests that were not discovery."""
    out = [r for r in Handler.seen if r["path"] not in DISCOVERY and r["path"] != "/apis"]
    return [r for r in out if method is None or r["method"] == method]


def _value(counter: Any, **labels: str) -> float:
    return counter.labels(**labels)._value.get()


def test_paths():
    assert k.DEPLOYMENT.path("ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert k.POD.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert k.CLUSTER_PEERING.path(None, "x") == "/apis/kopf.dev/v1/clusterkopfpeerings/x"
    assert k.MODELDEPLOYMENT.path("ns") == "/apis/modeldeploy.io/v1alpha1/namespaces/ns/modeldeployments"


def test_get_and_missing(client):
    assert client.get(k.SERVICE, "ns", "s") == {"metadata": {"name": "x"}}
    assert client.get(k.SERVICE, "ns", "missing") is None
    assert _calls()[0]["path"] == "/api/v1/namespaces/ns/services/s"
    assert all(r["auth"] == "Bearer tkn" for r in Handler.seen)
    # the audit log (tests, bench-operator) tells the operator's requests by their User-Agent
    assert all(r["agent"] == "modeldeploy-operator" for r in Handler.seen)


def test_discovery_once_not_per_call(client):
    for _ in range(5):
        client.get(k.SERVICE, "ns", "s")
        client.get(k.DEPLOYMENT, "ns", "d")
    discovery = [r["path"] for r in Handler.seen if r not in _calls()]
    assert sorted(discovery) == ["/api/v1", "/apis", "/apis/apps/v1", "/version"]
    assert len(_calls()) == 10


def test_a_crd_installed_later_is_found_after_the_miss_ttl(client):
    with pytest.raises(k.KubeError) as e:
        client.list(k.SCALEDOBJECT, "ns", None)
    assert e.value.status == 404 and "ScaledObject" in e.value.message
    assert client.get(k.SCALEDOBJECT, "ns", "so") is None  # a kind not served reads as missing
    Handler.keda_installed = True  # KEDA's CRDs arrive after the client discovered the server
    now = [1000.0]
    client._clock = lambda: now[0]
    client._missing = {key: now[0] for key in client._missing}  # the misses above, on this clock
    asked = len(Handler.seen)
    with pytest.raises(k.KubeError):  # a miss is remembered for MISS_TTL: no discovery per call
        client.list(k.SCALEDOBJECT, "ns", None)
    assert len(Handler.seen) == asked
    now[0] += k.MISS_TTL
    assert client.list(k.SCALEDOBJECT, "ns", None) == []
    assert _calls()[-1]["path"] == "/apis/keda.sh/v1alpha1/namespaces/ns/scaledobjects"


def test_a_refused_discovery_is_a_kube_error_and_is_tried_again(client):
    Handler.discovery_refused = True
    with pytest.raises(k.KubeError) as e:
        client.get(k.SERVICE, "ns", "s")
    assert e.value.status == 403 and e.value.message == "no discovery"
    Handler.discovery_refused = False
    assert client.get(k.SERVICE, "ns", "s") == {"metadata": {"name": "x"}}


def test_list_follows_continue_and_fills_kind(client):
    items = client.list(k.POD, "ns", "modeldeploy.io/name=m")
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert items[0]["kind"] == "Pod" and items[0]["apiVersion"] == "v1"
    first, second = _calls()
    assert first["query"]["labelSelector"] == ["modeldeploy.io/name=m"]
    assert first["query"]["limit"] == ["500"] and second["query"]["continue"] == ["t"]


def test_apply_is_a_server_side_apply_patch(client):
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}}
    assert client.apply(obj, "modeldeploy") == obj
    rec = _calls()[-1]
    assert rec["method"] == "PATCH" and rec["path"] == "/api/v1/namespaces/ns/services/s"
    assert rec["content_type"] == "application/apply-patch+yaml"
    assert rec["query"] == {"fieldManager": ["modeldeploy"], "force": ["true"]}
    assert rec["body"] == obj


def test_patches_of_a_subresource_and_create(client):
    client.strategic_patch(k.POD, "ns", "p", {"status": {"conditions": []}}, sub="status")
    rec = _calls()[-1]
    assert rec["path"] == "/api/v1/namespaces/ns/pods/p/status"
    assert rec["content_type"] == "application/strategic-merge-patch+json"
    client.merge_patch(k.MODELDEPLOYMENT, "ns", "m", {"metadata": {"annotations": {"a": None}}})
    rec = _calls()[-1]
    assert rec["path"] == "/apis/modeldeploy.io/v1alpha1/namespaces/ns/modeldeployments/m"
    assert rec["content_type"] == "application/merge-patch+json"
    assert rec["body"] == {"metadata": {"annotations": {"a": None}}}
    ev = {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": "m.", "namespace": "ns"}}
    assert client.create(ev) == ev
    assert _calls()[-1]["method"] == "POST" and _calls()[-1]["path"] == "/api/v1/namespaces/ns/events"


def test_errors_carry_status_parsed_body_and_message(client):
    with pytest.raises(k.KubeError) as e:
        client.merge_patch(k.MODELDEPLOYMENT, "ns", "conflict", {"status": {}}, sub="status")
    assert e.value.status == 409 and "modified" in e.value.message
    assert e.value.body["reason"] == "Conflict"  # the Status, parsed
    assert e.value.method == "PATCH" and e.value.path.endswith("/modeldeployments/conflict/status")
    with pytest.raises(k.KubeError) as e:
        client.merge_patch(k.POD, "dying", "p", {"metadata": {}})
    assert e.value.status == 403 and e.value.namespace_terminating
    assert client.delete(k.DEPLOYMENT, "ns", "gone", uid="u") is False
    rec = _calls("DELETE")[-1]
    assert rec["body"]["preconditions"] == {"uid": "u"}
    assert rec["body"]["propagationPolicy"] == "Background"


def test_transient_errors_are_retried_for_reads_only(client):
    Handler.fail_next = [503, 429]
    assert client.get(k.SERVICE, "ns", "s") == {"metadata": {"name": "x"}}
    assert len(_calls("GET")) == 3  # two refusals, then the answer
    Handler.fail_next = [503]
    with pytest.raises(k.KubeError) as e:  # a PATCH is never sent twice
        client.merge_patch(k.POD, "ns", "p", {"metadata": {}})
    assert e.value.status == 503 and len(_calls("PATCH")) == 1
    Handler.fail_next = [500, 500, 500, 500]
    with pytest.raises(k.KubeError) as e:  # the retries run out: the last answer is the error
        client.get(k.SERVICE, "ns", "s")
    assert e.value.status == 500 and e.value.message == "try again"


def test_writes_and_reads_are_counted(client):
    applies = _value(metrics.WRITES, kind="Service", verb="apply")
    patches = _value(metrics.WRITES, kind="Pod/status", verb="patch")
    deletes = _value(metrics.WRITES, kind="Deployment", verb="delete")
    gets = _value(metrics.READS, kind="Service", verb="get")
    lists = _value(metrics.READS, kind="Pod", verb="list")
    client.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}}, "m")
    client.strategic_patch(k.POD, "ns", "p", {"status": {}}, sub="status")
    client.delete(k.DEPLOYMENT, "ns", "d")
    client.get(k.SERVICE, "ns", "s")
    client.list(k.POD, "ns")  # two pages, one LIST
    assert _value(metrics.WRITES, kind="Service", verb="apply") == applies + 1
    assert _value(metrics.WRITES, kind="Pod/status", verb="patch") == patches + 1
    assert _value(metrics.WRITES, kind="Deployment", verb="delete") == deletes + 1
    assert _value(metrics.READS, kind="Service", verb="get") == gets + 1
    assert _value(metrics.READS, kind="Pod", verb="list") == lists + 1


def test_by_path(client):
    assert client.request("GET", "/api/v1/namespaces/ns/services/missing", ok_missing=True) is None
    with pytest.raises(k.KubeError) as e:
        client.request("GET", "/api/v1/namespaces/ns/services/missing")
    assert e.value.status == 404 and e.value.body["reason"] == "NotFound"
    created = client.request("POST", "/api/v1/nodes", body={"metadata": {"name": "n"}})
    assert created == {"metadata": {"name": "n"}}
    client.request("GET", "/api/v1/namespaces/ns/pods", params={"labelSelector": "a=b", "limit": None})
    assert _calls()[-1]["query"] == {"labelSelector": ["a=b"]}


def test_error_mapping_of_any_api_exception():
    e = ApiException(status=422, reason="Unprocessable Entity")
    e.body = b'{"kind":"Status","reason":"Invalid","message":"spec.replicas: Invalid value"}'
    err = k.KubeError.from_api_exception(e, "PATCH", "/x")
    assert err.status == 422 and err.body["reason"] == "Invalid"
    assert err.message == "spec.replicas: Invalid value"
    assert str(err) == "PATCH /x: 422 spec.replicas: Invalid value"
    plain = k.KubeError.from_api_exception(ApiException(status=0, reason="SSLError\nbad cert"), "GET", "/")
    assert plain.status == 0 and plain.body == "SSLError\nbad cert" and not plain.namespace_terminating


def test_namespace_gone_or_terminating():
    gone = k.KubeError(
        404, {"message": 'namespaces "t" not found', "details": {"kind": "namespaces"}}, "PATCH", "/"
    )
    term = k.KubeError(
        403, {"message": "x", "details": {"causes": [{"type": "NamespaceTerminating"}]}}, "PATCH", "/"
    )
    other = k.KubeError(404, {"message": "not found", "details": {"kind": "deployments"}}, "PATCH", "/")
    assert gone.namespace_terminating and term.namespace_terminating
    assert not other.namespace_terminating


def test_a_hung_apiserver_times_out_and_the_pool_fits_the_threads():
    Handler.seen = []
    Handler.keda_installed = False
    Handler.fail_next = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kube = k.Kube.for_host(f"http://127.0.0.1:{server.server_address[1]}", pool_size=12, timeout=0.2)
    kube.configuration.retries.backoff_factor = 0
    try:
        assert kube.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] == 12
        t0 = time.monotonic()
        with pytest.raises(urllib3.exceptions.HTTPError):  # read timeouts, retried (a GET), then given up
            kube.get(k.SERVICE, "ns", "slow")
        assert time.monotonic() - t0 < 3.0
        assert len(_calls("GET")) == 3  # the first try and two read retries
    finally:
        kube.close()
        server.shutdown()


def test_watch_by_path_yields_the_raw_events(client):
    events = list(client.watch("/api/v1/pods", "5", timeout_s=7))
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "a"
    q = _calls()[-1]["query"]
    assert q["resourceVersion"] == ["5"] and q["allowWatchBookmarks"] == ["true"]
    assert q["timeoutSeconds"] == ["7"]
    stream = client.watch("/api/v1/pods", "5")
    assert next(stream)["type"] == "ADDED"
    stream.close()  # left early: the connection is closed, not handed back unread
    assert client.get(k.SERVICE, "ns", "s") == {"metadata": {"name": "x"}}
