"""A little world for progressive-delivery tests: the fake apiserver, a fake clock, a fake Prometheus,
and the ReplicaSet controller and kubelet reduced to what the rollout logic sees."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from md_cases import BASE_MD
from md_fakekube import FakeKube
from modeldeploy import builders as b
from modeldeploy.analysis import (
    AGREEMENT,
    CLIENT_ERRORS,
    ERROR_RATE,
    P99,
    RATIO,
    REQUESTS,
    SAMPLES,
    SHADOW_ERROR_RATE,
    Sample,
)
from modeldeploy.api import ModelDeployment
from modeldeploy.reconciler import Reconciler

T0 = datetime(2026, 1, 1, tzinfo=UTC)
GOOD = {
    REQUESTS: 200.0,
    ERROR_RATE: 0.0,
    CLIENT_ERRORS: 0.0,
    P99: 20.0,
    RATIO: 1.0,
    # shadow stage: every stable server (2 in canary_md) copies; the copies agree
    "copying": 2.0,
    SAMPLES: 500.0,
    AGREEMENT: 1.0,
    SHADOW_ERROR_RATE: 0.0,
    "live-samples": 100.0,
    "live-agreement": 1.0,
}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def tick(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class FakePrometheus:
    """Answers each check from ``values[revision][metric]`` (default: a healthy revision);
    ``down`` makes every query fail like an unreachable Prometheus. Records every query."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, float | None]] = {}
        self.down = False
        self.queries: list[tuple[str, str, str]] = []  # (revision, metric, promql)

    def measure(self, queries):
        out = []
        for q in queries:
            self.queries.append((q.revision, q.metric, q.promql))
            if self.down:
                out.append(Sample(q, None, error="ConnectionError: refused"))
                continue
            vals = {**GOOD, **self.values.get(q.revision, {})}
            out.append(Sample(q, vals.get(q.metric)))
        return out

    def windows(self, revision: str) -> int:
        return sum(1 for r, m, _ in self.queries if r == revision and m == REQUESTS)


class Immediate:
    """The reconciler's measurements answered at once from a :class:`FakePrometheus` (the real runner
    answers on a later reconcile; ``pending`` plays that: requests are refused until it is cleared)."""

    def __init__(self, prom: FakePrometheus) -> None:
        self.prom = prom
        self.pending = False
        self.requests: list[tuple[str, float]] = []  # (url, timeout) of every request

    def request(self, key, url, timeout, queries):
        self.requests.append((url, timeout))
        return None if self.pending else self.prom.measure(queries)

    def latest(self, key, url, timeout, query, refresh):
        return None if self.pending else self.prom.measure([query])[0]


def canary_md(**rollout: Any) -> dict[str, Any]:
    body = copy.deepcopy(BASE_MD)
    body["spec"]["replicas"] = rollout.pop("replicas", 2)
    body["spec"]["rollout"] = {
        "steps": [25, 50, 100],
        "interval": "10s",
        "bakeTime": "30s",
        "keepPrevious": {"replicas": 1, "ttl": "5m"},
        **rollout,
    }
    return body


