"""Support for the progressive-delivery e2e tests: ModelDeployments of the built-in noop model with
knobs (a good revision, one failing a share of inputs, a slow one, one that fails on a marker text),
and a bounded load generator that sends traffic the way a client of the cluster would.

Routing of the load generator:

* ``replicas`` mode: like kube-proxy, each request goes to a random *ready* endpoint of the model
  Service's EndpointSlices (refreshed every 100 ms) -- so the canary's share is what the operator's
  readiness gates make it;
* ``gatewayAPI`` mode: there is no gateway data plane in the local cluster, so the load generator plays
  the gateway: it reads the HTTPRoute's weighted backendRefs, picks a backend by weight, then a random
  ready endpoint of that revision Service's EndpointSlices.

It is bounded both by a request count and by wall time, and only talks to pod IPs (the local pod
network). Every attempt is recorded: time, pod IP, revision of that pod, HTTP status and the
``model_version`` of the answer. An attempt that finds no ready endpoint is a failure of its own kind
(``no_endpoint``), not a pause; 4xx answers are failures too (counted apart: the inputs are valid).
Nothing is swallowed: a worker that dies, or routing that could not be refreshed for longer than
:data:`STALE_ROUTING_S`, makes :meth:`LoadGenerator.stop` raise :class:`LoadGeneratorError`.
"""

from __future__ import annotations

import math
import random
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from localcluster.testing import Kube

GROUP_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
POISON = "POISON"
#: routing older than this (consecutive refresh failures) fails the load generator
STALE_ROUTING_S = 2.0
#: code recorded for an attempt that found no ready endpoint (0 is a connection error)
NO_ENDPOINT = -1


class LoadGeneratorError(AssertionError):
    """The load generator itself failed (a worker died, routing went stale): its records can't be trusted."""


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
    ip: str  # "" when no endpoint was ready
    revision: str | None  # of the pod that answered (from its labels)
    code: int  # HTTP status; 0: connection error; NO_ENDPOINT: nothing to send to
    version: str | None = None  # model_version in the answer's body (200 only)

    @property
    def kind(self) -> str:
        """ok | http_4xx | http_5xx | connection_error | no_endpoint"""
        if self.code == 200:
            return "ok"
        if self.code == NO_ENDPOINT:
            return "no_endpoint"
        if self.code == 0:
            return "connection_error"
        return "http_4xx" if 400 <= self.code < 500 else "http_5xx"


@dataclass
class Routing:
    """What the load generator routes over, refreshed from the apiserver."""

    endpoints: dict[str, list[str]] = field(default_factory=dict)  # revision (or "*") -> ready IPs
    weights: list[tuple[str, int]] = field(default_factory=list)  # gatewayAPI: (revision, weight)
    ip_revision: dict[str, str] = field(default_factory=dict)


