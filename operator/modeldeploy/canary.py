"""Progressive delivery: the rollout state machine (pure).

:func:`decide` turns a ModelDeployment (spec, and the rollout state in its status), the revision of the
current spec, what is running, the time, and -- when a window is due -- an analysis judgement into the
revisions to run (pods, role, how many of their pods in traffic), the new rollout state, history entries
and events. Nothing here does I/O: the analysis is passed in as a function (:data:`Measure`), called only
when a window is due, so the unit tests drive the whole machine with a fake clock and fake verdicts.

The rules (docs/operator.md, "Progressive delivery"):

* The first revision goes straight to 100 %.
* With ``rollout.shadow`` a new revision first *shadows* the stable one (phase Shadowing): its pods are
  warm and out of traffic, the stable servers copy ``sampleRate`` of the requests they answer to it
  (:class:`Mirror`, carried to them by a pod annotation) and compare the answers. The stage's clock
  starts once every stable server reports copying (:class:`Probe`); at the end of ``duration`` (and
  every ``interval`` before, if shorter) agreement, the shadow's error rate and p99 are judged: fail ->
  rollback before any user saw the revision; pass -> the canary steps begin.
* A new revision starts a canary at ``steps[0]``. A step's clock starts when its pods are in traffic;
  after ``interval`` the last window is judged (:mod:`modeldeploy.analysis`): pass -> next step (after
  the last step, 100, promotion); fail (``failureLimit`` consecutive failed windows, or no data past
  ``noDataTimeout``) -> rollback; hold -> judged again one interval later.
* A newer revision mid-rollout supersedes the canary (history ``Superseded``) and starts its own.
  Reverting the spec to the stable revision aborts the canary.
* ``paused``: the current step is held and not judged.
* Rollback: the canary's pods leave traffic at once (readiness gate / route weight 0), the stable takes
  100 %; the failed revision is scaled down (kept out of traffic for ``abortScaleDownDelay`` first);
  phase Degraded until the spec changes; history ``RolledBack`` with the failing measurement.
* Promotion: the canary becomes stable; the old stable becomes *previous* and keeps
  ``keepPrevious.replicas`` pods warm, out of traffic, for ``keepPrevious.ttl``.
* During ``bakeTime`` after a promotion the same analysis runs on the new stable; a failure fails back to
  the warm previous revision: its warm pods go into traffic at once (no restart), it is scaled back up,
  the failed revision leaves traffic and is scaled down (history ``FailedBack``).
* Commands (the ``modeldeploy.io/command`` annotation, written by ``kubectl modeldeploy``) are
  conditional on the state they were issued against (the canary revision and step, the stable revision),
  so handling one twice -- e.g. after an operator restart -- changes nothing.

Traffic in ``replicas`` mode: the stable revision keeps all its pods during a canary (surge), and only
``s`` of them are in traffic next to ``c`` canary pods, with ``c / (c + s)`` as close as possible to the
step's weight (:func:`replica_split`); so a rollback is a readiness-gate flip, never a pod start. In
``gatewayAPI`` mode every pod of both revisions is in traffic and the HTTPRoute carries exact weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Literal

from .api import (
    AnalysisStatus,
    ModelDeployment,
    ModelDeploymentSpec,
    ShadowStatus,
)
from .gate_stage import (
    before_first_step,
    gate_message,
    gated_promotion,
    holds_traffic,
    promotion_waiting,
    waiting,
)
from .oom import describe as describe_oom
from .rollout_context import ReconcileContext, seconds_of, window_due
from .rollout_types import (
    FAILED_KINDS,
    CanaryDecision,
    CanaryStep,
    Decision,
    Event,
    FailBack,
    Gates,
    Measure,
    NextStep,
    Probe,
    Promote,
    RollBack,
    Target,
    agreement_mirror,
    analysis_paused,
    has_failed,
    latest_entry,
)
from .shadow_stage import end_shadow, shadow_progressing, shadowing
from .status import RevisionCounts
from .traffic_split import gateway_canary_pods, replica_split

# ---------------------------------------------------------------------------------------------- helpers


# ---------------------------------------------------------------------------------------------- context


# ---------------------------------------------------------------------------------------------- decisions
#
# What a state function decides, as data; :func:`_canary` and :func:`_stable` carry them out.


# ---------------------------------------------------------------------------------------------- decide

State = Literal["deployed", "stable", "canary", "lost"]


def state_of(ctx: ReconcileContext) -> State:
    """Which state the rollout is in.

    ``deployed``: the first revision, or the stable revision is gone beyond repair (its Deployment is
    missing or unreadable and status recorded no spec to rebuild it from; see :func:`plan.plan`) --
    straight to 100 %, unless the current revision failed: ``lost``, nothing of it goes into traffic
    without a new spec or ``kubectl modeldeploy promote --full``;
    ``stable``: at rest on the stable revision (the spec is the stable one, or the current revision
    failed), baking it after a promotion, or failing back from it; ``canary``: a canary of the current
    revision.
    """
    stable = ctx.md.status.stable_revision
    failed = has_failed(ctx.history, ctx.current)
    if stable is not None and stable != ctx.current and ctx.live.get(stable) is None:
        return "lost" if failed else "deployed"
    if stable is None:
        return "deployed"
    if ctx.current == stable or failed:
        return "stable"
    return "canary"


def decide(
    md: ModelDeployment,
    current: str,
    live_specs: Mapping[str, ModelDeploymentSpec | None],
    counts: Mapping[str, RevisionCounts],
    now: datetime,
    measure: Measure | None = None,
    probe: Probe | None = None,
    hold: bool = False,
    gates: Gates | None = None,
) -> Decision:
    """The rollout decision for one reconcile (pure, given a pure ``measure``, ``probe`` and ``gates``);
    ``hold``: the CPU fallback is in traffic, nothing is judged."""
    ctx = ReconcileContext.observe(md, current, live_specs, counts, now, measure, probe, hold, gates)
    return ctx.finish(_make_before_break(ctx, STATES[state_of(ctx)](ctx)))


def _resumed(
    ctx: ReconcileContext, analysis: AnalysisStatus | None, *revisions: str
) -> AnalysisStatus | None:
    """``kubectl modeldeploy resume`` issued against one of ``revisions``: an analysis paused by query
    errors is judged again (its error count starts over)."""
    cmd = ctx.command_for(None, *revisions)
    if cmd is None or cmd.action != "resume" or analysis is None or not analysis_paused(analysis):
        return analysis
    ctx.events.append(
        Event("Normal", "AnalysisResumed", f"analysis resumed by hand (was: {analysis.paused_reason})")
    )
    return analysis.model_copy(
        update={"paused_reason": None, "consecutive_errors": 0, "consecutive_inconclusive": 0}
    )


#: how soon a handover (see :func:`_make_before_break`) is looked at again, watch events aside
HANDOVER_RECHECK = timedelta(seconds=1)


def _make_before_break(ctx: ReconcileContext, d: Decision) -> Decision:
    """No moment without a pod in traffic: while none of the revisions the decision puts in traffic has a
    Ready pod yet (a failback to warm pods whose gates are only now turned True; a rollback to a stable
    whose pods are down), the revisions whose pods are still in traffic keep them there, running. They
    leave at the first reconcile after a pod of the new stable is Ready -- in gatewayAPI mode, once its
    endpoint is ready in its Service's EndpointSlices too (``RevisionCounts.routable``; the pod's status
    change and the slice's are watch events), so a switch trades a moment of the old revision's answers
    for what would otherwise be a moment with no endpoint at all (every request refused)."""
    wanted = {t.revision for t in d.targets if t.in_traffic_pods > 0}
    if ctx.replicas == 0 or not wanted or any(ctx.routable(rev) for rev in wanted):
        return d
    by_rev = {t.revision: t for t in d.targets}
    kept = False
    for rev, counts in sorted(ctx.counts.items()):
        spec = ctx.live.get(rev)
        if rev in wanted or counts.pods_in_traffic == 0 or spec is None:
            continue
        t = by_rev.get(rev)
        replicas = max(t.replicas if t else 0, counts.current)
        by_rev[rev] = Target(rev, spec, replicas, t.role if t else "old", counts.pods_in_traffic)
        kept = True
    if kept:
        d.targets = list(by_rev.values())
        ctx.wake_at(ctx.now + HANDOVER_RECHECK)
    return d


def _deployed(ctx: ReconcileContext) -> Decision:
    """The first revision, or the stable revision is gone beyond repair: straight to 100 %, nothing to
    bake (recorded as Deployed: no canary judged it)."""
    gone = ctx.md.status.stable_revision
    current, n = ctx.current, ctx.replicas
    if gone is None:
        ctx.record(current, "Deployed", "first revision: straight to 100%")
    else:
        ctx.record(
            current,
            "Deployed",
            f"stable revision {gone} is gone and status recorded no spec to rebuild it from: "
            "straight to 100% without a canary",
        )
    ready = ctx.pods_in_traffic(current)
    return Decision(
        targets=[Target(current, ctx.spec, n, "stable", n)],
        stable=current,
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {current}: {ready}/{n} pods ready",
        command_seen=ctx.command is not None,
    )


def _lost(ctx: ReconcileContext) -> Decision:
    """The stable revision's Deployment is gone beyond repair and the current revision failed: the failed
    revision stays out of traffic (never promoted because it is all there is); Degraded says what to do.
    ``kubectl modeldeploy promote --full`` against it is the explicit command that puts it in."""
    gone, current, n = ctx.stable, ctx.current, ctx.replicas
    cmd = ctx.command_for(current)
    if cmd is not None and cmd.action == "promote" and cmd.full:
        ctx.record(current, "Promoted", f"promoted by hand (promote --full) with stable {gone} gone")
        return Decision(
            targets=[Target(current, ctx.spec, n, "stable", n)],
            stable=current,
            progressing_reason="ScalingUp" if ctx.pods_in_traffic(current) < n else None,
            progressing_message=f"revision {current}: {ctx.pods_in_traffic(current)}/{n} pods ready",
            command_seen=True,
        )
    failed = latest_entry(ctx.history, current)
    assert failed is not None
    return Decision(
        targets=ctx.failed_kept(),
        stable=gone,
        degraded_reason="StableMissing",
        degraded_message=(
            f"the stable revision {gone} has no Deployment and no recorded spec to rebuild it from; revision "
            f"{current} {failed.outcome} and stays out of traffic: change the spec, or "
            "`kubectl modeldeploy promote --full` to put it in traffic anyway"
        ),
        command_seen=ctx.command is not None,
    )


# -- stable: at rest, baking, failing back


def _stable(ctx: ReconcileContext) -> Decision:
    """At rest on the stable revision; during ``bakeTime`` after a promotion, baking it; failing back
    from it to the warm previous revision (bake failure or ``kubectl modeldeploy rollback``)."""
    _abort_canary(ctx)
    analysis = ctx.md.status.analysis
    failback = _rollback_command(ctx)
    if failback is None:
        analysis, failback = _baking(ctx, analysis)
    if failback is not None:
        return _failed_back(ctx, analysis, failback)
    return _at_rest(ctx, analysis)


def _rollback_command(ctx: ReconcileContext) -> FailBack | None:
    """``kubectl modeldeploy rollback``, when issued against the stable revision; without a warm previous
    revision it is refused with a warning."""
    cmd = ctx.command
    if cmd is None or cmd.action != "rollback":
        return None
    if ctx.previous is None:
        ctx.events.append(Event("Warning", "RollbackImpossible", "no warm previous revision to roll back to"))
        return None
    if cmd.revision not in (None, ctx.stable):
        return None
    return FailBack("manual rollback (kubectl modeldeploy rollback)")


def _abort_canary(ctx: ReconcileContext) -> None:
    """The spec went back to the stable revision mid-canary: the canary is aborted."""
    canary = ctx.md.status.canary_revision
    if canary is None or canary in (ctx.stable, ctx.current) or has_failed(ctx.history, canary):
        return  # no canary, or it has just failed (already recorded)
    ctx.record(canary, "Aborted", "the spec went back to the stable revision")


def _bake_end(ctx: ReconcileContext) -> datetime | None:
    """When the bake of the stable revision ends, while it bakes (promoted, with a warm previous)."""
    if ctx.previous is None:
        return None
    promoted = latest_entry(ctx.history, ctx.stable)
    if promoted is None or promoted.kind != "Promoted":
        return None
    end = promoted.time + seconds_of(ctx.rollout.bake_time)
    return end if ctx.now < end else None


def _baking(
    ctx: ReconcileContext, analysis: AnalysisStatus | None
) -> tuple[AnalysisStatus | None, FailBack | None]:
    """During ``bakeTime`` after a promotion (with a warm previous to fail back to), the canary's analysis
    goes on on the new stable revision (its agreement with the warm previous one, with minAgreement)."""
    end = _bake_end(ctx)
    if end is None:
        return analysis, None
    stable = ctx.stable
    promoted = latest_entry(ctx.history, stable)
    assert promoted is not None
    due = window_due(ctx.rollout, promoted.time, analysis)
    analysis = _resumed(ctx, analysis, stable)
    if ctx.hold or analysis_paused(analysis):
        ctx.wake_at(end)
        return analysis, None
    if ctx.now >= due and ctx.measure is not None:
        out = ctx.judge(stable, None, analysis, "bake", "bake", agreement_with=ctx.previous)
        if out is not None:
            analysis = out.state
            if out.action == "fail":
                return analysis, FailBack(f"failed during bakeTime: {out.reason}", out.failing)
            ctx.wake_at(window_due(ctx.rollout, promoted.time, analysis))
    else:
        ctx.wake_at(due)
    ctx.wake_at(end)
    return analysis, None


def _failed_back(ctx: ReconcileContext, analysis: AnalysisStatus | None, fb: FailBack) -> Decision:
    """The warm previous revision's pods go into traffic at once (no restart), it is scaled back up; the
    failed stable leaves traffic and is scaled down."""
    stable, previous, n = ctx.stable, ctx.previous, ctx.replicas
    assert previous is not None
    ctx.record(stable, "FailedBack", f"{fb.reason}; back to {previous}", fb.measurement)
    targets = [Target(previous, ctx.spec_of(previous), n, "stable", n), *ctx.failed_kept(previous)]
    ready = ctx.pods_in_traffic(previous)
    return Decision(
        targets=targets,
        stable=previous,
        analysis=analysis,
        progressing_reason="ScalingUp" if ready < n else None,
        progressing_message=f"revision {previous}: {ready}/{n} pods ready",
        degraded_reason="FailedBack",
        degraded_message=f"revision {stable} failed back to {previous}: {fb.reason}",
        command_seen=ctx.command is not None,
    )


def _at_rest(ctx: ReconcileContext, analysis: AnalysisStatus | None) -> Decision:
    stable, current, n = ctx.stable, ctx.current, ctx.replicas
    targets = [
        Target(stable, ctx.spec_of(stable), n, "stable", n),
        *ctx.warm_previous(),
        *ctx.failed_kept(stable, ctx.previous or ""),
    ]
    ready = ctx.pods_in_traffic(stable)
    d = Decision(
        targets=targets,
        stable=stable,
        previous=ctx.previous,
        previous_expires_at=ctx.previous_expires_at if ctx.previous else None,
        analysis=analysis,
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {stable}: {ready}/{n} pods ready",
        command_seen=ctx.command is not None,
    )
    if ctx.previous is not None and _bake_end(ctx) is not None:
        d.mirror = agreement_mirror(ctx.rollout, stable, ctx.previous)
    failed = latest_entry(ctx.history, current) if current != stable else None
    if failed is not None and failed.kind in FAILED_KINDS:
        d.degraded_reason = failed.outcome
        d.degraded_message = f"revision {current} {failed.outcome}: {failed.reason}"
    return d


# -- canary: deploying, (shadow), step, judging; then promoted, rolled back, or still progressing


def _canary(ctx: ReconcileContext) -> Decision:
    """A canary of the current revision: each state function in turn, until one decides."""
    cs = _deploying(ctx)
    decision: CanaryDecision | None = None
    for state in (_command, _oom_killed, shadowing, before_first_step, _step, promotion_waiting, _judging):
        cs, decision = state(ctx, cs)
        if decision is not None:
            break
    if isinstance(decision, NextStep):
        cs = _next_step(ctx, cs)
    elif isinstance(decision, Promote):
        return _promoted(ctx, cs, decision)
    elif isinstance(decision, RollBack):
        return _rolled_back(ctx, cs, decision)
    return _progressing(ctx, cs)


def _deploying(ctx: ReconcileContext) -> CanaryStep:
    """Resume the canary of the current revision, or start it (superseding an older canary)."""
    st, current, steps = ctx.md.status, ctx.current, ctx.rollout.steps
    canary = st.canary_revision
    if canary == current:
        shadow = st.shadow if st.shadow is not None and st.shadow.revision == current else None
        gate = st.gate if st.gate is not None and st.gate.revision == current else None
        step = min(st.step or 0, len(steps) - 1)
        return CanaryStep(step, st.step_started_at, st.step_waiting_since, st.analysis, shadow, gate)
    if canary is not None and canary != ctx.stable and not has_failed(ctx.history, canary):
        ctx.record(canary, "Superseded", f"superseded by revision {current}")
    sh = ctx.rollout.shadow
    if sh is not None:
        ctx.events.append(
            Event(
                "Normal",
                "ShadowStarted",
                f"revision {current}: shadow stage started ({sh.duration} on {sh.sample_rate:g} of the "
                f"stable revision's requests, then steps {steps})",
            )
        )
        return CanaryStep(
            0, None, None, AnalysisStatus(), ShadowStatus(revision=current, waiting_since=ctx.now)
        )
    ctx.events.append(Event("Normal", "CanaryStarted", f"revision {current}: canary started, steps {steps}"))
    return CanaryStep(0, None, None, AnalysisStatus())


def _command(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """``kubectl modeldeploy abort|rollback|promote``, when issued against this canary and step."""
    cmd = ctx.command_for(None, ctx.current)
    if cmd is None:
        return cs, None
    if cmd.action in ("abort", "rollback"):
        return cs, RollBack("Aborted", "aborted (kubectl modeldeploy abort)")
    if cmd.action == "resume":
        return replace(cs, analysis=_resumed(ctx, cs.analysis, ctx.current)), None
    if cmd.action == "promote" and cmd.full:
        return cs, Promote("promoted by hand (kubectl modeldeploy promote --full)")
    if cmd.action == "promote" and cmd.shadow:
        if cs.shadow is None:
            return cs, None  # issued against a shadow stage that is over: stale
        ctx.events.append(
            Event("Normal", "ShadowSkipped", f"revision {ctx.current}: shadow stage skipped by hand")
        )
        return end_shadow(ctx, cs), None
    if cs.shadow is not None:
        return cs, None  # a step command does not apply to the shadow stage
    if cmd.action == "promote" and cmd.step == cs.step:
        if cs.step + 1 >= len(ctx.rollout.steps):
            return cs, Promote("promoted by hand at the last step (kubectl modeldeploy promote)")
        ctx.events.append(
            Event(
                "Normal", "StepPromoted", f"revision {ctx.current}: step {cs.step} -> {cs.step + 1} by hand"
            )
        )
        return replace(cs, step=cs.step + 1, started=None, waiting=None), None
    return cs, None


def _oom_killed(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """A canary pod's container killed by the kernel for its memory limit fails the canary at once, in
    any stage (shadow, a closed gate, a step, paused too): the revision cannot serve within its limit,
    and waiting for ``progressDeadline`` would only hide why."""
    kill = ctx.counts.get(ctx.current, RevisionCounts()).oom
    if kill is None:
        return cs, None
    return cs, RollBack("RolledBack", describe_oom(kill))


def _split(ctx: ReconcileContext, step: int) -> tuple[int, int]:
    """(canary pods, stable pods in traffic) at ``step``."""
    n, weight = ctx.replicas, ctx.rollout.steps[step]
    if ctx.rollout.traffic_routing.mode == "replicas":
        return replica_split(n, weight)
    return gateway_canary_pods(n, weight), n


def _step(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """The step's pods: its clock starts once they are in traffic; waiting for them never lasts past
    ``progressDeadline`` (never silently forever), except while paused; none while a gate holds the
    traffic (:func:`gate_stage.before_first_step`)."""
    if cs.shadow is not None or holds_traffic(cs):
        return cs, None
    if cs.started is not None:
        return replace(cs, waiting=None), None
    ro, now = ctx.rollout, ctx.now
    c_pods, _ = _split(ctx, cs.step)
    have = ctx.counts.get(ctx.current, RevisionCounts())
    if have.pods_in_traffic >= c_pods:
        return replace(cs, started=now, waiting=None), None
    cs = replace(cs, waiting=cs.waiting or now)
    assert cs.waiting is not None
    if ctx.frozen:
        return cs, None
    deadline = cs.waiting + seconds_of(ro.progress_deadline)
    if now >= deadline:
        why = f"{have.pods_in_traffic}/{c_pods} canary pods in traffic"
        if have.unschedulable:
            why += f"; {have.unschedulable} unschedulable: {have.scheduling_message}"
        weight = ro.steps[cs.step]
        reason = f"progressDeadline {ro.progress_deadline} exceeded at step {cs.step} ({weight}%): {why}"
        return cs, RollBack("Aborted", reason)
    ctx.wake_at(deadline)
    return cs, None


def _judging(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """A step whose interval is over is judged: pass -> next step (or promotion after the last),
    fail -> rollback, hold -> judged again one interval later. Not while paused."""
    ro, started = ctx.rollout, cs.started
    if started is None or ctx.frozen or cs.shadow is not None or analysis_paused(cs.analysis):
        return cs, None
    due = window_due(ro, started, cs.analysis)
    if ctx.now < due or ctx.measure is None:
        ctx.wake_at(due)
        return cs, None
    step, weight = cs.step, ro.steps[cs.step]
    stable = ctx.stable if weight < 100 else None
    out = ctx.judge(
        ctx.current,
        stable,
        cs.analysis,
        "canary",
        f"step {step + 1}/{len(ro.steps)} at {weight}%",
        agreement_with=stable and ctx.current,
    )
    if out is None:
        return cs, None
    cs = replace(cs, analysis=out.state)
    if out.action == "fail":
        reason = f"analysis failed at step {step} ({weight}%): {out.reason}"
        return cs, RollBack("RolledBack", reason, out.failing)
    if out.action == "pass":
        if step + 1 >= len(ro.steps):
            return gated_promotion(ctx, cs, f"all {len(ro.steps)} steps passed")
        return cs, NextStep()
    ctx.wake_at(window_due(ro, started, cs.analysis))
    return cs, None


def _next_step(ctx: ReconcileContext, cs: CanaryStep) -> CanaryStep:
    """On to the next step; it starts at once when enough canary pods are already in traffic."""
    step = cs.step + 1
    ctx.events.append(
        Event("Normal", "StepAdvanced", f"revision {ctx.current}: step {step} ({ctx.rollout.steps[step]}%)")
    )
    c_pods, _ = _split(ctx, step)
    if ctx.pods_in_traffic(ctx.current) >= c_pods:
        cs = replace(cs, step=step, started=ctx.now)
        ctx.wake_at(window_due(ctx.rollout, ctx.now, cs.analysis))
        return cs
    return replace(cs, step=step, started=None, waiting=ctx.now)


def _progressing(ctx: ReconcileContext, cs: CanaryStep) -> Decision:
    """Mid-canary: the stable keeps all its pods, ``s`` of them in traffic next to the step's canary pods.
    In the shadow stage: every stable pod in traffic, the shadow's pods warm and out of traffic."""
    if cs.shadow is not None:
        return shadow_progressing(ctx, cs, cs.shadow)
    stable, current, ro = ctx.stable, ctx.current, ctx.rollout
    steps, weight = ro.steps, ro.steps[cs.step]
    c_pods, s_in = _split(ctx, cs.step)
    held = holds_traffic(cs)
    if held:  # beforeFirstStep is closed: the canary's pods come up warm, the stable keeps all traffic
        s_in, weight = ctx.replicas, 0
    elif s_in == 0:
        # at 100 % the stable has no pod in traffic of its own: its pods stand in for the canary pods that
        # are not (yet, or no longer: their node lost) in traffic, so the Service never runs out of
        # endpoints. Below 100 % the stable keeps a pod in traffic: missing canary pods cost capacity only
        s_in = ctx.replicas - min(ctx.pods_in_traffic(current), c_pods)
    warm = ctx.warm_previous(stable, current)
    previous = ctx.previous if warm else None
    targets = [
        Target(stable, ctx.spec_of(stable), ctx.replicas, "stable", s_in),
        Target(current, ctx.spec, c_pods, "canary", 0 if held else c_pods),
        *warm,
        *ctx.failed_kept(stable, current, previous or ""),
    ]
    pending = "" if cs.started is not None or held else " (waiting for its pods)"
    paused = " (paused)" if ro.paused else ""
    message = f"revision {current}: step {cs.step + 1}/{len(steps)} at {weight}%{pending}{paused}"
    reason = "CanaryPaused" if ro.paused else "CanaryProgressing"
    gate = waiting(cs)
    if gate is not None:
        reason, message = "WaitingForGate", f"{message}: {gate_message(gate)}"
    if analysis_paused(cs.analysis):
        assert cs.analysis is not None
        reason, message = "AnalysisPaused", f"{message}: {cs.analysis.paused_reason}"
    return Decision(
        targets=targets,
        stable=stable,
        canary=current,
        previous=previous,
        previous_expires_at=ctx.previous_expires_at if warm else None,
        weight=weight,
        step=cs.step,
        step_started_at=cs.started,
        step_waiting_since=cs.waiting,
        analysis=cs.analysis,
        progressing_reason=reason,
        progressing_message=message,
        command_seen=ctx.command is not None,
        mirror=agreement_mirror(ro, stable, current) if weight < 100 else None,
        gate=cs.gate,
    )


