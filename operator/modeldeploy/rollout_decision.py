"""The one place a reconcile's final rollout :class:`~modeldeploy.rollout_types.Decision` is made (pure):
the rollout state machine's (:func:`modeldeploy.canary.decide`), what a stable revision rebuilt from
status adds to it, then the CPU fallback's adjustment (:func:`modeldeploy.fallback.adjust`). The plan
only reads the result; nothing after this changes a Decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timedelta

from . import canary, fallback
from . import rollout_types as rt
from .api import ModelDeployment, ModelDeploymentSpec
from .routing import ROUTE_DRAIN_SECONDS
from .status import RevisionCounts


def final_decision(
    md: ModelDeployment,
    current: str,
    live_specs: Mapping[str, ModelDeploymentSpec | None],
    counts: Mapping[str, RevisionCounts],
    now: datetime,
    rebuilt: rt.Event | None = None,
    measure: rt.Measure | None = None,
    probe: rt.Probe | None = None,
    gates: rt.Gates | None = None,
) -> fallback.FallbackResult:
    """This reconcile's Decision and the fallback's status. ``rebuilt``: the event of a stable revision
    whose Deployment was rebuilt from ``status.stableSpec`` (told, and Degraded unless the rollout has a
    reason of its own). While the fallback is in traffic the rollout is held (nothing is judged)."""
    old_fb = md.status.fallback
    hold = old_fb is not None and old_fb.state != "Idle" and md.spec.fallback is not None
    decision = canary.decide(md, current, live_specs, counts, now, measure, probe, hold=hold, gates=gates)
    if rebuilt is not None:
        degraded = (
            (decision.degraded_reason, decision.degraded_message)
            if decision.degraded_reason is not None
            else ("StableRecreated", rebuilt.message)
        )
        decision = replace(
            decision,
            events=[*decision.events, rebuilt],
            degraded_reason=degraded[0],
            degraded_message=degraded[1],
        )
    result = fallback.adjust(md, decision, counts, now)
    if md.spec.rollout.traffic_routing.mode == "gatewayAPI":
        result = replace(result, decision=drain_route_leavers(result.decision, live_specs, counts, now))
    return result


def drain_route_leavers(
    decision: rt.Decision,
    live_specs: Mapping[str, ModelDeploymentSpec | None],
    counts: Mapping[str, RevisionCounts],
    now: datetime,
) -> rt.Decision:
    """gatewayAPI mode: for :data:`~modeldeploy.routing.ROUTE_DRAIN_SECONDS` after the last history entry
    (a rollback, an abort, a promotion, a supersede -- what takes a revision out of the route), a revision
    whose pods are in traffic keeps them there (Ready, its endpoints ready) though the route no longer
    sends to it: the gateway may still route by the route it replaced. Then they leave as before."""
    if not decision.history:
        return decision
    until = max(h.time for h in decision.history) + timedelta(seconds=ROUTE_DRAIN_SECONDS)
    if now >= until:
        return decision
    planned = {t.revision: t for t in decision.targets}
    targets, kept = [], False
    for t in decision.targets:
        pods = counts.get(t.revision, RevisionCounts()).pods_in_traffic
        if pods > t.in_traffic_pods and t.revision not in (decision.stable, decision.canary):
            t, kept = replace(t, replicas=max(t.replicas, pods), in_traffic_pods=pods), True
        targets.append(t)
    for rev, spec in live_specs.items():
        pods = counts.get(rev, RevisionCounts()).pods_in_traffic
        if rev not in planned and spec is not None and pods > 0:
            targets.append(rt.Target(rev, spec, pods, "old", pods))
            kept = True
    if not kept:
        return decision
    wake = until if decision.requeue_at is None else min(decision.requeue_at, until)
    return replace(decision, targets=targets, requeue_at=wake)