class LoadGenerator:
    """Bounded closed-loop load: ``workers`` threads, each with a pause between requests."""

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
    ) -> None:
        self.kube, self.ns, self.name, self.mode = kube, ns, name, mode
        self.max_requests, self.max_seconds = max_requests, max_seconds
        self.workers, self.pause = workers, pause
        self.poison_share = poison_share
        self.records: list[Record] = []
        self.routing = Routing()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._sent = 0
        self.started = 0.0
        self.errors: list[str] = []  # tracebacks of dead workers, stale routing
        self.refresh_errors = 0  # transient (routing kept, younger than STALE_ROUTING_S)
        self._refreshed_at = 0.0

    # -- routing
    def _slices(self, service: str) -> list[str]:
        slices = (
            self.kube.api.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices",
                params={"labelSelector": f"kubernetes.io/service-name={service}"},
            )
            or {}
        )
        return sorted(
            addr
            for s in slices.get("items", [])
            for ep in s.get("endpoints") or []
            if (ep.get("conditions") or {}).get("ready")
            for addr in ep["addresses"]
        )

    def refresh(self) -> None:
        pods = self.kube.pods(self.ns, f"modeldeploy.io/name={self.name}")
        ip_rev = {
            p["status"]["podIP"]: p["metadata"]["labels"]["modeldeploy.io/revision"]
            for p in pods
            if (p.get("status") or {}).get("podIP")
        }
        r = Routing(ip_revision={**self.routing.ip_revision, **ip_rev})
        if self.mode == "gatewayAPI":
            route = self.kube.get(
                f"/apis/gateway.networking.k8s.io/v1/namespaces/{self.ns}/httproutes/{self.name}"
            )
            refs = (route or {}).get("spec", {}).get("rules", [{}])[0].get("backendRefs", [])
            for ref in refs:
                rev = ref["name"][len(self.name) + 1 :]
                r.weights.append((rev, int(ref.get("weight", 1))))
                r.endpoints[rev] = self._slices(ref["name"])
        else:
            r.endpoints["*"] = self._slices(self.name)
        self.routing = r

    def pick(self, rnd: random.Random) -> tuple[str | None, str | None]:
        """(revision routed to, ready endpoint IP): the IP is None when that backend has no ready
        endpoint; the revision is None in ``replicas`` mode (the Service spans every revision)."""
        r = self.routing
        if self.mode == "gatewayAPI":
            total = sum(w for _, w in r.weights)
            if total <= 0:
                return None, None
            x = rnd.uniform(0, total)
            for rev, w in r.weights:
                x -= w
                if x <= 0:
                    ips = r.endpoints.get(rev) or []
                    return rev, rnd.choice(ips) if ips else None
            return None, None
        ips = r.endpoints.get("*") or []
        return None, rnd.choice(ips) if ips else None

    # -- load
    def _refresher(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
                self._refreshed_at = time.monotonic()
            except Exception:
                # keep the last routing for a moment (a transient apiserver error), never longer
                stale = time.monotonic() - self._refreshed_at
                with self._lock:
                    self.refresh_errors += 1
                    if stale > STALE_ROUTING_S:
                        self.errors.append(f"routing stale for {stale:.1f}s:\n{traceback.format_exc()}")
                        self._stop.set()
            self._stop.wait(0.1)

    def _guarded(self, seed: int) -> None:
        try:
            self._worker(seed)
        except BaseException:
            with self._lock:
                self.errors.append(f"worker {seed} died:\n{traceback.format_exc()}")

    def _record(self, rec: Record) -> None:
        with self._lock:
            self.records.append(rec)

    def _worker(self, seed: int) -> None:
        rnd = random.Random(seed)
        with httpx.Client(timeout=5) as client:
            i = 0
            while not self._stop.is_set():
                with self._lock:
                    if self._sent >= self.max_requests or time.monotonic() - self.started > self.max_seconds:
                        return
                    self._sent += 1
                routed, ip = self.pick(rnd)
                if ip is None:  # revision: the backend the route chose, if any
                    self._record(Record(time.monotonic(), "", routed, NO_ENDPOINT))
                    time.sleep(0.05)
                    continue
                i += 1
                text = f"request {seed}-{i} {rnd.random():.6f}"
                if self.poison_share and rnd.random() < self.poison_share:
                    text += f" {POISON}"
                body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]}
                version = None
                try:
                    resp = client.post(f"http://{ip}:8080/v2/models/echo/infer", json=body)
                    code = resp.status_code
                    if code == 200:
                        version = resp.json().get("model_version")
                except httpx.HTTPError:
                    code = 0
                self._record(Record(time.monotonic(), ip, self.routing.ip_revision.get(ip), code, version))
                if self.pause:
                    time.sleep(self.pause)

    def start(self) -> LoadGenerator:
        self.started = time.monotonic()
        self.refresh()
        self._refreshed_at = time.monotonic()
        self._threads = [threading.Thread(target=self._refresher, daemon=True)]
        self._threads += [
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
        """Stop and join; raises :class:`LoadGeneratorError` if a worker died or routing went stale."""
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

    def by_revision(self, since: float = 0.0) -> Counter[str | None]:
        """Answers (any status) by the revision of the pod that gave them; attempts with no endpoint are
        in :meth:`by_kind`."""
        return Counter(r.revision for r in self.snapshot(since) if r.kind != "no_endpoint")

    def by_kind(self, since: float = 0.0) -> Counter[str]:
        """Attempts by outcome: ok, http_4xx, http_5xx, connection_error, no_endpoint."""
        return Counter(r.kind for r in self.snapshot(since))

    def failed_share(self, since: float = 0.0) -> float:
        """Share of attempts not answered 200 (4xx, 5xx, connection errors and no ready endpoint alike)."""
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


def md_status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return (kube.get(GROUP_PATH.format(ns=ns, name=name)) or {}).get("status") or {}


def events(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items = (kube.get(f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [e for e in items if e.get("involvedObject", {}).get("name") == name]


def pids(kube: Kube, ns: str, name: str, revision: str) -> dict[str, tuple[str, int]]:
    """pod -> (containerID "process://PID", restartCount) of one revision's pods."""
    out = {}
    for p in kube.pods(ns, f"modeldeploy.io/name={name},modeldeploy.io/revision={revision}"):
        cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
        out[p["metadata"]["name"]] = (cs.get("containerID", ""), int(cs.get("restartCount", 0)))
    return out


def start_operator(kube: Kube, log_path: Any) -> Any:
    """Another operator process (standalone), for the crash tests; returns the Popen."""
    from pathlib import Path

    from .conftest import start_operator as start

    return start(kube, Path(log_path))[0]