class World:
    def __init__(self, body: dict[str, Any] | None = None) -> None:
        self.fake = FakeKube()
        self.fake.put(body or canary_md())
        self.clock = Clock()
        self.prom = FakePrometheus()
        self.measurements = Immediate(self.prom)
        self.rec = self.new_operator()
        self.pod_serial = 0

    def new_operator(self) -> Reconciler:
        """A fresh operator (as after a restart): nothing but what is stored in the apiserver."""
        return Reconciler(self.fake, clock=self.clock, measurements=self.measurements)  # type: ignore[arg-type]

    # -- the object
    @property
    def raw(self) -> dict[str, Any]:
        return self.fake.obj("ModelDeployment", "minilm")  # type: ignore[return-value]

    @property
    def status(self) -> dict[str, Any]:
        return self.raw.get("status") or {}

    def revision(self) -> str:
        return b.spec_revision(ModelDeployment.from_api(self.raw).spec)

    def edit(self, **spec: Any) -> str:
        self.raw["spec"].update(spec)
        self.raw["metadata"]["generation"] += 1
        return self.revision()

    def new_version(self, version: str) -> str:
        return self.edit(model={"name": "minilm", "version": version, "uri": f"file:///models/v{version}"})

    def annotate(self, key: str, value: str | None) -> None:
        ann = self.raw["metadata"].setdefault("annotations", {})
        if value is None:
            ann.pop(key, None)
        else:
            ann[key] = value

    def cond(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.status["conditions"] if c["type"] == type_)

    # -- the cluster's controllers
    def pods(self, revision: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.fake.of_kind("Pod")
            if revision is None or p["metadata"]["labels"][b.LABEL_REVISION] == revision
        ]

    def pods_in_traffic(self, revision: str) -> int:
        return sum(1 for p in self.pods(revision) if _cond(p, "Ready") == "True")

    def gated(self, revision: str) -> dict[str, str | None]:
        return {p["metadata"]["name"]: _cond(p, b.READINESS_GATE) for p in self.pods(revision)}

    def endpoint_slices(self) -> None:
        """The EndpointSlice controller: one slice per Service, with the Service's labels, an endpoint per
        selected pod, serving when the pod is Ready, ready then too or when the Service publishes not-ready
        addresses. It runs
        before the kubelet's step in :meth:`controllers`, so a slice shows a pod's readiness one round
        after the pod's own status does -- as the real controller writes it a moment after the kubelet."""
        for svc in self.fake.of_kind("Service"):
            name, spec = svc["metadata"]["name"], svc["spec"]
            selector = spec.get("selector") or {}
            pods = [p for p in self.pods() if selector.items() <= p["metadata"]["labels"].items()]
            publish = spec.get("publishNotReadyAddresses") is True
            endpoints = [
                {
                    "addresses": [f"10.244.0.{i + 10}"],
                    "conditions": {
                        "ready": publish or _cond(p, "Ready") == "True",
                        "serving": _cond(p, "Ready") == "True",
                    },
                    "targetRef": {"kind": "Pod", "name": p["metadata"]["name"]},
                }
                for i, p in enumerate(pods)
            ]
            labels = {**svc["metadata"].get("labels", {}), "kubernetes.io/service-name": name}
            self.fake.put(
                {
                    "apiVersion": "discovery.k8s.io/v1",
                    "kind": "EndpointSlice",
                    "metadata": {"name": f"{name}-slice", "labels": labels},
                    "endpoints": endpoints,
                }
            )
        for sl in self.fake.of_kind("EndpointSlice"):
            service = sl["metadata"]["labels"]["kubernetes.io/service-name"]
            if self.fake.obj("Service", service) is None:
                self.fake.objects.pop(("EndpointSlice", "default", sl["metadata"]["name"]))

    def controllers(self) -> None:
        """ReplicaSets create/delete pods to match each Deployment (pods start ready); pods of deleted
        Deployments go; the EndpointSlice controller writes what it saw; the kubelet computes Ready from
        containers and the readiness gate."""
        deps = {
            d["metadata"]["labels"][b.LABEL_REVISION]: d["spec"]["replicas"]
            for d in self.fake.of_kind("Deployment")
        }
        for p in self.pods():
            rev = p["metadata"]["labels"][b.LABEL_REVISION]
            if rev not in deps:
                self.fake.objects.pop(("Pod", "default", p["metadata"]["name"]))
        for rev, want in deps.items():
            have = self.pods(rev)
            # the ReplicaSet deletes not-ready pods first (by the Ready it last saw: the kubelet's step
            # below has not yet followed a gate the operator just set), then in an order of its own --
            # here by name, the order in which the operator keeps pods in traffic, so that the two collide
            have.sort(key=lambda p: (_cond(p, "Ready") == "True", p["metadata"]["name"]))
            for p in have[: max(0, len(have) - want)]:
                self.fake.objects.pop(("Pod", "default", p["metadata"]["name"]))
            for _ in range(want - len(have)):
                self.pod_serial += 1
                self.fake.put(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {
                            "name": f"minilm-{rev}-{self.pod_serial:03d}",
                            "labels": {b.LABEL_NAME: "minilm", b.LABEL_REVISION: rev},
                        },
                        "spec": {"nodeName": "gpu-node-0"},
                        "status": {
                            "phase": "Running",
                            "conditions": [
                                {"type": "PodScheduled", "status": "True"},
                                {"type": "ContainersReady", "status": "True"},
                            ],
                        },
                    }
                )
        self.endpoint_slices()
        for p in self.pods():
            conds = {c["type"]: c for c in p["status"]["conditions"]}
            ready = (
                conds.get("ContainersReady", {}).get("status") == "True"
                and conds.get(b.READINESS_GATE, {}).get("status") == "True"
            )
            conds["Ready"] = {"type": "Ready", "status": "True" if ready else "False"}
            p["status"]["conditions"] = list(conds.values())

    def reconcile(self, rounds: int = 3) -> None:
        """A few reconciles with the controllers acting in between (what watch events would cause)."""
        for _ in range(rounds):
            self.rec.reconcile("default", "minilm")
            self.controllers()

    def run_for(self, seconds: float, step: float = 1.0) -> None:
        """Let time pass, reconciling every ``step`` seconds (a timer or an event would do it)."""
        t = 0.0
        while t < seconds:
            self.clock.tick(step)
            t += step
            self.reconcile(rounds=2)

    def deploy_first(self) -> str:
        self.reconcile()
        return self.revision()

    def event_reasons(self) -> list[str]:
        return [e["reason"] for e in self.fake.events]