def _promoted(ctx: ReconcileContext, cs: CanaryStep, p: Promote) -> Decision:
    """The canary becomes stable; the old stable keeps ``keepPrevious.replicas`` pods warm, out of
    traffic, for ``keepPrevious.ttl``; the bake analysis starts one interval later."""
    stable, current, ro, now, n = ctx.stable, ctx.current, ctx.rollout, ctx.now, ctx.replicas
    ctx.record(current, "Promoted", p.reason)
    keep = ro.keep_previous.replicas
    targets = [Target(current, ctx.spec, n, "stable", n)]
    new_prev: str | None = None
    expires: datetime | None = None
    if keep > 0:
        new_prev, expires = stable, now + seconds_of(ro.keep_previous.ttl)
        targets.append(Target(stable, ctx.spec_of(stable), keep, "previous", 0))
        ctx.wake_at(expires)
    if ctx.previous is not None and ctx.previous != stable:
        ctx.events.append(
            Event("Normal", "PreviousReplaced", f"revision {ctx.previous}: no longer kept warm")
        )
    if seconds_of(ro.bake_time).total_seconds() > 0 and new_prev is not None:
        ctx.wake_at(now + seconds_of(ro.interval))
    ready = ctx.pods_in_traffic(current)
    return Decision(
        targets=targets,
        stable=current,
        previous=new_prev,
        previous_expires_at=expires,
        analysis=AnalysisStatus(measurements=cs.analysis.measurements if cs.analysis else []),
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {current} promoted; replaced {stable}",
        command_seen=ctx.command is not None,
    )


def _rolled_back(ctx: ReconcileContext, cs: CanaryStep, rb: RollBack) -> Decision:
    """The canary's pods leave traffic at once, the stable takes 100 %; the failed revision is scaled down
    (kept out of traffic for ``abortScaleDownDelay`` first); Degraded until the spec changes."""
    stable, current, n = ctx.stable, ctx.current, ctx.replicas
    ctx.record(current, rb.kind, rb.reason, rb.measurement)
    warm = ctx.warm_previous()
    targets = [
        Target(stable, ctx.spec_of(stable), n, "stable", n),
        *warm,
        *ctx.failed_kept(stable, ctx.previous or ""),
    ]
    return Decision(
        targets=targets,
        stable=stable,
        previous=ctx.previous if warm else None,
        previous_expires_at=ctx.previous_expires_at if warm else None,
        analysis=cs.analysis,
        degraded_reason=rb.kind,
        degraded_message=f"revision {current} {rb.kind}: {rb.reason}",
        command_seen=ctx.command is not None,
    )


STATES: dict[State, Callable[[ReconcileContext], Decision]] = {
    "deployed": _deployed,
    "stable": _stable,
    "canary": _canary,
    "lost": _lost,
}


# ---------------------------------------------------------------------------------------------- gates
