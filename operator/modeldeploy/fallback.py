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

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from . import builders
from .api import (
    FallbackSpec,
    FallbackStatus,
    ModelDeployment,
    ModelDeploymentSpec,
    ResourcesSpec,
    parse_duration,
)
from .rollout_types import Decision, Event, Target
from .status import RevisionCounts

RECHECK = timedelta(seconds=1)


@dataclass
class Result:
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


def _seconds(d: str) -> timedelta:
    return timedelta(seconds=parse_duration(d))


def adjust(
    md: ModelDeployment,
    decision: Decision,
    counts: dict[str, RevisionCounts],
    now: datetime,
) -> Result:
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
            return Result(replace(decision, events=[*decision.events, gone]), None)
        return Result(decision, None)
    fb = md.spec.fallback
    rev = builders.spec_revision(fb_spec)
    # an edit of spec.fallback makes a new fallback revision: it inherits the state (an active fallback
    # stays active, on its new revision)
    st = old.model_copy(update={"revision": rev}) if old is not None else FallbackStatus(revision=rev)
    mine = counts.get(rev, RevisionCounts())
    others_in = sum(c.in_traffic for r, c in counts.items() if r != rev)
    stable = counts.get(decision.stable, RevisionCounts())
    want = md.spec.replicas
    events: list[Event] = []
    wake: list[datetime] = []

    if st.state == "Idle":
        served_before = (md.status.ready_replicas or 0) > 0 or (
            old is not None and old.no_traffic_since is not None
        )
        if want > 0 and others_in == 0 and (served_before or stable.unschedulable > 0):
            since = st.no_traffic_since or now
            st = st.model_copy(update={"no_traffic_since": since})
            if now - since >= _seconds(fb.after):
                cause = _cause(decision.stable, stable, now - since)
                st = FallbackStatus(revision=rev, state="Active", active_since=now, cause=cause)
                events.append(
                    Event("Warning", "FallbackActivated", f"revision {rev} (CPU) takes the traffic: {cause}")
                )
            else:
                wake.append(since + _seconds(fb.after))
        else:
            st = st.model_copy(update={"no_traffic_since": None})

    if st.state == "Active":
        if want > 0 and stable.ready >= want:
            ready = st.ready_since or now
            st = st.model_copy(update={"ready_since": ready})
            if now - ready >= _seconds(fb.return_after):
                st = st.model_copy(update={"state": "Returning"})
                events.append(
                    Event(
                        "Normal",
                        "FallbackReturning",
                        f"revision {decision.stable}: {stable.ready}/{want} GPU pods ready for "
                        f"{fb.return_after}; traffic returns to them",
                    )
                )
            else:
                wake.append(ready + _seconds(fb.return_after))
        else:
            st = st.model_copy(update={"ready_since": None})

    if st.state == "Returning" and stable.in_traffic > 0:
        events.append(
            Event("Normal", "FallbackDeactivated", f"revision {decision.stable} serves again; fallback idle")
        )
        st = FallbackStatus(revision=rev)

    targets = [t for t in decision.targets if t.revision != rev]
    if st.state == "Active":
        targets = [replace(t, in_traffic_pods=0) for t in targets]
        targets.append(Target(rev, fb_spec, fb.replicas, "fallback", fb.replicas))
        route = True
    elif st.state == "Returning":
        targets.append(Target(rev, fb_spec, fb.replicas, "fallback", mine.in_traffic))
        wake.append(now + RECHECK)
        route = True  # the gateway keeps the fallback until a GPU pod is Ready (make before break)
    else:
        if fb.idle_replicas > 0:
            targets.append(Target(rev, fb_spec, fb.idle_replicas, "fallback", 0))
        route = False
    d = replace(decision, targets=targets, events=[*decision.events, *events])
    d.fallback_revision = None
    if route:
        d.fallback_revision = rev
        d.degraded_reason = "FallbackActive"
        d.degraded_message = f"CPU fallback revision {rev} in traffic: {st.cause}"
    wake_at = min(wake) if wake else None
    if wake_at is not None:
        d.requeue_at = wake_at if d.requeue_at is None else min(d.requeue_at, wake_at)
    return Result(d, st)


def _cause(revision: str, counts: RevisionCounts, waited: timedelta) -> str:
    if counts.unschedulable:
        why = f"{counts.unschedulable} pod(s) unschedulable: {counts.scheduling_message}"
    elif counts.current == 0:
        why = "no pods"
    else:
        why = f"{counts.ready}/{counts.current} pods ready"
    return f"revision {revision} had no pod in traffic for {waited.total_seconds():.0f}s ({why})"
