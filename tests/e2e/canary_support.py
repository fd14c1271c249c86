"""Support for the progressive-delivery e2e tests: ModelDeployments of the built-in noop model with
knobs (a good revision, one failing a share of inputs, a slow one, one that fails on a marker text),
and a bounded load generator that sends traffic the way a client of the cluster does.

Where the load generator sends (nothing of the routing is computed here):

* ``replicas`` mode: to the model Service's ClusterIP (kube-proxy picks a ready endpoint per
  connection), one connection per request, so every request is balanced anew -- the canary's share is
  what the operator's readiness gates make it;
* ``gatewayAPI`` mode: to the cluster's Gateway (Traefik, ``Cluster.gateway_url``), with the Host header
  set to the route's first hostname (from the ModelDeployment's spec, as a client is configured),
  keep-alive -- the HTTPRoute's weights are applied by the gateway, per request.

Which revision answered is what the answer says: every server sends ``x-modeldeploy-revision`` (the
operator sets MODELDEPLOY_REVISION on its container). It is bounded both by a request count and by wall
time. Every attempt is recorded: time, the revision that answered (None when no server did: the
gateway's own 503, a refused connection), HTTP status and the ``model_version`` of the answer. Failures
are what the data plane gives: a Service with no ready endpoint refuses the connection
(``connection_error``), a route to a backend with no ready endpoint is the gateway's 503 (``http_5xx``
with no revision); 4xx answers are failures too (counted apart: the inputs are valid). Nothing is
swallowed: a worker that dies makes :meth:`LoadGenerator.stop` raise :class:`LoadGeneratorError`.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from localcluster.kubeapi import service_url
from localcluster.operator_process import OperatorProcess
from localcluster.state import REPO_ROOT
from localcluster.testing import Kube, wait_for

GROUP_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
POISON = "POISON"
#: the header every model server answers with: the revision of the pod that answered
REVISION_HEADER = "x-modeldeploy-revision"
#: by_revision's key for attempts no model server answered
NO_REVISION = "(none)"
#: the Gateway of the local cluster (``make cluster-up`` creates it): routes in gatewayAPI mode attach to it
GATEWAY_PARENT = {"name": "public-gateway", "namespace": "gateway-system"}


def _netns_out(net: Any, *argv: str) -> str:
    res = subprocess.run([*net.exec_prefix(), *argv], capture_output=True, text=True, timeout=10)
    return res.stdout


def _data_plane_lines(net: Any, url: str, service: str) -> list[str]:
    """Inside the pod network at an ENETUNREACH: the conntrack entries to the Service's ClusterIP (their
    state and the endpoint they were translated to), the endpoints kube-proxy's rules hold for it, and
    kube-proxy's own account of how late its rules were (network programming latency, last sync)."""
    host = url.split("//", 1)[-1].split(":", 1)[0]
    out = []
    if host:
        tracked = [
            ln for ln in _netns_out(net, "cat", "/proc/net/nf_conntrack").splitlines() if f"dst={host} " in ln
        ]
        out.append(f"conntrack to {host}: {len(tracked)} entries")
        states = Counter(
            " ".join(w for w in ln.split() if w.isupper() or w.startswith("src=10.244")) for ln in tracked
        )
        out.extend(f"  {n} x {key}" for key, n in states.most_common(12))
    rules = _netns_out(net, "nft", "list", "table", "ip", "kube-proxy")
    out.append(
        "kube-proxy endpoints: "
        + " ".join(sorted({w for w in rules.split() if w.startswith("endpoint-") and service in w}))
    )
    try:
        metrics = httpx.get(f"http://{net.anchor_ip}:10249/metrics", timeout=3).text
        out.extend(
            ln
            for ln in metrics.splitlines()
            if ln.startswith(
                (
                    'kubeproxy_network_programming_duration_seconds_bucket{le="5"',
                    'kubeproxy_network_programming_duration_seconds_bucket{le="+Inf"',
                    "kubeproxy_network_programming_duration_seconds_sum",
                    "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                )
            )
        )
        out.append(f"now (wall clock): {time.time():.1f}")
    except httpx.HTTPError as exc:
        out.append(f"kube-proxy metrics: {exc}")
    return out


class LoadGeneratorError(AssertionError):
    """The load generator itself failed (a worker died): its records can't be trusted."""


def gateway_routing(ns: str, name: str, **extra: Any) -> dict[str, Any]:
    """``spec.rollout.trafficRouting`` for gatewayAPI mode on the shared Gateway: a hostname of the
    test's own (the Gateway is shared by every namespace; routes tell themselves apart by hostname)."""
    return {
        "mode": "gatewayAPI",
        "gatewayAPI": {"parentRefs": [dict(GATEWAY_PARENT)], "hostnames": [f"{name}.{ns}.test"], **extra},
    }


def noop_md(name: str, version: str, uri: str, **rollout: Any) -> dict[str, Any]:
    replicas = rollout.pop("replicas", 1)
    analysis = {
        "maxErrorRate": 0.05,
        "maxP99LatencyMs": 250,
        "minRequests": 10,
        "failureLimit": 1,
        "onNoData": "hold",
        "noDataTimeout": "60s",
        **rollout.pop("analysis", {}),
    }
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "echo", "version": version, "uri": uri, "format": "noop"},
            "replicas": replicas,
            "resources": {"cpu": "100m", "memory": "256Mi"},
            "batching": {"maxBatchSize": 8, "maxQueueDelayMs": 1},
            "rollout": {
                "steps": [25, 50, 100],
                "interval": "6s",
                "bakeTime": "40s",
                "keepPrevious": {"replicas": 1, "ttl": "10m"},
                "analysis": analysis,
                **rollout,
            },
        },
    }


