"""The reconcile plan: from a ModelDeployment and what was observed, everything the operator should do.

A pure function of its inputs (:func:`plan`). The reconciler only executes the result:

1. ``revisions``: which revisions exist, with how many pods, in which role, in traffic or not
   (:func:`modeldeploy.canary.decide`, progressive delivery);
2. ``apply``: the desired children (Deployments, Services, PDB), applied only where they differ;
3. ``delete``: owned children that no longer belong;
4. ``pod_gates``: pods whose ``modeldeploy.io/in-traffic`` condition must be set;
5. ``pod_annotations``: pods whose ``modeldeploy.io/shadow`` annotation (where they copy a sample of their
   requests to, or nothing) must change;
6. ``status``: the new status (written only when it differs from the live one);
7. ``events``: what happened that the user should see (condition flips, unschedulable pods).

The rollout policy is :mod:`modeldeploy.canary` (progressive delivery, pure); the analysis it needs is
passed in as a function (``measure``), called only when a window is due, so a plan stays a pure
function of its inputs and the unit tests drive it with fake verdicts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from . import autoscaling, builders, routing
from . import rollout_types as rt
from .api import ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus
from .rollout_decision import final_decision
from .status import (
    PodFacts,
    RevisionCounts,
    count_pods,
    pod_facts,
)
from .status_build import compute_status
from .traffic_split import (
    deployment_replicas,
    pod_gates,
    routable,
    route_stable,
    route_weight,
    with_endpoints,
)


@dataclass
class Observed:
    """Children of one ModelDeployment as listed from the apiserver (by the ``modeldeploy.io/name`` label)."""

    deployments: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    routes: list[dict[str, Any]] = field(default_factory=list)
    scaled_objects: list[dict[str, Any]] = field(default_factory=list)
    #: the EndpointSlices of its Services (gatewayAPI only: they carry the Services' labels)
    endpoint_slices: list[dict[str, Any]] | None = None


RevisionTarget = rt.Target
EventSpec = rt.Event


@dataclass(frozen=True)
class Deletion:
    kind: str
    name: str
    uid: str


@dataclass
class Plan:
    revision: str
    revisions: list[RevisionTarget]
    apply: list[dict[str, Any]]
    delete: list[Deletion]
    pod_gates: list[tuple[str, bool]]
    status: ModelDeploymentStatus
    events: list[EventSpec]
    requeue_after: float | None = None
    results: list[str] = field(default_factory=list)  # rollout results, for the operator metric
    clear_command: bool = False  # remove the handled modeldeploy.io/command annotation
    pod_annotations: list[tuple[str, str | None]] = field(default_factory=list)  # (pod, shadow target)


# ---------------------------------------------------------------------------------------------- helpers


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    return any(
        ref.get("uid") == uid and ref.get("controller")
        for ref in obj.get("metadata", {}).get("ownerReferences") or []
    )


def _live_revision_specs(md: ModelDeployment, deployments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """revision -> (pod-shaping spec recorded on its Deployment, or None if unreadable)."""
    out: dict[str, ModelDeploymentSpec | None] = {}
    for d in deployments:
        meta = d.get("metadata", {})
        rev = (meta.get("labels") or {}).get(builders.LABEL_REVISION)
        if not rev:
            continue
        raw = (meta.get("annotations") or {}).get(builders.ANNOTATION_REVISION_SPEC)
        try:
            out[rev] = builders.revision_spec_from_annotation(raw) if raw else None
        except (ValueError, ValidationError, json.JSONDecodeError):
            out[rev] = None
    return out


def recorded_stable(md: ModelDeployment) -> ModelDeploymentSpec | None:
    """The stable revision's spec as status recorded it, if it reads and is that revision (pure)."""
    raw, stable = md.status.stable_spec, md.status.stable_revision
    if not raw or not stable:
        return None
    try:
        spec = builders.revision_spec_from_annotation(raw)
    except (ValueError, ValidationError, json.JSONDecodeError):
        return None
    return spec if builders.spec_revision(spec) == stable else None


def rebuild_stable(md: ModelDeployment, live_specs: dict[str, ModelDeploymentSpec | None]) -> rt.Event | None:
    """The stable revision's Deployment is missing (deleted by hand, pruned by GitOps) or its spec
    annotation no longer reads: its spec comes from status instead, so it is recreated and stays the
    stable one; never whatever Deployment happens to exist. Changes ``live_specs``; the event says so."""
    stable = md.status.stable_revision
    if stable is None or live_specs.get(stable) is not None:
        return None
    spec = recorded_stable(md)
    if spec is None:
        return None
    what = "had no Deployment" if stable not in live_specs else "had an unreadable Deployment"
    live_specs[stable] = spec
    return rt.Event(
        "Warning", "StableRecreated", f"the stable revision {stable} {what}: rebuilt from status.stableSpec"
    )


# ---------------------------------------------------------------------------------------------- plan


def header_canary(decision: rt.Decision, counts: Mapping[str, RevisionCounts]) -> str | None:
    """The revision the route's canary header sends to: the canary while it is in traffic (a step, one of
    its pods Ready and in traffic), never during the shadow stage (its pods answer no client), nor
    before it is routable (:func:`routable`: a gateway would answer 503), nor after promotion or
    rollback (there is no canary then)."""
    if decision.canary is None or decision.shadow is not None or decision.weight is None:
        return None
    return decision.canary if routable(counts, decision.canary) else None


