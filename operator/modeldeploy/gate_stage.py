"""The rollout's gates (pure; part of :mod:`modeldeploy.canary`): ``spec.rollout.gates.beforeFirstStep``
and ``beforePromotion``, Flagger's confirm-rollout and confirm-promotion.

* **beforeFirstStep**: once the shadow stage passed (or at the canary's start without one) the canary's
  pods come up warm, out of traffic; step 0's pods go into traffic (and its clock and
  ``progressDeadline`` start) only once the gate is open.
* **beforePromotion**: once the last step's analysis passed, promotion waits until the gate is open; the
  last step's windows go on being judged meanwhile (a failed one rolls back, as Flagger keeps running its
  checks while a promotion waits).

A gate is open when its URL answered 200; anything else (another status, no answer in time, a refused
connection, a host not allowed) keeps it closed, and it is asked again every few seconds
(:mod:`modeldeploy.gates` asks, off the reconcile path; :class:`rollout_types.Gates` hands the newest
answer in). A closed gate never fails or rolls back anything by itself; ``kubectl modeldeploy promote
[--full]`` and ``abort`` go past it. ``status.gate`` says which gate is waited for, at which host, since
when and what it last answered -- the class of it only (``HTTP 403``, or the one text of every failure to
get an HTTP answer: the author reads it, the operator's network position is not theirs) -- and the
Progressing condition's reason is ``WaitingForGate``."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from .api import GateName, GateSpec, GateStatus, parse_duration
from .api_base import url_origin
from .rollout_context import ReconcileContext
from .rollout_types import CanaryDecision, CanaryStep, Event, GateAnswer, Promote

#: how soon a closed gate's status is looked at again (a finished answer also asks for a reconcile)
GATE_RECHECK = timedelta(seconds=3)

#: the message of a gate asked but not answered yet
ASKING = "asking"

WHEN: dict[GateName, str] = {
    "beforeFirstStep": "before the first step",
    "beforePromotion": "before promotion",
}


def gate_spec(ctx: ReconcileContext, gate: GateName) -> GateSpec | None:
    gates = ctx.rollout.gates
    if gates is None:
        return None
    return gates.before_first_step if gate == "beforeFirstStep" else gates.before_promotion


def waiting(cs: CanaryStep, gate: GateName | None = None) -> GateStatus | None:
    """The gate ``cs`` waits at (of kind ``gate``, if given), if any."""
    g = cs.gate
    if g is None or g.opened_at is not None or (gate is not None and g.gate != gate):
        return None
    return g


def opened(ctx: ReconcileContext, cs: CanaryStep, gate: GateName) -> bool:
    g = cs.gate
    return g is not None and g.gate == gate and g.revision == ctx.current and g.opened_at is not None


def holds_traffic(cs: CanaryStep) -> bool:
    """The canary waits at beforeFirstStep: its pods stay out of traffic."""
    return waiting(cs, "beforeFirstStep") is not None and cs.step == 0 and cs.started is None


def ask(ctx: ReconcileContext, cs: CanaryStep, gate: GateName, spec: GateSpec) -> GateStatus:
    """Ask ``gate`` (its newest answer): open -> opened now (an event); closed -> waiting, with its answer
    (an event when the wait starts, once the first answer is in), looked at again shortly."""
    current, now = ctx.current, ctx.now
    answer: GateAnswer | None = GateAnswer(False, "no gate asker in this operator")
    if ctx.gates is not None:
        answer = ctx.gates.ask(
            ctx.md.namespace, ctx.md.name, current, gate, spec.url, parse_duration(spec.timeout)
        )
    host = url_origin(spec.url)
    before = waiting(cs, gate)
    if before is not None and before.revision != current:
        before = None
    since = before.waiting_since if before is not None and before.waiting_since else now
    if answer is not None and answer.open:
        waited = (now - since).total_seconds()
        ctx.events.append(
            Event(
                "Normal",
                "GateOpened",
                f"revision {current}: gate {gate} ({host}) is open ({answer.reason}) after {waited:.0f}s; "
                "the rollout goes on",
            )
        )
        return GateStatus(
            gate=gate, revision=current, host=host, waiting_since=since, opened_at=now, message=answer.reason
        )
    said = answer.reason[:1024] if answer is not None else ASKING
    if answer is not None and (before is None or before.message == ASKING):
        ctx.events.append(
            Event(
                "Normal",
                "GateWaiting",
                f"revision {current}: waiting for gate {gate} ({host}) {WHEN[gate]}: {said}",
            )
        )
    ctx.wake_at(now + GATE_RECHECK)
    return GateStatus(gate=gate, revision=current, host=host, waiting_since=since, message=said)


def before_first_step(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """Step 0 before its pods are in traffic: ask beforeFirstStep until it is open (not in the shadow
    stage; a gate no longer in the spec, or a step promoted by hand, no longer holds anything)."""
    if cs.shadow is not None:
        return cs, None
    spec = gate_spec(ctx, "beforeFirstStep")
    if cs.step != 0 or cs.started is not None or spec is None:
        return (replace(cs, gate=None) if waiting(cs, "beforeFirstStep") else cs), None
    if opened(ctx, cs, "beforeFirstStep"):
        return cs, None
    g = ask(ctx, cs, "beforeFirstStep", spec)
    if g.opened_at is None:
        return replace(cs, gate=g, waiting=None), None
    # open: step 0's pods go into traffic now; its progressDeadline counts from here
    return replace(cs, gate=g, waiting=ctx.now), None


def promotion_waiting(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """Waiting at beforePromotion (the last step passed): promoted once the gate is open. Until then the
    last step's windows go on being judged (:func:`canary._judging`)."""
    g = waiting(cs, "beforePromotion")
    if g is None or g.revision != ctx.current:
        return cs, None
    last = len(ctx.rollout.steps) - 1
    if cs.step != last or cs.shadow is not None:
        return replace(cs, gate=None), None
    spec = gate_spec(ctx, "beforePromotion")
    if spec is None:
        return replace(cs, gate=None), Promote(
            f"all {last + 1} steps passed; spec.rollout.gates.beforePromotion was removed"
        )
    return gated_promotion(ctx, cs, f"all {last + 1} steps passed")


def gated_promotion(
    ctx: ReconcileContext, cs: CanaryStep, reason: str
) -> tuple[CanaryStep, CanaryDecision | None]:
    """The last step passed (``reason``): promoted, unless beforePromotion is set and not open yet."""
    spec = gate_spec(ctx, "beforePromotion")
    if spec is None:
        return cs, Promote(reason)
    g = ask(ctx, cs, "beforePromotion", spec)
    cs = replace(cs, gate=g)
    if g.opened_at is None:
        return cs, None
    return cs, Promote(f"{reason}; gate beforePromotion ({g.host}) open")


def gate_message(g: GateStatus) -> str:
    """The Progressing condition's message while ``g`` is waited for."""
    since = g.waiting_since.strftime("%H:%M:%SZ") if g.waiting_since else "now"
    return f"waiting for gate {g.gate} ({g.host}) {WHEN[g.gate]} since {since}: {g.message}"
