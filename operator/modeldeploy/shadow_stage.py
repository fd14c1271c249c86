"""The shadow stage of a rollout (pure; part of :mod:`modeldeploy.canary`): the new revision's pods are
warm and out of traffic while the stable servers copy a sample of their answered requests to it and
compare the answers; its end (pass: the canary steps begin; fail: rollback before any user saw it)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from .api import (
    AnalysisStatus,
    ShadowSpec,
    ShadowStatus,
    parse_duration,
)
from .rollout_context import ReconcileContext, seconds_of, window_due
from .rollout_types import (
    CanaryDecision,
    CanaryStep,
    Decision,
    Event,
    Mirror,
    RollBack,
    Target,
    analysis_paused,
    shadow_replicas,
)
from .status import RevisionCounts

#: how soon the shadow stage looks again while it waits for the stable servers to copy (a Prometheus
#: signal, not a watch event), and how often its live agreement is refreshed in status
SHADOW_RECHECK = timedelta(seconds=2)


SHADOW_REFRESH = timedelta(seconds=5)


def end_shadow(ctx: ReconcileContext, cs: CanaryStep) -> CanaryStep:
    """The shadow stage is over: step 0 begins (its clock starts once its pods are in traffic)."""
    kept = cs.analysis.measurements if cs.analysis else []
    return replace(
        cs, step=0, shadow=None, started=None, waiting=ctx.now, analysis=AnalysisStatus(measurements=kept)
    )


def shadowing(ctx: ReconcileContext, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """The shadow stage: wait for the shadow's pods (warm, out of traffic) and for every stable server to
    report copying (never past ``progressDeadline``); then judge at the end of ``duration`` (and every
    ``interval`` before it, if shorter): fail -> rollback, pass -> the canary steps, hold -> again one
    interval later. Not judged while paused."""
    sh = cs.shadow
    if sh is None:
        return cs, None
    ro, now, current, stable = ctx.rollout, ctx.now, ctx.current, ctx.stable
    spec = ro.shadow
    if spec is None:
        ctx.events.append(
            Event(
                "Normal", "ShadowSkipped", f"revision {current}: spec.rollout.shadow was removed; steps begin"
            )
        )
        return end_shadow(ctx, cs), None
    if sh.started_at is None:
        return _shadow_waiting(ctx, cs, sh, spec)
    started = sh.started_at
    end = started + seconds_of(spec.duration)
    if ctx.probe is not None:
        agreement, samples = ctx.probe.agreement(
            ctx.md.namespace, ctx.md.name, current, max(1.0, (now - started).total_seconds())
        )
        sh = sh.model_copy(update={"agreement": agreement, "samples": samples})
        cs = replace(cs, shadow=sh)
    if ctx.frozen or analysis_paused(cs.analysis):
        ctx.wake_at(min(end, now + SHADOW_REFRESH))
        return cs, None
    if now < end:
        ctx.wake_at(min(end, now + SHADOW_REFRESH))
        if parse_duration(ro.interval) >= parse_duration(spec.duration):
            return cs, None
        due = window_due(ro, started, cs.analysis)
        if due >= end:
            return cs, None
        if now < due or ctx.measure is None:
            ctx.wake_at(due)
            return cs, None
        scale = parse_duration(ro.interval) / parse_duration(spec.duration)
        out = ctx.judge(
            current, stable, cs.analysis, "shadow", "shadow", min_samples=spec.min_samples * scale
        )
        if out is None:
            return cs, None
        cs = replace(cs, analysis=out.state)
        if out.action == "fail":
            return cs, RollBack("RolledBack", f"shadow stage failed: {out.reason}", out.failing)
        ctx.wake_at(window_due(ro, started, cs.analysis))
        return cs, None
    last = cs.analysis.last_run if cs.analysis else None
    due = end if last is None or last < end else last + seconds_of(ro.interval)
    if now < due or ctx.measure is None:
        ctx.wake_at(due)
        return cs, None
    out = ctx.judge(current, stable, cs.analysis, "shadow", "end of the shadow stage", window=spec.duration)
    if out is None:
        return cs, None
    cs = replace(cs, analysis=out.state)
    if out.action == "fail":
        return cs, RollBack("RolledBack", f"shadow stage failed: {out.reason}", out.failing)
    if out.action in ("hold", "pause"):
        ctx.wake_at(now + seconds_of(ro.interval))
        return cs, None
    ctx.events.append(
        Event(
            "Normal", "ShadowPassed", f"revision {current}: shadow stage passed ({out.reason}); steps begin"
        )
    )
    return end_shadow(ctx, cs), None


def _shadow_waiting(
    ctx: ReconcileContext, cs: CanaryStep, sh: ShadowStatus, spec: ShadowSpec
) -> tuple[CanaryStep, CanaryDecision | None]:
    """Before the shadow's clock: its pods warm, then every stable server copying."""
    ro, now, current, stable = ctx.rollout, ctx.now, ctx.current, ctx.stable
    want = shadow_replicas(ctx.replicas, spec)
    warm = ctx.counts.get(current, RevisionCounts()).ready
    servers = ctx.counts.get(stable, RevisionCounts()).ready
    copying: int | None = None
    if warm >= want and ctx.probe is not None:
        copying = ctx.probe.copying(ctx.md.namespace, ctx.md.name, stable, current)
    if warm >= want and copying is not None and copying >= max(1, servers):
        ctx.events.append(
            Event(
                "Normal",
                "ShadowCopying",
                f"revision {current}: {copying} stable server(s) copy {spec.sample_rate:g} of their requests "
                f"to it; the shadow clock ({spec.duration}) starts",
            )
        )
        sh = sh.model_copy(update={"started_at": now, "waiting_since": None, "copying_pods": copying})
        ctx.wake_at(now + min(seconds_of(spec.duration), seconds_of(ro.interval)))
        return replace(cs, shadow=sh, analysis=AnalysisStatus()), None
    waiting = sh.waiting_since or now
    cs = replace(cs, shadow=sh.model_copy(update={"waiting_since": waiting, "copying_pods": copying}))
    ctx.wake_at(now + SHADOW_RECHECK)
    if ctx.frozen:
        return cs, None
    deadline = waiting + seconds_of(ro.progress_deadline)
    if now >= deadline:
        why = f"{warm}/{want} shadow pods warm, {copying or 0}/{servers} stable servers copying"
        return cs, RollBack(
            "Aborted", f"progressDeadline {ro.progress_deadline} exceeded in the shadow stage: {why}"
        )
    ctx.wake_at(deadline)
    return cs, None


