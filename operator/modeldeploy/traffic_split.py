"""How many pods of each revision are in traffic (pure): the replica split of a canary step, the
achieved weight, and the readiness-gate flips that make it so (part of :mod:`modeldeploy.canary`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .builders import revision_service_name
from .rollout_types import Decision, Target
from .status import PodFacts, RevisionCounts


@functools.lru_cache(maxsize=4096)
def replica_split(replicas: int, weight: int) -> tuple[int, int]:
    """(canary pods, stable pods in traffic) whose share ``c / (c + s)`` is closest to ``weight`` %.

    At least one pod of each below 100 %, at most ``replicas`` of each, together at least ``replicas``
    (capacity never drops during a canary); ties go to fewer canary pods.

    Linear in ``replicas`` (four candidate ``s`` per ``c``; the unit tests check it against every pair up
    to 40 replicas), not a closed form: the bounds and the tie rule make one easy to get subtly wrong,
    and the search takes 2.5 ms at the API's 1000 replicas on this machine (0.02 ms at 10), once per
    (replicas, weight) -- the answers are cached, so the up to three calls per reconcile cost one.
    """
    if replicas <= 0:
        return 0, 0
    if weight >= 100:
        return replicas, 0
    if weight <= 0:
        return 0, replicas
    best: tuple[float, int, int, int] | None = None
    for c in range(1, replicas + 1):
        # c / (c + s) falls as s grows, so for this c the error is least next to s* = c (100 - w) / w
        # (or at a bound): those two and the bounds, four candidates per c instead of every s -- linear in
        # replicas, not quadratic
        lo, hi = max(1, replicas - c), replicas
        ideal = c * (100 - weight) / weight
        for s in {lo, hi, min(hi, max(lo, math.floor(ideal))), min(hi, max(lo, math.ceil(ideal)))}:
            err = abs(100 * c / (c + s) - weight)
            key = (round(err, 9), c, -s, s)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[1], best[3]


def gateway_canary_pods(replicas: int, weight: int) -> int:
    return 0 if replicas <= 0 or weight <= 0 else max(1, math.ceil(replicas * weight / 100))


def achieved_weight(canary_in: int, stable_in: int) -> int | None:
    total = canary_in + stable_in
    return round(100 * canary_in / total) if total else None


def deployment_replicas(target: Target, counts: Mapping[str, RevisionCounts]) -> int:
    """The replicas to write to ``target``'s Deployment: the planned ones, never fewer than its pods that
    are Ready now. So a scale-in takes two rounds: the gates take the extra pods out of traffic, the
    kubelet turns them not Ready, and only then does the Deployment shrink -- its ReplicaSet deletes
    not-ready pods first, so it deletes those. Scaled at once, the ReplicaSet, which still saw every pod
    Ready, could delete the pods the gates kept in traffic (its order is its own) and leave the revision
    serving from none: every client on the other revision until the next reconcile."""
    return max(target.replicas, counts.get(target.revision, RevisionCounts()).pods_in_traffic)


def pod_gates(facts: Sequence[PodFacts], targets: Sequence[Target]) -> list[tuple[str, bool]]:
    """Pods whose in-traffic condition must change so that each revision has ``in_traffic_pods`` in.

    Pods already in traffic stay in (no churn), then ready pods, then by name; pods of revisions no
    longer planned leave traffic at once; terminating pods are left alone.
    """
    wanted = {t.revision: t.in_traffic_pods for t in targets}
    by_rev: dict[str, list[PodFacts]] = {}
    for p in facts:
        if p.terminating or p.revision is None:
            continue
        by_rev.setdefault(p.revision, []).append(p)
    out: list[tuple[str, bool]] = []
    for rev, pods in by_rev.items():
        order = sorted(pods, key=lambda p: (p.gate != "True", not p.containers_ready, p.name))
        k = wanted.get(rev, 0)  # a revision on its way out leaves traffic before its pods stop
        for i, p in enumerate(order):
            want = i < k
            if rev not in wanted and p.gate != "True":
                continue  # not ours to gate (a stray pod): only ever taken out of traffic
            if p.gate != ("True" if want else "False"):
                out.append((p.name, want))
    return sorted(out)


def ready_endpoints(slices: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Ready addresses per Service name in these EndpointSlices: what a gateway routes to (Traefik takes an
    endpoint only when ``conditions.ready`` is true; a Service with none answers 503). ``serving`` must not
    be false either: a Service that publishes not-ready addresses (a shadow target) has every endpoint
    ready, and ``serving`` is the pod's own readiness there."""
    out: dict[str, int] = {}
    for sl in slices:
        service = ((sl.get("metadata") or {}).get("labels") or {}).get("kubernetes.io/service-name")
        if not service:
            continue
        ready = {
            addr
            for ep in sl.get("endpoints") or []
            if (ep.get("conditions") or {}).get("ready") is True
            and (ep.get("conditions") or {}).get("serving") is not False
            for addr in ep.get("addresses") or []
        }
        out[service] = out.get(service, 0) + len(ready)
    return out


def with_endpoints(
    counts: Mapping[str, RevisionCounts], md_name: str, slices: Iterable[Mapping[str, Any]]
) -> dict[str, RevisionCounts]:
    """``counts`` with each revision's ready endpoints (:attr:`RevisionCounts.endpoints`) from the
    EndpointSlices of its Service."""
    by_service = ready_endpoints(slices)
    return {
        rev: replace(c, endpoints=by_service.get(revision_service_name(md_name, rev), 0))
        for rev, c in counts.items()
    }


def routable(counts: Mapping[str, RevisionCounts], revision: str) -> bool:
    """A route may send to ``revision``: one of its pods is Ready and in traffic and, where the
    EndpointSlices are observed, the gateway can know it (a ready endpoint in its Service's slices). The
    pod turns Ready a moment before the EndpointSlice controller writes the endpoint; a weight set in
    between sent clients to a backend the gateway had no server for (503s)."""
    return counts.get(revision, RevisionCounts()).routable


def route_stable(decision: Decision, counts: Mapping[str, RevisionCounts]) -> str:
    """The revision the route gives the stable's share: the decision's stable once it is routable;
    before, a revision that make-before-break keeps in traffic and that is (a failback's failed revision
    for the moment until the warm pods' endpoints are ready: its answers rather than the gateway's 503s,
    as kube-proxy does in the other modes)."""
    if routable(counts, decision.stable):
        return decision.stable
    kept = sorted(
        t.revision
        for t in decision.targets
        if t.in_traffic_pods > 0
        and t.revision not in (decision.stable, decision.canary)
        and routable(counts, t.revision)
    )
    return kept[0] if kept else decision.stable


def route_weight(decision: Decision, counts: Mapping[str, RevisionCounts]) -> int | None:
    """The canary's weight in the HTTPRoute: the requested one once the canary is :func:`routable`, 0
    before -- the route never weights a backend without a ready endpoint (a gateway would answer 503;
    KServe #5983)."""
    if decision.canary is None or decision.weight is None:
        return decision.weight
    return decision.weight if routable(counts, decision.canary) else 0
