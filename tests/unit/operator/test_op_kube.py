"""The thin REST client against a tiny local HTTP server: paths, apply, pagination, errors."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
from modeldeploy import kube as k


class Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict]] = []

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
            "body": json.loads(self.rfile.read(n)) if n else None,
        }
        Handler.seen.append(rec)
        return rec

    def do_GET(self) -> None:
        rec = self._record()
        if rec["path"].endswith("/missing"):
            return self._reply(404, {"kind": "Status", "message": "not found"})
        if rec["path"] == "/api/v1/namespaces/ns/pods":
            if "continue" not in rec["query"]:
                return self._reply(
                    200, {"items": [{"metadata": {"name": "a"}}], "metadata": {"continue": "t"}}
                )
            return self._reply(200, {"items": [{"metadata": {"name": "b"}}], "metadata": {}})
        return self._reply(200, {"metadata": {"name": "x"}})

    def do_PATCH(self) -> None:
        rec = self._record()
        if rec["path"].endswith("/conflict/status"):
            return self._reply(409, {"kind": "Status", "message": "the object has been modified"})
        return self._reply(200, rec["body"])

    def do_DELETE(self) -> None:
        self._record()
        self._reply(404, {"message": "gone"})


@pytest.fixture
def client():
    Handler.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield k.Kube(f"http://127.0.0.1:{server.server_address[1]}", token="tkn")
    finally:
        server.shutdown()


def test_paths():
    assert k.DEPLOYMENT.path("ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert k.POD.path("ns", "p", "status") == "/api/v1/namespaces/ns/pods/p/status"
    assert k.CLUSTER_PEERING.path(None, "x") == "/apis/kopf.dev/v1/clusterkopfpeerings/x"
    assert k.MODELDEPLOYMENT.path("ns") == "/apis/modeldeploy.io/v1alpha1/namespaces/ns/modeldeployments"


def test_get_and_missing(client):
    assert client.get(k.SERVICE, "ns", "s") == {"metadata": {"name": "x"}}
    assert client.get(k.SERVICE, "ns", "missing") is None
    assert Handler.seen[0]["auth"] == "Bearer tkn"


def test_list_follows_continue_and_fills_kind(client):
    items = client.list(k.POD, "ns", "modeldeploy.io/name=m")
    assert [i["metadata"]["name"] for i in items] == ["a", "b"]
    assert items[0]["kind"] == "Pod" and items[0]["apiVersion"] == "v1"
    assert Handler.seen[0]["query"]["labelSelector"] == ["modeldeploy.io/name=m"]


def test_apply_is_a_server_side_apply_patch(client):
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ns"}}
    assert client.apply(obj, "modeldeploy") == obj
    rec = Handler.seen[-1]
    assert rec["method"] == "PATCH" and rec["path"] == "/api/v1/namespaces/ns/services/s"
    assert rec["content_type"] == "application/apply-patch+yaml"
    assert rec["query"] == {"fieldManager": ["modeldeploy"], "force": ["true"]}


def test_errors_carry_status_and_message(client):
    with pytest.raises(k.KubeError) as e:
        client.merge_patch(k.MODELDEPLOYMENT, "ns", "conflict", {"status": {}}, sub="status")
    assert e.value.status == 409 and "modified" in e.value.message
    assert Handler.seen[-1]["content_type"] == "application/merge-patch+json"
    assert client.delete(k.DEPLOYMENT, "ns", "gone", uid="u") is False
    assert Handler.seen[-1]["body"]["preconditions"] == {"uid": "u"}


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