def _cond(pod: dict[str, Any], type_: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == type_), None)


def watch_the_route(w: World, lag: float = 0.0) -> list[str]:
    """After every reconcile and every controllers' round of ``w``, check what a gateway would meet: each
    backend the route weights has a ready, serving endpoint in its Service's EndpointSlices at that moment
    (Traefik answers 503 for one without). ``lag``: the gateway may still route by a route that was
    replaced up to ``lag`` seconds (of ``w.clock``) ago -- it reloads its configuration after a watch event
    and a throttle (Traefik: ``providersThrottleDuration``, 2 s by default) -- so the backends of those
    routes are checked too. Returns the violations seen (empty: none)."""
    violations: list[str] = []
    reconcile, controllers = w.rec.reconcile, w.controllers
    seen: list[tuple[Any, list[tuple[str, int]]]] = []  # (replaced at, or None: current; its backends)

    def backends(route: dict[str, Any]) -> list[tuple[str, int]]:
        rules = route["spec"]["rules"]
        return [(ref["name"], ref["weight"]) for rule in rules for ref in rule["backendRefs"]]

    def check(when: str) -> None:
        route = w.fake.obj("HTTPRoute", "minilm")
        if route is None:
            return
        now = backends(route)
        if not seen or seen[-1][1] != now:
            if seen:
                seen[-1] = (w.clock.now, seen[-1][1])
            seen.append((None, now))
        t = w.clock.now
        live = [refs for replaced, refs in seen if replaced is None or (t - replaced).total_seconds() < lag]
        for name, weight in {ref for refs in live for ref in refs}:
            if weight == 0:
                continue
            sl = w.fake.obj("EndpointSlice", f"{name}-slice")
            ready = [
                ep
                for ep in (sl or {}).get("endpoints", [])
                if ep["conditions"]["ready"] and ep["conditions"]["serving"]
            ]
            if not ready:
                violations.append(f"{when}: {name} weighted {weight} without a ready endpoint")

    def checked_reconcile(ns: str, name: str) -> Any:
        out = reconcile(ns, name)
        check("after a reconcile")
        return out

    def checked_controllers() -> None:
        controllers()
        check("after the controllers")

    w.rec.reconcile = checked_reconcile  # type: ignore[method-assign]
    w.controllers = checked_controllers  # type: ignore[method-assign]
    return violations
