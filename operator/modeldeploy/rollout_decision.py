"""The one place a reconcile's final rollout :class:`~modeldeploy.rollout_types.Decision` is made (pure):
the rollout state machine's (:func:`modeldeploy.canary.decide`), what a stable revision rebuilt from
status adds to it, then the CPU fallback's adjustment (:func:`modeldeploy.fallback.adjust`). The plan
only reads the result; nothing after this changes a Decision."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from . import canary, fallback
from . import rollout_types as rt
from .api import ModelDeployment, ModelDeploymentSpec
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
    return fallback.adjust(md, decision, counts, now)
