"""The CPU fallback (pure): when the GPU revision cannot serve, a CPU revision answers instead.

:func:`adjust` takes the rollout's :class:`~modeldeploy.rollout_types.Decision` and what was observed, and
returns it with the fallback applied, plus the fallback's new status and events. States
(``status.fallback.state``):

* ``Idle``: the fallback revision keeps ``idleReplicas`` warm pods, out of traffic. When the
  ModelDeployment had been serving and now has no pod in traffic outside the fallback
  (``noTrafficSince``), or has unschedulable pods and none in traffic, for ``after`` -> ``Active``.
  A first revision still loading its model is not a reason (it never served).
* ``Active``: the fallback runs ``replicas`` pods, all in traffic; every other revision is kept (its
  Deployment keeps trying: the GPU pods come back by themselves) but out of traffic, and the rollout is
  held (:func:`modeldeploy.canary.decide` with ``hold``: nothing is judged on fallback data). Once every
  pod of the stable revision is ready again (``readySince``) for ``returnAfter`` -> ``Returning``.
* ``Returning``: the decision's traffic again, the fallback's pods still in traffic until a pod of the
  GPU revision is Ready (make before break), then ``Idle``.

The fallback revision is the stable revision's spec with no GPU, no node selector or tolerations, the
fallback's CPU and memory, and the fallback's model fields where set: a revision of its own (role
``fallback``), hashed like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from . import builders
from .api import (
    FallbackSpec,
    FallbackStatus,
    ModelDeployment,
    ModelDeploymentSpec,
    ResourcesSpec,
)
from .rollout_context import seconds_of
from .rollout_types import Decision, Event, Target
from .status import RevisionCounts

RECHECK = timedelta(seconds=1)


@dataclass
class FallbackResult:
    decision: Decision  # with the fallback's targets, events and requeue time
    status: FallbackStatus | None

    @property
    def active(self) -> bool:
        return self.status is not None and self.status.state in ("Active", "Returning")


def fallback_spec(spec: ModelDeploymentSpec, fb: FallbackSpec | None = None) -> ModelDeploymentSpec | None:
    """The pod-shaping spec of the fallback revision of the serving revision ``spec`` (None without an
    enabled fallback; ``fb``: the ModelDeployment's, default ``spec.fallback``)."""
    fb = fb if fb is not None else spec.fallback
    if fb is None or not fb.enabled:
        return None
    model = spec.model
    if fb.model is not None:
        model = model.model_copy(update={k: v for k, v in fb.model.model_dump().items() if v is not None})
    return spec.model_copy(
        update={
            "model": model,
            "resources": ResourcesSpec(gpu=0, cpu=fb.cpu, memory=fb.memory),
            "node_selector": {},
            "tolerations": [],
        }
    )


@dataclass
class _Look:
    """One reconcile's view of the fallback: what the state functions read, and the events and wake-up
    times they add."""

    md: ModelDeployment
    decision: Decision
    fb: FallbackSpec
    rev: str  # the fallback revision
    old: FallbackStatus | None
    stable: RevisionCounts  # the stable revision's pods
    others_in: int  # pods in traffic outside the fallback
    now: datetime
    events: list[Event]
    wake: list[datetime]


def adjust(
    md: ModelDeployment,
    decision: Decision,
    counts: Mapping[str, RevisionCounts],
    now: datetime,
) -> FallbackResult:
    """The decision with the fallback applied (pure)."""
    stable_spec = md.spec if decision.stable == builders.spec_revision(md.spec) else None
    for t in decision.targets:
        if t.revision == decision.stable:
            stable_spec = t.spec
    fb_spec = fallback_spec(stable_spec or md.spec, md.spec.fallback)
    old = md.status.fallback
    if fb_spec is None or md.spec.fallback is None:
        if old is not None and old.state != "Idle":
            gone = Event("Warning", "FallbackRemoved", "spec.fallback removed or disabled while in traffic")
            return FallbackResult(replace(decision, events=[*decision.events, gone]), None)
        return FallbackResult(decision, None)
    rev = builders.spec_revision(fb_spec)
    look = _Look(
        md,
        decision,
        md.spec.fallback,
        rev,
        old,
        counts.get(decision.stable, RevisionCounts()),
        sum(c.pods_in_traffic for r, c in counts.items() if r != rev),
        now,
        [],
        [],
    )
    # an edit of spec.fallback makes a new fallback revision: it inherits the state (an active fallback
    # stays active, on its new revision)
    st = old.model_copy(update={"revision": rev}) if old is not None else FallbackStatus(revision=rev)
    if st.state == "Idle":
        st = _idle(look, st)
    if st.state == "Active":
        st = _active(look, st)
    if st.state == "Returning":
        st = _returning(look, st)
    return FallbackResult(_applied(look, st, fb_spec, counts.get(rev, RevisionCounts())), st)


def _idle(look: _Look, st: FallbackStatus) -> FallbackStatus:
    """No pod in traffic outside the fallback, after serving (or with unschedulable pods), for ``after``:
    the fallback takes the traffic."""
    md, fb, now, old = look.md, look.fb, look.now, look.old
    served_before = (md.status.ready_replicas or 0) > 0 or (
        old is not None and old.no_traffic_since is not None
    )
    if not (
        md.spec.replicas > 0 and look.others_in == 0 and (served_before or look.stable.unschedulable > 0)
    ):
        return st.model_copy(update={"no_traffic_since": None})
    since = st.no_traffic_since or now
    st = st.model_copy(update={"no_traffic_since": since})
    if now - since < seconds_of(fb.after):
        look.wake.append(since + seconds_of(fb.after))
        return st
    cause = _cause(look.decision.stable, look.stable, now - since)
    look.events.append(
        Event("Warning", "FallbackActivated", f"revision {look.rev} (CPU) takes the traffic: {cause}")
    )
    return FallbackStatus(revision=look.rev, state="Active", active_since=now, cause=cause)


def _active(look: _Look, st: FallbackStatus) -> FallbackStatus:
    """Every pod of the stable revision ready for ``returnAfter``: the traffic returns to it."""
    want, fb, now = look.md.spec.replicas, look.fb, look.now
    if not (want > 0 and look.stable.ready >= want):
        return st.model_copy(update={"ready_since": None})
    ready = st.ready_since or now
    st = st.model_copy(update={"ready_since": ready})
    if now - ready < seconds_of(fb.return_after):
        look.wake.append(ready + seconds_of(fb.return_after))
        return st
    look.events.append(
        Event(
            "Normal",
            "FallbackReturning",
            f"revision {look.decision.stable}: {look.stable.ready}/{want} GPU pods ready for "
            f"{fb.return_after}; traffic returns to them",
        )
    )
    return st.model_copy(update={"state": "Returning"})


def _returning(look: _Look, st: FallbackStatus) -> FallbackStatus:
    """A GPU pod in traffic again: the fallback goes idle."""
    if not look.stable.routable:  # in gatewayAPI mode: its endpoint ready in the slices too
        return st
    look.events.append(
        Event("Normal", "FallbackDeactivated", f"revision {look.decision.stable} serves again; fallback idle")
    )
    return FallbackStatus(revision=look.rev)


def _applied(look: _Look, st: FallbackStatus, fb_spec: ModelDeploymentSpec, mine: RevisionCounts) -> Decision:
    """The decision with the fallback revision's pods, and its traffic while Active or Returning."""
    decision, fb, rev = look.decision, look.fb, look.rev
    targets = [t for t in decision.targets if t.revision != rev]
    if st.state == "Active":
        targets = [replace(t, in_traffic_pods=0) for t in targets]
        targets.append(Target(rev, fb_spec, fb.replicas, "fallback", fb.replicas))
        route = True
    elif st.state == "Returning":
        targets.append(Target(rev, fb_spec, fb.replicas, "fallback", mine.pods_in_traffic))
        look.wake.append(look.now + RECHECK)
        route = True  # the gateway keeps the fallback until a GPU pod is Ready (make before break)
    else:
        if fb.idle_replicas > 0:
            targets.append(Target(rev, fb_spec, fb.idle_replicas, "fallback", 0))
        route = False
    d = replace(decision, targets=targets, events=[*decision.events, *look.events])
    d.fallback_revision = None
    if route:
        d.fallback_revision = rev
        d.degraded_reason = "FallbackActive"
        d.degraded_message = f"CPU fallback revision {rev} in traffic: {st.cause}"
    wake_at = min(look.wake) if look.wake else None
    if wake_at is not None:
        d.requeue_at = wake_at if d.requeue_at is None else min(d.requeue_at, wake_at)
    return d


def _cause(revision: str, counts: RevisionCounts, waited: timedelta) -> str:
    if counts.unschedulable:
        why = f"{counts.unschedulable} pod(s) unschedulable: {counts.scheduling_message}"
    elif counts.current == 0:
        why = "no pods"
    else:
        why = f"{counts.ready}/{counts.current} pods ready"
    return f"revision {revision} had no pod in traffic for {waited.total_seconds():.0f}s ({why})"
