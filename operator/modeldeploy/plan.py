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

from . import autoscaling, builders, canary, fallback, model_storage, routing
from . import rollout_types as rt
from .api import FallbackStatus, ModelDeployment, ModelDeploymentSpec, ModelDeploymentStatus, RevisionStatus
from .status import (
    DEGRADED,
    DERIVED,
    FALLBACK_ACTIVE,
    MODEL_AVAILABLE,
    PROGRESSING,
    READY,
    ConditionSpec,
    PodFacts,
    RevisionCounts,
    count_pods,
    flipped,
    kstatus_conditions,
    merge_conditions,
    phase_of,
    pod_facts,
)
from .traffic_split import achieved_weight, pod_gates


@dataclass
class Observed:
    """Children of one ModelDeployment as listed from the apiserver (by the ``modeldeploy.io/name`` label)."""

    deployments: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    pdbs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    routes: list[dict[str, Any]] = field(default_factory=list)
    scaled_objects: list[dict[str, Any]] = field(default_factory=list)


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


def spec_json(spec: ModelDeploymentSpec) -> str:
    """A revision's pod-shaping spec as its Deployment's annotation carries it (and ``status.stableSpec``)."""
    return json.dumps(builders.revision_spec(spec), sort_keys=True, separators=(",", ":"))


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


def route_weight(decision: rt.Decision, counts: Mapping[str, RevisionCounts]) -> int | None:
    """The canary's weight in the HTTPRoute: the requested one once a pod of the canary is Ready, 0
    before -- the route never weights a backend without a ready endpoint (a gateway would answer 503;
    KServe #5983)."""
    if decision.canary is None or decision.weight is None:
        return decision.weight
    return decision.weight if counts.get(decision.canary, RevisionCounts()).in_traffic > 0 else 0