def shadow_progressing(ctx: ReconcileContext, cs: CanaryStep, sh: ShadowStatus) -> Decision:
    stable, current, ro, n = ctx.stable, ctx.current, ctx.rollout, ctx.replicas
    spec = ro.shadow
    assert spec is not None
    want = shadow_replicas(n, spec)
    warm_prev = ctx.warm_previous(stable, current)
    previous = ctx.previous if warm_prev else None
    targets = [
        Target(stable, ctx.spec_of(stable), n, "stable", n),
        Target(current, ctx.spec, want, "shadow", 0),
        *warm_prev,
        *ctx.failed_kept(stable, current, previous or ""),
    ]
    warm = ctx.counts.get(current, RevisionCounts()).ready
    if sh.started_at is None:
        what = (
            f"waiting for {want - warm} shadow pod(s)"
            if warm < want
            else f"waiting for the stable servers to copy ({sh.copying_pods or 0} do)"
        )
    else:
        so_far = "no compared requests yet"
        if sh.samples:
            so_far = (
                f"agreement {sh.agreement:.4f} over {sh.samples} compared requests"
                if sh.agreement is not None
                else f"{sh.samples} compared"
            )
        what = f"{so_far}; ends {(sh.started_at + seconds_of(spec.duration)).strftime('%H:%M:%SZ')}"
    paused = " (paused)" if ro.paused else ""
    reason = "CanaryPaused" if ro.paused else "Shadowing"
    if analysis_paused(cs.analysis):
        assert cs.analysis is not None
        reason, paused = "AnalysisPaused", f": {cs.analysis.paused_reason}"
    return Decision(
        targets=targets,
        stable=stable,
        canary=current,
        previous=previous,
        previous_expires_at=ctx.previous_expires_at if warm_prev else None,
        weight=0,
        step=0,
        analysis=cs.analysis,
        progressing_reason=reason,
        progressing_message=(
            f"revision {current}: shadowing {stable} ({spec.sample_rate:g} of requests): {what}{paused}"
        ),
        command_seen=ctx.command is not None,
        shadow=sh,
        mirror=(
            Mirror(stable, current, spec.sample_rate, parse_duration(spec.timeout) * 1000, spec.compare)
            if warm >= want
            else None
        ),
    )