@dataclass
class Record:
    t: float  # time.monotonic()
    revision: str | None  # x-modeldeploy-revision of the answer (None: no model server answered)
    code: int  # HTTP status; 0: connection error (refused, reset, timed out)
    version: str | None = None  # model_version in the answer's body (200 only)
    error: str | None = None  # connection errors: the exception (ConnectError, ReadTimeout, ...)
    latency: float = 0.0  # seconds from sending to the answer (or the error)

    @property
    def kind(self) -> str:
        """ok | http_4xx | http_5xx | connection_error"""
        if self.code == 200:
            return "ok"
        if self.code == 0:
            return "connection_error"
        return "http_4xx" if 400 <= self.code < 500 else "http_5xx"

    @property
    def sent(self) -> float:
        """When the request was sent (``t`` is when its answer, or error, came)."""
        return self.t - self.latency


class LoadGenerator:
    """Bounded closed-loop load: ``workers`` threads, each with a pause between requests (``pause`` may
    be changed while it runs: each worker reads it after every answer).

    ``url`` (and ``host``) override where requests go; by default the model Service's ClusterIP
    (``replicas``) or the cluster's Gateway with the route's hostname (``gatewayAPI``), resolved at
    :meth:`start`. Requests go to ``model``; ``filler`` is appended to every text (a longer input).
    """

    def __init__(
        self,
        kube: Kube,
        ns: str,
        name: str,
        *,
        mode: str = "replicas",
        max_requests: int = 20000,
        max_seconds: float = 240,
        workers: int = 3,
        pause: float = 0.02,
        poison_share: float = 0.0,
        url: str | None = None,
        host: str | None = None,
        headers: dict[str, str] | None = None,
        model: str = "echo",
        filler: str = "",
        client_timeout: float = 5.0,
    ) -> None:
        self.kube, self.ns, self.name, self.mode = kube, ns, name, mode
        self.client_timeout = client_timeout  # seconds before a worker gives up (a connection_error)
        self.model, self.filler = model, filler
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.workers, self.pause = workers, pause
        self.poison_share = poison_share
        self.url, self.host = url, host
        self.headers = dict(headers or {})
        self.records: list[Record] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sent = 0
        self.started = 0.0
        self.errors: list[str] = []  # tracebacks of dead workers
        self.diagnostics: list[str] = []  # the data plane at the first ENETUNREACH (_unreachable_snapshot)
        self.warmup: list[Record] = []  # wait_serving's attempts, before the load

    # -- where to
    def resolve(self) -> None:
        """The URL (and Host) a client of this routing mode uses; nothing about pods or weights."""
        if self.url is not None:
            return
        if self.mode == "gatewayAPI":
            gateway = self.kube.cluster.gateway_url
            if not gateway:
                raise LoadGeneratorError("gatewayAPI mode needs the cluster's Gateway URL (E2E_GATEWAY_URL)")
            md = self.kube.get(GROUP_PATH.format(ns=self.ns, name=self.name)) or {}
            routing = ((md.get("spec") or {}).get("rollout") or {}).get("trafficRouting") or {}
            gw = routing.get("gatewayAPI") or {}
            hostnames = gw.get("hostnames") or []
            self.url = gateway.rstrip("/")
            if self.host is None and hostnames:
                self.host = hostnames[0]
        else:
            self.url = service_url(self.kube.api, self.ns, self.name)

    # -- load
    def _guarded(self, seed: int) -> None:
        try:
            self._worker(seed)
        except BaseException:
            with self._lock:
                self.errors.append(f"worker {seed} died:\n{traceback.format_exc()}")

    def _record(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)

    def send(self, client: httpx.Client, text: str) -> Record:
        """One request; every outcome is a record (a connection error too)."""
        body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
        t0 = time.monotonic()
        try:
            resp = client.post(f"{self.url}/v2/models/{self.model}/infer", json=body)
        except httpx.HTTPError as exc:
            now = time.monotonic()
            if "Network is unreachable" in str(exc):
                self._unreachable_snapshot(now)
            return Record(now, None, 0, error=f"{type(exc).__name__}: {exc}"[:200], latency=now - t0)
        version = resp.json().get("model_version") if resp.status_code == 200 else None
        now = time.monotonic()
        return Record(now, resp.headers.get(REVISION_HEADER), resp.status_code, version, latency=now - t0)

    def _unreachable_snapshot(self, when: float) -> None:
        """The first time a request finds no route (ENETUNREACH: a ClusterIP rewritten to an address the
        pod network no longer has), what the data plane looked like: the pod network's addresses and the
        Service's endpoints. Kept in :attr:`diagnostics` for the failure message of a test."""
        with self._lock:
            if self.diagnostics:
                return
            self.diagnostics.append(f"first ENETUNREACH at t={when:.2f}")
        from localcluster.podnet import PodNetwork
        from localcluster.state import ClusterRecord

        lines = []
        try:
            rec = ClusterRecord.load(self.kube.cluster.state_dir)
            if rec is not None and rec.pod_network_index:
                net = PodNetwork(rec.pod_network_index)
                res = subprocess.run(["ip", "-n", net.netns, "-br", "addr"], capture_output=True, text=True)
                lines.append("pod network: " + " | ".join(res.stdout.split("\n")))
                lines.extend(_data_plane_lines(net, self.url or "", f"{self.ns}/{self.name}"))
            slices = self.kube.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices?labelSelector="
                f"kubernetes.io/service-name={self.name}"
            )
            for sl in (slices or {}).get("items", []):
                for ep in sl.get("endpoints") or []:
                    pod = (ep.get("targetRef") or {}).get("name")
                    lines.append(f"endpoint {ep.get('addresses')} {ep.get('conditions')} {pod}")
        except Exception as exc:  # a diagnostic must not kill the load worker
            lines.append(f"snapshot failed: {type(exc).__name__}: {exc}")
        with self._lock:
            self.diagnostics.extend(lines)

    def _worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        headers = dict(self.headers)
        if self.host:
            headers["Host"] = self.host
        if self.mode != "gatewayAPI":
            # kube-proxy balances connections, not requests: a new connection for every request
            headers["Connection"] = "close"
        with httpx.Client(timeout=self.client_timeout, headers=headers) as client:
            i = 0
            while not self._stop.is_set():
                with self._lock:
                    if self._sent >= self.max_requests or time.monotonic() - self.started > self.max_seconds:
                        return
                    self._sent += 1
                i += 1
                text = f"request {seed}-{i} {rnd.random():.6f}{self.filler}"
                if self.poison_share and rnd.random() < self.poison_share:
                    text += f" {POISON}"
                rec = self.send(client, text)
                self._record(rec)
                if rec.code == 0:
                    time.sleep(0.05)  # refused at once: do not spin
                if self.pause:
                    time.sleep(self.pause)

    def wait_serving(self, timeout: float = 30.0) -> LoadGenerator:
        """Before the load: wait until a request through the routing is answered 200. A revision's pods
        are Ready, and the ModelDeployment Healthy, a moment before kube-proxy or the gateway routes to
        them (about a second here): a client starting at once would meet refusals that say nothing about
        a rollout. Only those are waited out -- a refused connection, or an error the gateway answers
        itself (no revision header); an error a model server answered fails at once. Every attempt is
        kept in :attr:`warmup` (not in the load's records)."""
        self.resolve()
        headers = dict(self.headers)
        if self.host:
            headers["Host"] = self.host
        deadline = time.monotonic() + timeout
        last: Record | None = None
        with httpx.Client(timeout=5, headers=headers) as client:
            while time.monotonic() < deadline:
                last = self.send(client, "is anybody there")
                self.warmup.append(last)
                if last.code == 200:
                    return self
                if last.revision is not None:
                    raise LoadGeneratorError(f"{self.url}: revision {last.revision} answered {last.code}")
                time.sleep(0.1)
        raise LoadGeneratorError(f"{self.url}: not serving after {timeout:.0f}s (last: {last})")

    def start(self) -> LoadGenerator:
        self.resolve()
        self.started = time.monotonic()
        self._threads = [
            threading.Thread(target=self._guarded, args=(i,), daemon=True) for i in range(self.workers)
        ]
        for t in self._threads:
            t.start()
        return self

    def __enter__(self) -> LoadGenerator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop and join; raises :class:`LoadGeneratorError` if a worker died."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            self.errors.append(f"threads still running 10 s after stop: {alive}")
        if self.errors:
            raise LoadGeneratorError("load generator failed:\n" + "\n".join(self.errors))

    # -- what it saw
    def snapshot(self, since: float = 0.0) -> list[Record]:
        with self._lock:
            return [r for r in self.records if r.t >= since]

    def by_revision(self, since: float = 0.0) -> Counter[str]:
        """Attempts (any status) by the revision that answered; :data:`NO_REVISION`: no model server
        answered (a refused connection, the gateway's own error)."""
        return Counter(r.revision or NO_REVISION for r in self.snapshot(since))

    def by_kind(self, since: float = 0.0) -> Counter[str]:
        """Attempts by outcome: ok, http_4xx, http_5xx, connection_error."""
        return Counter(r.kind for r in self.snapshot(since))

    def failed_share(self, since: float = 0.0) -> float:
        """Share of attempts not answered 200 (4xx, 5xx and connection errors alike)."""
        recs = self.snapshot(since)
        return sum(1 for r in recs if r.kind != "ok") / len(recs) if recs else 0.0

    def answered_only_by(self, revision: str, version: str, since: float) -> list[Record]:
        """The attempts since ``since`` that were NOT answered 200 by ``revision`` with ``version``."""
        return [
            r
            for r in self.snapshot(since)
            if not (r.code == 200 and r.revision == revision and r.version == version)
        ]

    def last_seen(self, revision: str) -> float | None:
        ts = [r.t for r in self.snapshot() if r.revision == revision]
        return max(ts) if ts else None


