"""Pure status logic: pod facts, metav1.Conditions, phase, and the status diff.

* :func:`pod_facts` reads what matters of a pod (unschedulable? the scheduler's reason; containers ready;
  in traffic).
* :func:`merge_conditions` keeps ``lastTransitionTime`` unless a condition's status flips.
* :func:`status_patch` returns the JSON merge patch that turns the live status into the computed one,
  or None when they are equal -- so a reconcile with nothing new writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from .api import Condition, ModelDeploymentStatus
from .builders import ANNOTATION_SHADOW, LABEL_REVISION, READINESS_GATE
from .model_storage import FetchFailure, fetch_failure
from .oom import OOMKill, oom_kill, worst

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
FALLBACK_ACTIVE = "FallbackActive"
MODEL_AVAILABLE = "ModelAvailable"
#: kstatus's abnormal-true conditions (sigs.k8s.io/cli-utils/pkg/kstatus: Flux's health checks), derived
RECONCILING = "Reconciling"
STALLED = "Stalled"
#: Degraded reasons that hold until the spec changes (or a command says what to do): kstatus's Stalled
STALLED_REASONS = frozenset({"RolledBack", "Aborted", "FailedBack", "StableMissing", "InvalidSpec"})
#: conditions that only restate others (no events of their own)
DERIVED = frozenset({RECONCILING, STALLED})


def utcnow() -> datetime:
    """Now, in UTC, to the second (the precision of metav1.Time)."""
    return datetime.now(UTC).replace(microsecond=0)


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodFacts:
    name: str
    revision: str | None
    terminating: bool
    phase: str
    unschedulable: bool
    scheduling_message: str | None
    containers_ready: bool
    ready: bool
    gate: str | None  # status of the modeldeploy.io/in-traffic condition, None when absent
    shadow: str | None = None  # the modeldeploy.io/shadow annotation (where it copies requests)
    fetch_failure: FetchFailure | None = None  # the model fetch init container's last failure
    oom: OOMKill | None = None  # a container the kernel killed for its memory limit


def _conditions(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (pod.get("status") or {}).get("conditions") or []}


def pod_facts(pod: Mapping[str, Any]) -> PodFacts:
    meta = pod.get("metadata", {})
    status = pod.get("status") or {}
    conds = _conditions(pod)
    sched = conds.get("PodScheduled", {})
    unschedulable = sched.get("status") == "False" and sched.get("reason") == "Unschedulable"
    return PodFacts(
        name=meta.get("name", ""),
        revision=(meta.get("labels") or {}).get(LABEL_REVISION),
        terminating=bool(meta.get("deletionTimestamp")),
        phase=status.get("phase", "Pending"),
        unschedulable=unschedulable,
        scheduling_message=(sched.get("message") or sched.get("reason")) if unschedulable else None,
        containers_ready=conds.get("ContainersReady", {}).get("status") == "True",
        ready=conds.get("Ready", {}).get("status") == "True",
        gate=conds.get(READINESS_GATE, {}).get("status"),
        shadow=(meta.get("annotations") or {}).get(ANNOTATION_SHADOW),
        fetch_failure=fetch_failure(pod),
        oom=oom_kill(pod),
    )


@dataclass(frozen=True)
class RevisionCounts:
    current: int = 0
    ready: int = 0  # server ready (containers ready), in traffic or warm
    pods_in_traffic: int = 0  # pod Ready: containers ready and the in-traffic gate True
    unschedulable: int = 0
    scheduling_message: str | None = None
    fetch_failed: int = 0  # pods whose model fetch failed (and not fetched since)
    fetch_failure: FetchFailure | None = None  # one of their failures (the first by reason, message)
    oom_killed: int = 0  # pods with a container OOM-killed (its last termination)
    oom: OOMKill | None = None  # the one to report (:func:`modeldeploy.oom.worst`)
    #: ready addresses in the EndpointSlices of the revision's Service -- what a gateway routes to (it
    #: learns a pod is Ready from the EndpointSlice, after the pod's own status says so); None where the
    #: slices are not observed (every routing mode but gatewayAPI)
    endpoints: int | None = None

    @property
    def routable(self) -> bool:
        """A route may send here: a pod Ready and in traffic and, where the EndpointSlices are observed, a
        ready endpoint the gateway can know (:mod:`modeldeploy.traffic_split`)."""
        return self.pods_in_traffic > 0 and (self.endpoints is None or self.endpoints > 0)


def count_pods(pods: Iterable[PodFacts]) -> dict[str, RevisionCounts]:
    acc: dict[str, dict[str, Any]] = {}
    for p in pods:
        if p.revision is None or p.terminating or p.phase in ("Succeeded", "Failed"):
            continue
        a = acc.setdefault(
            p.revision,
            {
                "current": 0,
                "ready": 0,
                "pods_in_traffic": 0,
                "unschedulable": 0,
                "messages": [],
                "fetch": [],
                "oom": [],
            },
        )
        a["current"] += 1
        a["ready"] += int(p.containers_ready)
        a["pods_in_traffic"] += int(p.ready)
        if p.unschedulable:
            a["unschedulable"] += 1
            if p.scheduling_message:
                a["messages"].append(p.scheduling_message)
        if p.fetch_failure is not None:
            a["fetch"].append(p.fetch_failure)
        if p.oom is not None:
            a["oom"].append(p.oom)
    return {
        rev: RevisionCounts(
            current=a["current"],
            ready=a["ready"],
            pods_in_traffic=a["pods_in_traffic"],
            unschedulable=a["unschedulable"],
            # the same message for every pending pod is the common case; keep the first, sorted for stability
            scheduling_message=sorted(a["messages"])[0] if a["messages"] else None,
            fetch_failed=len(a["fetch"]),
            fetch_failure=min(a["fetch"], key=lambda f: (f.reason, f.message)) if a["fetch"] else None,
            oom_killed=len(a["oom"]),
            oom=worst(a["oom"]),
        )
        for rev, a in acc.items()
    }


# ---------------------------------------------------------------------------------------------- conditions


@dataclass(frozen=True)
class ConditionSpec:
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str


def merge_conditions(
    old: Iterable[Condition], wanted: Iterable[ConditionSpec], generation: int, now: datetime
) -> list[Condition]:
    """The new conditions; ``lastTransitionTime`` changes only when a condition's status changes."""
    previous = {c.type: c for c in old}
    out: list[Condition] = []
    for w in wanted:
        p = previous.get(w.type)
        ltt = p.last_transition_time if p is not None and p.status == w.status else now
        out.append(
            Condition(
                type=w.type,
                status=w.status,  # type: ignore[arg-type]
                observed_generation=generation,
                last_transition_time=ltt,
                reason=w.reason,
                message=w.message[:32768],
            )
        )
    # conditions someone else added (not ours) are kept untouched
    out.extend(c for t, c in previous.items() if t not in {w.type for w in wanted})
    return out