def header_canary(decision: rt.Decision, counts: Mapping[str, RevisionCounts]) -> str | None:
    """The revision the route's canary header sends to: the canary while it is in traffic (a step, one of
    its pods Ready and in traffic), never during the shadow stage (its pods answer no client), nor
    before its first pod is Ready (a gateway would answer 503), nor after promotion or rollback (there is
    no canary then)."""
    if decision.canary is None or decision.shadow is not None or decision.weight is None:
        return None
    return decision.canary if counts.get(decision.canary, RevisionCounts()).in_traffic > 0 else None


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
    live_specs = _live_revision_specs(md, deployments)
    rebuilt = rebuild_stable(md, live_specs)

    old_fb = md.status.fallback
    hold = old_fb is not None and old_fb.state != "Idle" and md.spec.fallback is not None
    decision = canary.decide(md, current, live_specs, counts, now, measure, probe, hold=hold, gates=gates)
    if rebuilt is not None:
        decision.events.append(rebuilt)
        if decision.degraded_reason is None:
            decision.degraded_reason, decision.degraded_message = "StableRecreated", rebuilt.message
    fb = fallback.adjust(md, decision, counts, now)
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
    in_traffic = {t.revision: t.in_traffic_pods for t in targets}
    desired: list[dict[str, Any]] = []
    for t in targets:
        desired.append(builders.build_deployment(md, t.spec, t.revision, t.replicas))
    desired.append(builders.build_model_service(md))
    for t in targets:
        publish = mirror is not None and mirror.target == t.revision and in_traffic.get(t.revision, 0) == 0
        desired.append(builders.build_revision_service(md, t.revision, publish_not_ready=publish))
    desired.append(builders.build_pdb(md))
    if md.spec.rollout.traffic_routing.mode == "gatewayAPI":
        weight = route_weight(decision, counts)
        desired.append(
            routing.build_httproute(
                md,
                decision.stable,
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


def compute_status(
    md: ModelDeployment,
    current: str,
    decision: rt.Decision,
    counts: Mapping[str, RevisionCounts],
    now: datetime,
    error: str | None = None,
    fallback_status: FallbackStatus | None = None,
) -> tuple[ModelDeploymentStatus, list[EventSpec]]:
    """The status for this plan, and the events its changes are worth."""
    old = md.status
    want = md.spec.replicas
    revisions = revision_rows(md, decision, counts)
    in_traffic_total = sum(r.in_traffic_replicas for r in revisions)
    is_ready = in_traffic_total >= want
    ready_text = f"{min(in_traffic_total, want)}/{want}"
    wanted = wanted_conditions(md, current, decision, counts, revisions, error, fallback_status)
    ready_c, degraded_c = wanted[0], wanted[2]
    assert ready_c.type == READY and degraded_c.type == DEGRADED
    progressing = decision.progressing_reason is not None
    stable_target = next((t for t in decision.targets if t.revision == decision.stable), None)
    stable_spec = old.stable_spec if old.stable_revision == decision.stable else None
    if stable_target is not None:
        stable_spec = spec_json(stable_target.spec)
    status = old.model_copy(
        update={
            "observed_generation": md.generation,
            "revision": current,
            "stable_revision": decision.stable,
            "stable_spec": stable_spec,
            "canary_revision": decision.canary,
            "canary_weight": decision.weight,
            "achieved_canary_weight": canary_achieved(decision, counts),
            "previous_revision": decision.previous,
            "previous_expires_at": decision.previous_expires_at,
            "step": decision.step,
            "step_started_at": decision.step_started_at,
            "step_waiting_since": decision.step_waiting_since,
            "analysis": decision.analysis,
            "shadow": decision.shadow,
            "gate": decision.gate,
            "fallback": fallback_status,
            "replicas": sum(t.replicas for t in decision.targets),
            "serving_replicas": want,
            "autoscaler": md.name if md.spec.autoscaling is not None else None,
            "selector": f"{builders.LABEL_NAME}={md.name}",
            "ready_replicas": in_traffic_total,
            "ready": ready_text,
            "revisions": revisions,
            "conditions": merge_conditions(old.conditions, wanted, md.generation, now),
            "history": decision.history,
            "phase": phase_of(
                is_ready,
                progressing,
                degraded_c.status == "True",
                (md.spec.rollout.paused or decision.progressing_reason == "AnalysisPaused") and progressing,
                shadowing=decision.shadow is not None,
            ),
        }
    )
    return status, status_events(old, status)


def revision_rows(
    md: ModelDeployment, decision: rt.Decision, counts: Mapping[str, RevisionCounts]
) -> list[RevisionStatus]:
    """``status.revisions``: one row per planned revision, with its pods as counted."""
    revisions: list[RevisionStatus] = []
    for t in decision.targets:
        pods = counts.get(t.revision, RevisionCounts())
        revisions.append(
            RevisionStatus(
                revision=t.revision,
                role=t.role,
                deployment=builders.deployment_name(md.name, t.revision),
                replicas=t.replicas,
                current_replicas=pods.current,
                ready_replicas=pods.ready,
                in_traffic_replicas=pods.in_traffic,
                unschedulable_replicas=pods.unschedulable,
                scheduling_message=pods.scheduling_message,
                model_version=t.spec.model.version,
            )
        )
    return revisions


def canary_achieved(decision: rt.Decision, counts: Mapping[str, RevisionCounts]) -> int | None:
    """The canary's achieved weight: the route's weights (gatewayAPI) or its share of the pods in traffic."""
    if decision.canary is None:
        return None
    if decision.routing_mode == "gatewayAPI":
        return route_weight(decision, counts)  # exact: the route's weights
    canary_in = counts.get(decision.canary, RevisionCounts()).in_traffic
    stable_in = counts.get(decision.stable, RevisionCounts()).in_traffic
    return achieved_weight(canary_in, stable_in) or 0


def wanted_conditions(
    md: ModelDeployment,
    current: str,
    decision: rt.Decision,
    counts: Mapping[str, RevisionCounts],
    revisions: Sequence[RevisionStatus],
    error: str | None,
    fallback_status: FallbackStatus | None,
) -> list[ConditionSpec]:
    """Ready, Progressing, Degraded (in that order), then ModelAvailable and FallbackActive where they
    apply, then kstatus's Reconciling and Stalled (derived from Progressing and Degraded)."""
    want = md.spec.replicas
    in_traffic_total = sum(r.in_traffic_replicas for r in revisions)
    is_ready = in_traffic_total >= want
    ready_c = ConditionSpec(
        READY,
        "True" if is_ready else "False",
        "ScaledToZero" if want == 0 else ("MinimumReplicasReady" if is_ready else "ReplicasNotReady"),
        f"{min(in_traffic_total, want)}/{want} pods ready and in traffic",
    )
    progressing_c = ConditionSpec(
        PROGRESSING,
        "True" if decision.progressing_reason is not None else "False",
        decision.progressing_reason or "RolloutComplete",
        decision.progressing_message,
    )
    model_c = model_available(md, current, counts)
    degraded_c = degraded_condition(decision, revisions, model_c, error)
    wanted = [ready_c, progressing_c, degraded_c]
    if model_c is not None:
        wanted.append(model_c)
    if md.spec.fallback is not None:
        fb_on = decision.fallback_revision is not None
        wanted.append(
            ConditionSpec(
                FALLBACK_ACTIVE,
                "True" if fb_on else "False",
                "GPURevisionUnavailable" if fb_on else "GPURevisionServing",
                (fallback_status.cause or "") if fb_on and fallback_status is not None else "",
            )
        )
    return [*wanted, *kstatus_conditions(progressing_c, degraded_c)]


def degraded_condition(
    decision: rt.Decision,
    revisions: Sequence[RevisionStatus],
    model_c: ConditionSpec | None,
    error: str | None,
) -> ConditionSpec:
    """Degraded, by the first reason that holds: an error, the rollout's own, unschedulable pods, the
    model."""
    unschedulable = [r for r in revisions if r.unschedulable_replicas]
    if error is not None:
        return ConditionSpec(DEGRADED, "True", "ReconcileError", error)
    if decision.degraded_reason is not None:
        return ConditionSpec(DEGRADED, "True", decision.degraded_reason, decision.degraded_message)
    if unschedulable:
        return ConditionSpec(
            DEGRADED,
            "True",
            "PodsUnschedulable",
            "; ".join(
                f"revision {r.revision}: {r.unschedulable_replicas} pod(s) unschedulable: "
                f"{r.scheduling_message}"
                for r in unschedulable
            ),
        )
    if model_c is not None and model_c.status == "False":
        return ConditionSpec(DEGRADED, "True", "ModelUnavailable", model_c.message)
    return ConditionSpec(DEGRADED, "False", "AsExpected", "")


def status_events(old: ModelDeploymentStatus, status: ModelDeploymentStatus) -> list[EventSpec]:
    """The events a status change is worth: flipped conditions, and pods newly unschedulable."""
    events: list[EventSpec] = []
    for cond in flipped(old, status):
        if cond.type in DERIVED:
            continue  # they restate Progressing and Degraded, whose flips are told
        if cond.type == DEGRADED and cond.status == "False" and condition_absent(old, DEGRADED):
            continue  # nothing to tell on the first reconcile
        bad = (cond.type == DEGRADED and cond.status == "True") or (
            cond.type in (READY, MODEL_AVAILABLE) and cond.status == "False"
        )
        if cond.type == READY and cond.status == "False" and condition_absent(old, READY):
            continue
        events.append(
            EventSpec(
                "Warning" if bad else "Normal",
                cond.reason,
                f"{cond.type}={cond.status}: {cond.message}"
                if cond.message
                else f"{cond.type}={cond.status}",
            )
        )
    old_sched = {r.revision: (r.unschedulable_replicas, r.scheduling_message) for r in old.revisions}
    for r in status.revisions:
        if not r.unschedulable_replicas:
            continue
        if old_sched.get(r.revision) != (r.unschedulable_replicas, r.scheduling_message):
            events.append(
                EventSpec(
                    "Warning",
                    "Unschedulable",
                    f"revision {r.revision}: {r.unschedulable_replicas} pod(s) cannot be scheduled: "
                    f"{r.scheduling_message}",
                )
            )
    return events


def model_available(
    md: ModelDeployment, current: str, counts: Mapping[str, RevisionCounts]
) -> ConditionSpec | None:
    """``ModelAvailable`` for a model fetched from storage (s3://, pvc://): True once a pod of the current
    revision loaded it, False with the fetch's reason (AccessDenied, NotFound, ChecksumMismatch,
    DownloadTimeout, ...) while its pods cannot get it, Unknown while they try. Other schemes: none (or,
    when one was set before, True -- the server loads the model itself)."""
    if model_storage.scheme(md.spec.model.uri) not in ("s3", "pvc"):
        if condition_absent(md.status, MODEL_AVAILABLE):
            return None
        return ConditionSpec(MODEL_AVAILABLE, "True", "NoFetch", "the server loads the model itself")
    pods = counts.get(current, RevisionCounts())
    if pods.ready:
        return ConditionSpec(
            MODEL_AVAILABLE,
            "True",
            "ModelLoaded",
            f"revision {current}: {pods.ready} pod(s) loaded the model",
        )
    if pods.fetch_failure is not None:
        f = pods.fetch_failure
        return ConditionSpec(
            MODEL_AVAILABLE,
            "False",
            f.reason,
            f"revision {current}: {pods.fetch_failed} pod(s) could not fetch {md.spec.model.uri}: "
            f"{f.message}",
        )
    return ConditionSpec(
        MODEL_AVAILABLE, "Unknown", "ModelLoading", f"revision {current}: fetching or loading"
    )


def condition_absent(status: ModelDeploymentStatus, type_: str) -> bool:
    return all(c.type != type_ for c in status.conditions)


def error_status(
    md: ModelDeployment, message: str, now: datetime, reason: str = "ReconcileError"
) -> ModelDeploymentStatus:
    """The status after a failed reconcile: Degraded=True with the error (``reason``), the rest as it was."""
    wanted = [
        ConditionSpec(c.type, c.status, c.reason, c.message)
        for c in md.status.conditions
        if c.type != DEGRADED
    ]
    wanted.append(ConditionSpec(DEGRADED, "True", reason, message))
    conditions = merge_conditions(md.status.conditions, wanted, md.generation, now)
    return md.status.model_copy(update={"conditions": conditions, "phase": "Degraded"})