def binomial_p_value(k: int, n: int, p: float) -> float:
    """Exact two-sided binomial test: the probability, if each of ``n`` trials succeeds with probability
    ``p``, of an outcome no more likely than ``k`` successes."""
    if n == 0:
        return 1.0
    if p <= 0.0 or p >= 1.0:
        return 1.0 if k == round(p * n) else 0.0

    def logpmf(i: int) -> float:
        return (
            math.lgamma(n + 1)
            - math.lgamma(i + 1)
            - math.lgamma(n - i + 1)
            + i * math.log(p)
            + (n - i) * math.log1p(-p)
        )

    observed = logpmf(k)
    return min(1.0, sum(math.exp(lp) for i in range(n + 1) if (lp := logpmf(i)) <= observed + 1e-9))


def write_chaos_report(figures: dict[str, Any]) -> None:
    """Merge ``figures`` into the JSON file $CHAOS_REPORT names, if any (make bench-chaos collects the
    fault-injection tests' figures there)."""
    if os.environ.get("CHAOS_REPORT"):
        path = Path(os.environ["CHAOS_REPORT"])
        old = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**old, **figures}, indent=2, sort_keys=True))


def stable_on(kube: Kube, ns: str, version: str, name: str = "echo", timeout: float = 90) -> str:
    """The stable revision once ``name`` is Healthy on model ``version`` with no canary."""

    def ok() -> str | None:
        st = md_status(kube, ns, name)
        revs = {r["revision"]: r for r in st.get("revisions", [])}
        stable = st.get("stableRevision")
        healthy = st.get("phase") == "Healthy" and not st.get("canaryRevision")
        return str(stable) if healthy and revs.get(stable, {}).get("modelVersion") == version else None

    return wait_for(ok, timeout=timeout, interval=0.2, what=f"{name} healthy on version {version}")


