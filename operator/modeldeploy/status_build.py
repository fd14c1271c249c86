"""One place builds a ModelDeployment's status (as Argo Rollouts' ``syncRolloutStatusCanary`` does), pure:

* :func:`compute_status` -- after a plan: revision rows, the achieved weight, the conditions, the phase,
  and (:func:`status_events`) the events its changes are worth;
* :func:`error_status` -- after a failed reconcile: Degraded=True with the error, the rest as it was;
* :func:`invalid_spec_status` -- for a spec the apiserver accepted but the models refuse;
* :func:`invalid_status_patch` -- for a status the models cannot read: only ``conditions`` and ``phase``,
  as a JSON merge patch on the raw status.

The reconciler writes what these return (through :func:`modeldeploy.status.status_patch`); it builds no
status of its own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from . import builders, model_storage, oom
from . import rollout_types as rt
from .api import (
    Condition,
    FallbackStatus,
    ModelDeployment,
    ModelDeploymentSpec,
    ModelDeploymentStatus,
    RevisionStatus,
)
from .status import (
    DEGRADED,
    DERIVED,
    FALLBACK_ACTIVE,
    MODEL_AVAILABLE,
    PROGRESSING,
    READY,
    ConditionSpec,
    RevisionCounts,
    flipped,
    kstatus_conditions,
    merge_conditions,
    phase_of,
)
from .traffic_split import achieved_weight, route_weight


def spec_json(spec: ModelDeploymentSpec) -> str:
    """A revision's pod-shaping spec as its Deployment's annotation carries it (and ``status.stableSpec``)."""
    return json.dumps(builders.revision_spec(spec), sort_keys=True, separators=(",", ":"))


def compute_status(
    md: ModelDeployment,
    current: str,
    decision: rt.Decision,
    counts: Mapping[str, RevisionCounts],
    now: datetime,
    error: str | None = None,
    fallback_status: FallbackStatus | None = None,
) -> tuple[ModelDeploymentStatus, list[rt.Event]]:
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
                in_traffic_replicas=pods.pods_in_traffic,
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
    canary_in = counts.get(decision.canary, RevisionCounts()).pods_in_traffic
    stable_in = counts.get(decision.stable, RevisionCounts()).pods_in_traffic
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
    degraded_c = degraded_condition(decision, revisions, model_c, error, oom_message(decision, counts))
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


def oom_message(decision: rt.Decision, counts: Mapping[str, RevisionCounts]) -> str | None:
    """The revisions kept running whose containers the kernel killed and that are down now (a canary's
    kill fails the canary instead: :mod:`modeldeploy.canary`); None when there are none. One that came
    back up is not reported: its ``lastState`` keeps the kill for the pod's whole life."""
    said = []
    for t in decision.targets:
        pods = counts.get(t.revision, RevisionCounts())
        if t.role != "old" and pods.oom is not None and pods.oom.down:
            said.append(f"revision {t.revision}: {pods.oom_killed} pod(s): {oom.describe(pods.oom)}")
    return "; ".join(said) or None


def degraded_condition(
    decision: rt.Decision,
    revisions: Sequence[RevisionStatus],
    model_c: ConditionSpec | None,
    error: str | None,
    oom_killed: str | None = None,
) -> ConditionSpec:
    """Degraded, by the first reason that holds: an error, the rollout's own, containers OOM-killed,
    unschedulable pods, the model."""
    unschedulable = [r for r in revisions if r.unschedulable_replicas]
    if error is not None:
        return ConditionSpec(DEGRADED, "True", "ReconcileError", error)
    if decision.degraded_reason is not None:
        return ConditionSpec(DEGRADED, "True", decision.degraded_reason, decision.degraded_message)
    if oom_killed is not None:
        return ConditionSpec(DEGRADED, "True", oom.OOM_KILLED, oom_killed)
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


def status_events(old: ModelDeploymentStatus, status: ModelDeploymentStatus) -> list[rt.Event]:
    """The events a status change is worth: flipped conditions, and pods newly unschedulable."""
    events: list[rt.Event] = []
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
            rt.Event(
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
                rt.Event(
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


def invalid_spec_status(
    old: ModelDeploymentStatus, generation: int, message: str, now: datetime
) -> ModelDeploymentStatus:
    """A spec the models refuse: ``Degraded=True`` (InvalidSpec, ``message``), phase Failed, kstatus's
    Stalled; the rollout state in ``old`` kept as it is."""
    degraded = ConditionSpec(DEGRADED, "True", "InvalidSpec", message)
    idle = ConditionSpec(PROGRESSING, "False", "InvalidSpec", "")  # for kstatus: Stalled, not Reconciling
    conds = merge_conditions(old.conditions, [degraded, *kstatus_conditions(idle, degraded)], generation, now)
    return old.model_copy(update={"conditions": conds, "phase": "Failed", "observed_generation": generation})


def invalid_status_patch(
    old: Mapping[str, Any], message: str, generation: int, now: datetime
) -> dict[str, Any] | None:
    """A status the models cannot read (``old`` is the raw one): the merge patch that sets
    ``Degraded=True`` (InvalidStatus, ``message``) and phase Degraded, or None when it says so already.
    The caller writes it only when ``conditions`` and ``phase`` themselves read."""
    conds = [Condition.model_validate(c) for c in old.get("conditions") or []]
    new = merge_conditions(
        conds, [ConditionSpec(DEGRADED, "True", "InvalidStatus", message)], generation, now
    )
    want = {"conditions": [c.to_api() for c in new], "phase": "Degraded"}
    have = {"conditions": [c.to_api() for c in conds], "phase": old.get("phase")}
    return {f: v for f, v in want.items() if have[f] != v} or None