def mirror_url(md: ModelDeployment, services: Sequence[Mapping[str, Any]], target: str) -> str | None:
    """Where copies to ``target`` go: its revision Service by DNS name (the URL the servers build
    themselves, :func:`builders.shadow_service`), once that Service has a ClusterIP (None until then)."""
    name = builders.revision_service_name(md.name, target)
    for svc in services:
        if svc.get("metadata", {}).get("name") == name:
            ip = (svc.get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                return builders.shadow_service(md, target)
    return None


def shadow_annotations(
    facts: Sequence[PodFacts], mirror: rt.Mirror | None, url: str | None
) -> list[tuple[str, str | None]]:
    """Pods whose ``modeldeploy.io/shadow`` annotation must change: the source revision's pods copy to the
    mirror's target, every other pod copies nowhere (terminating pods are left alone)."""
    want = mirror.to_annotation(url) if mirror is not None and url is not None else None
    out: list[tuple[str, str | None]] = []
    for p in facts:
        if p.terminating:
            continue
        value = want if mirror is not None and p.revision == mirror.source else None
        if p.shadow != value:
            out.append((p.name, value))
    return sorted(out, key=lambda x: x[0])


def plan(
    md: ModelDeployment,
    observed: Observed,
    now: datetime,
    measure: rt.Measure | None = None,
    probe: rt.Probe | None = None,
    prometheus_url: str | None = None,
    gates: rt.Gates | None = None,
) -> Plan:
    """Everything to do for one ModelDeployment (pure, given a pure ``measure``, ``probe`` and
    ``gates``). ``prometheus_url``: the operator's, where ``spec.autoscaling`` names none."""
    current = builders.spec_revision(md.spec)
    uid = md.uid
    deployments = [d for d in observed.deployments if owned_by(d, uid)]
    services = [s for s in observed.services if owned_by(s, uid)]
    pdbs = [p for p in observed.pdbs if owned_by(p, uid)]
    routes = [r for r in observed.routes if owned_by(r, uid)]
    scaled_objects = [o for o in observed.scaled_objects if owned_by(o, uid)]
    facts = [pod_facts(p) for p in observed.pods]
    counts = count_pods(facts)
    if observed.endpoint_slices is not None:
        counts = with_endpoints(counts, md.name, observed.endpoint_slices)
    live_specs = _live_revision_specs(md, deployments)
    rebuilt = rebuild_stable(md, live_specs)

    fb = final_decision(md, current, live_specs, counts, now, rebuilt, measure, probe, gates)
    decision = fb.decision
    targets = decision.targets
    mirror = decision.mirror
    desired, autoscaler_error = desired_children(md, decision, counts, prometheus_url)
    desired_names = {(o["kind"], o["metadata"]["name"]) for o in desired}

    # -- owned children that no longer belong
    deletions = [
        Deletion(o["kind"], o["metadata"]["name"], o["metadata"].get("uid", ""))
        for o in (*deployments, *services, *pdbs, *routes, *scaled_objects)
        if (o.get("kind"), o["metadata"]["name"]) not in desired_names
    ]

    # -- readiness gates: how many pods of each revision in traffic; who copies requests where
    readiness = pod_gates(facts, targets)
    annotations = shadow_annotations(
        facts, mirror, mirror_url(md, services, mirror.target) if mirror else None
    )

    status, events = compute_status(
        md, current, decision, counts, now, error=autoscaler_error, fallback_status=fb.status
    )
    requeue = None
    if decision.requeue_at is not None:
        requeue = max(rt.MIN_REQUEUE, (decision.requeue_at - now).total_seconds())
    return Plan(
        revision=current,
        revisions=targets,
        apply=desired,
        delete=deletions,
        pod_gates=readiness,
        status=status,
        events=decision.events + events,
        requeue_after=requeue,
        results=list(decision.results),
        clear_command=decision.command_seen,
        pod_annotations=annotations,
    )


def desired_children(
    md: ModelDeployment,
    decision: rt.Decision,
    counts: Mapping[str, RevisionCounts],
    prometheus_url: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """The children this decision wants (Deployments, Services, the PDB, the HTTPRoute, the
    ScaledObject), and why the ScaledObject is missing when ``spec.autoscaling`` cannot have one."""
    targets, mirror = decision.targets, decision.mirror
    pods_in = {t.revision: t.in_traffic_pods for t in targets}
    desired: list[dict[str, Any]] = []
    for t in targets:
        desired.append(builders.build_deployment(md, t.spec, t.revision, deployment_replicas(t, counts)))
    desired.append(builders.build_model_service(md))
    for t in targets:
        publish = mirror is not None and mirror.target == t.revision and pods_in.get(t.revision, 0) == 0
        desired.append(builders.build_revision_service(md, t.revision, publish_not_ready=publish))
    desired.append(builders.build_pdb(md))
    if md.spec.rollout.traffic_routing.mode == "gatewayAPI":
        weight = route_weight(decision, counts)
        desired.append(
            routing.build_httproute(
                md,
                route_stable(decision, counts),
                decision.canary,
                weight,
                decision.fallback_revision,
                header_canary=header_canary(decision, counts),
            )
        )
    if md.spec.autoscaling is None:
        return desired, None
    a = md.spec.autoscaling
    url = a.prometheus or md.spec.rollout.analysis.prometheus_url or prometheus_url
    if not url:
        return desired, "spec.autoscaling: no Prometheus URL (set spec.autoscaling.prometheusURL)"
    desired.append(autoscaling.build_scaled_object(md, a, url))
    return desired, None