def next_revision(kube: Kube, ns: str, old: str, name: str = "echo") -> str:
    """The revision of ``name``'s spec once it is no longer ``old``."""
    return wait_for(
        lambda: (r := md_status(kube, ns, name).get("revision")) != old and r, timeout=30, what="new revision"
    )


def md_status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return (kube.get(GROUP_PATH.format(ns=ns, name=name)) or {}).get("status") or {}


def events(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items = (kube.get(f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [e for e in items if e.get("involvedObject", {}).get("name") == name]


def wait_for_event(kube: Kube, ns: str, name: str, reason: str, timeout: float = 30.0) -> dict[str, Any]:
    """The first Event about ``name`` with ``reason``. The operator posts Events from a thread of its own
    after the reconcile that wrote the status (``modeldeploy.events``), so one may land a moment after the
    status that caused it is visible."""
    return wait_for(
        lambda: next((e for e in events(kube, ns, name) if e["reason"] == reason), None),
        timeout=timeout,
        what=f"a {reason} event about {name}",
    )


def pids(kube: Kube, ns: str, name: str, revision: str) -> dict[str, tuple[str, int]]:
    """pod -> (containerID "process://PID", restartCount) of one revision's pods."""
    out = {}
    for p in kube.pods(ns, f"modeldeploy.io/name={name},modeldeploy.io/revision={revision}"):
        cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
        out[p["metadata"]["name"]] = (cs.get("containerID", ""), int(cs.get("restartCount", 0)))
    return out


def storage(s3: Any, **over: Any) -> dict[str, Any]:
    """``spec.model.storage`` for the cluster's object store (an ObjectStore), credentials from the
    ``s3-credentials`` Secret; ``over`` adds or replaces fields."""
    return {
        "endpoint": s3.url,
        "region": s3.region,
        "addressingStyle": "path",
        "secretRef": {"name": "s3-credentials"},
        "timeout": "2m",
        **over,
    }


def apply_crds(kube: Kube) -> None:
    """The repository's CRDs, applied and established."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    kube.api.wait_established("modeldeployments.modeldeploy.io")


def run_operator(kube: Kube, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """The body of an operator fixture: the operator out of cluster (admin credentials), live, stopped
    at the end with its log's tail on stderr."""
    op = OperatorProcess(kube.cluster, log_path)
    try:
        yield op.wait_live().proc
    finally:
        op.stop()
        sys.stderr.write(f"\n--- operator log (tail) ---\n{op.log_tail()}\n")


def start_operator(kube: Kube, log_path: Any) -> Any:
    """Another operator process (standalone), for the crash tests; returns the Popen."""
    return OperatorProcess(kube.cluster, Path(log_path)).proc