def kstatus_conditions(progressing: ConditionSpec, degraded: ConditionSpec) -> list[ConditionSpec]:
    """``Reconciling`` and ``Stalled``, kstatus's conditions, from ours: without them kstatus (which reads
    only Reconciling, Stalled, Ready and observedGeneration of a custom resource) would call a canary at
    step 1 of 4 ``Current`` (Ready: the stable serves every replica) and a rolled-back revision too.
    Reconciling is Progressing=True; Stalled is a Degraded that no retry ends (:data:`STALLED_REASONS`).
    Both are always written (False when they do not hold), so no stale True is left behind."""
    stalled = degraded.status == "True" and degraded.reason in STALLED_REASONS
    return [
        ConditionSpec(
            RECONCILING,
            "True" if progressing.status == "True" else "False",
            progressing.reason,
            progressing.message if progressing.status == "True" else "",
        ),
        ConditionSpec(
            STALLED,
            "True" if stalled else "False",
            degraded.reason if stalled else "AsExpected",
            degraded.message if stalled else "",
        ),
    ]


def condition(status: ModelDeploymentStatus, type_: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == type_), None)


def flipped(old: ModelDeploymentStatus, new: ModelDeploymentStatus) -> list[Condition]:
    """Conditions whose status or reason changed (worth an event)."""
    out = []
    for c in new.conditions:
        o = condition(old, c.type)
        if o is None or o.status != c.status or o.reason != c.reason:
            out.append(c)
    return out


def phase_of(ready: bool, progressing: bool, degraded: bool, paused: bool, shadowing: bool = False) -> str:
    if degraded:
        return "Degraded"
    if progressing:
        return "Paused" if paused else ("Shadowing" if shadowing else "Progressing")
    if ready:
        return "Healthy"
    return "Pending"


# ---------------------------------------------------------------------------------------------- diff


def normalize(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    """A live status in the form :meth:`ModelDeploymentStatus.to_api` produces (for comparison)."""
    if not raw:
        return ModelDeploymentStatus().to_api()
    try:
        return ModelDeploymentStatus.model_validate(dict(raw)).to_api()
    except ValidationError:
        return dict(raw)


def _merge_patch(old: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``want``: changed keys, None for keys that
    go; nested objects are patched key by key (a merge patch merges them: a key left out would stay)."""
    patch: dict[str, Any] = {}
    for key in sorted(set(old) | set(want)):
        a, b = old.get(key), want.get(key)
        if a == b:
            continue
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            patch[key] = _merge_patch(a, b)
        else:
            patch[key] = b
    return patch


def status_patch(old_raw: Mapping[str, Any] | None, new: ModelDeploymentStatus) -> dict[str, Any] | None:
    """A JSON merge patch of ``status`` (keys that changed, at any depth; None deletes), or None if
    equal."""
    return _merge_patch(normalize(old_raw), new.to_api()) or None
