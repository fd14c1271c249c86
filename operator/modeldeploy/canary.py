"""Progressive delivery: the rollout state machine (pure).

:func:`decide` turns a ModelDeployment (spec, and the rollout state in its status), the revision of the
current spec, what is running, the time, and -- when a window is due -- an analysis judgement into the
revisions to run (pods, role, how many of their pods in traffic), the new rollout state, history entries
and events. Nothing here does I/O: the analysis is passed in as a function (:data:`Measure`), called only
when a window is due, so the unit tests drive the whole machine with a fake clock and fake verdicts.

The rules (docs/operator.md, "Progressive delivery"):

* The first revision goes straight to 100 %.
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

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from .analysis import Judgement, Outcome, advance, build_queries
from .api import (
    AnalysisStatus,
    HistoryEntry,
    Measurement,
    ModelDeployment,
    ModelDeploymentSpec,
    parse_duration,
)
from .status import PodFacts, RevisionCounts

HISTORY_LIMIT = 20
COMMAND_ANNOTATION = "modeldeploy.io/command"
FAILED_OUTCOMES = ("RolledBack", "Aborted", "FailedBack")
MIN_REQUEUE = 0.5

Role = Literal["stable", "canary", "previous", "old"]
RolloutResult = Literal["promoted", "rolled_back", "failed_back", "aborted", "superseded", "deployed"]


@dataclass(frozen=True)
class Target:
    revision: str
    spec: ModelDeploymentSpec
    replicas: int
    role: Role
    in_traffic_pods: int  # how many of its pods carry the in-traffic gate True

    @property
    def in_traffic(self) -> bool:
        return self.in_traffic_pods > 0


@dataclass(frozen=True)
class Event:
    type: str
    reason: str
    message: str


@dataclass(frozen=True)
class AnalysisRequest:
    """A window to judge: ``revision`` over the last ``interval``, compared with ``stable``."""

    namespace: str
    name: str
    revision: str
    stable: str | None
    interval: str
    phase: Literal["canary", "bake"]

    def queries(self, md: ModelDeployment) -> list[Any]:
        return build_queries(
            md.spec.rollout.analysis,
            namespace=self.namespace,
            name=self.name,
            revision=self.revision,
            stable=self.stable,
            interval=self.interval,
        )


Measure = Callable[[AnalysisRequest], Judgement]


@dataclass(frozen=True)
class Command:
    action: Literal["promote", "abort", "rollback"]
    revision: str | None = None
    step: int | None = None
    full: bool = False


@dataclass
class Decision:
    targets: list[Target]
    stable: str
    canary: str | None = None
    previous: str | None = None
    previous_expires_at: datetime | None = None
    weight: int | None = None  # requested canary weight
    step: int | None = None
    step_started_at: datetime | None = None
    step_waiting_since: datetime | None = None
    analysis: AnalysisStatus | None = None
    history: list[HistoryEntry] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    progressing_reason: str | None = None  # None: at rest
    progressing_message: str = ""
    degraded_reason: str | None = None
    degraded_message: str = ""
    requeue_at: datetime | None = None
    results: list[RolloutResult] = field(default_factory=list)
    command_seen: bool = False  # a command annotation was read (handled or stale): remove it
    routing_mode: str = "replicas"


# ---------------------------------------------------------------------------------------------- helpers


def replica_split(replicas: int, weight: int) -> tuple[int, int]:
    """(canary pods, stable pods in traffic) whose share ``c / (c + s)`` is closest to ``weight`` %.

    At least one pod of each below 100 %, at most ``replicas`` of each, together at least ``replicas``
    (capacity never drops during a canary); ties go to fewer canary pods.
    """
    if replicas <= 0:
        return 0, 0
    if weight >= 100:
        return replicas, 0
    if weight <= 0:
        return 0, replicas
    best: tuple[float, int, int, int] | None = None
    for c in range(1, replicas + 1):
        for s in range(1, replicas + 1):
            if c + s < replicas:
                continue
            err = abs(100 * c / (c + s) - weight)
            key = (round(err, 9), c, -s, s)
            if best is None or key < best:
                best = key
    assert best is not None
    return best[1], best[3]


def gateway_canary_pods(replicas: int, weight: int) -> int:
    return 0 if replicas <= 0 or weight <= 0 else max(1, math.ceil(replicas * weight / 100))


def achieved_weight(canary_in: int, stable_in: int) -> int | None:
    total = canary_in + stable_in
    return round(100 * canary_in / total) if total else None


def parse_command(md: ModelDeployment) -> Command | None:
    raw = (md.metadata.get("annotations") or {}).get(COMMAND_ANNOTATION)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        action = data["action"]
        if action not in ("promote", "abort", "rollback"):
            return None
        step = data.get("step")
        return Command(
            action=action,
            revision=data.get("revision") or None,
            step=int(step) if step is not None else None,
            full=bool(data.get("full", False)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def latest_entry(history: Sequence[HistoryEntry], revision: str) -> HistoryEntry | None:
    return next((h for h in reversed(history) if h.revision == revision), None)


def has_failed(history: Sequence[HistoryEntry], revision: str) -> bool:
    """A revision whose latest decision is a rollback, abort or failback stays out until the spec changes."""
    h = latest_entry(history, revision)
    return h is not None and h.outcome in FAILED_OUTCOMES


def _seconds(d: str) -> timedelta:
    return timedelta(seconds=parse_duration(d))


class _Builder:
    """Accumulates one decision (history, events, results) over a linear list of steps."""

    def __init__(self, md: ModelDeployment, now: datetime, live: Mapping[str, ModelDeploymentSpec | None]):
        self.md = md
        self.now = now
        self.live = dict(live)  # revision -> its pod-shaping spec (the current one included)
        self.history = list(md.status.history)
        self.events: list[Event] = []
        self.results: list[RolloutResult] = []
        self.wake: list[datetime] = []

    def record(
        self,
        revision: str,
        outcome: Any,
        reason: str,
        measurement: Measurement | None = None,
        event_type: str = "Normal",
        result: RolloutResult | None = None,
    ) -> None:
        self.history = [
            *self.history,
            HistoryEntry(
                revision=revision,
                outcome=outcome,
                time=self.now,
                reason=reason[:4096],
                measurement=measurement,
            ),
        ][-HISTORY_LIMIT:]
        msg = f"revision {revision}: {reason}"
        if measurement is not None and measurement.query:
            m = measurement
            msg += f" [query: {m.query}; value: {m.value}; threshold: {m.threshold}]"
        self.events.append(Event(event_type, outcome, msg))
        if result:
            self.results.append(result)

    def at(self, when: datetime | None) -> None:
        if when is not None:
            self.wake.append(when)

    def finish(self, d: Decision, mode: str) -> Decision:
        d.history = self.history
        d.events = [*self.events, *d.events]
        d.results = [*self.results, *d.results]
        d.routing_mode = mode
        future = [w for w in self.wake if w is not None]
        d.requeue_at = min(future) if future else None
        return d


# ---------------------------------------------------------------------------------------------- decide


def decide(
    md: ModelDeployment,
    current: str,
    live_specs: Mapping[str, ModelDeploymentSpec | None],
    counts: Mapping[str, RevisionCounts],
    now: datetime,
    measure: Measure | None = None,
) -> Decision:
    """The rollout decision for one reconcile (pure, given a pure ``measure``)."""
    spec, st, ro = md.spec, md.status, md.spec.rollout
    mode = ro.traffic_routing.mode
    b = _Builder(md, now, {**live_specs, current: spec})
    cmd = parse_command(md)
    stable = st.stable_revision

    def spec_of(rev: str) -> ModelDeploymentSpec | None:
        return spec if rev == current else live_specs.get(rev)

    # -- previous (warm standby): kept while its Deployment exists and its ttl has not run out
    previous = st.previous_revision
    prev_expires = st.previous_expires_at
    if previous is not None and (live_specs.get(previous) is None or previous == stable):
        previous, prev_expires = None, None
    if previous is not None and prev_expires is not None and now >= prev_expires:
        b.events.append(
            Event("Normal", "PreviousExpired", f"revision {previous}: warm standby ttl over; scaled down")
        )
        previous, prev_expires = None, None

    # -- first revision, or the stable revision is gone: straight to 100 %
    if stable is None or (stable != current and live_specs.get(stable) is None):
        outcome = "Deployed" if stable is None else "Promoted"
        reason = "first revision: straight to 100%" if stable is None else f"stable revision {stable} is gone"
        b.record(current, outcome, reason, result="deployed")
        return b.finish(_rest(md, current, spec, counts, cmd is not None), mode)

    stable_spec = spec_of(stable)
    assert stable_spec is not None
    canary = st.canary_revision

    # -- at rest on the stable revision (the spec is the stable one, or the current revision failed)
    if current == stable or has_failed(b.history, current):
        if canary is not None and canary != stable and canary == current:
            canary = None  # the canary that just failed is already recorded
        if canary is not None and canary != stable and not has_failed(b.history, canary):
            b.record(
                canary,
                "Aborted",
                "the spec went back to the stable revision",
                event_type="Warning",
                result="aborted",
            )
        return b.finish(
            _at_rest(md, b, current, stable, stable_spec, previous, prev_expires, counts, cmd, measure), mode
        )

    # -- a canary of the current revision
    return b.finish(
        _canary(md, b, current, stable, stable_spec, canary, previous, prev_expires, counts, cmd, measure),
        mode,
    )


def _rest(
    md: ModelDeployment,
    stable: str,
    stable_spec: ModelDeploymentSpec,
    counts: Mapping[str, RevisionCounts],
    command_seen: bool,
) -> Decision:
    n = md.spec.replicas
    ready = counts.get(stable, RevisionCounts()).in_traffic
    return Decision(
        targets=[Target(stable, stable_spec, n, "stable", n)],
        stable=stable,
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {stable}: {ready}/{n} pods ready",
        command_seen=command_seen,
    )


def _failed_targets(
    md: ModelDeployment, b: _Builder, live_specs_rev: Mapping[str, ModelDeploymentSpec | None], skip: set[str]
) -> list[Target]:
    """Failed revisions kept out of traffic for ``abortScaleDownDelay`` (for debugging)."""
    delay = _seconds(md.spec.rollout.abort_scale_down_delay)
    if delay.total_seconds() <= 0:
        return []
    out = []
    for rev, rs in live_specs_rev.items():
        if rev in skip or rs is None:
            continue
        h = latest_entry(b.history, rev)
        if h is None or h.outcome not in FAILED_OUTCOMES:
            continue
        until = h.time + delay
        if b.now < until:
            out.append(Target(rev, rs, md.spec.replicas, "old", 0))
            b.at(until)
    return out


def _bake(md: ModelDeployment, b: _Builder, stable: str) -> datetime | None:
    """End of the bake time of ``stable`` (None when it is not baking)."""
    h = latest_entry(b.history, stable)
    if h is None or h.outcome != "Promoted" or h.reason.startswith("first") or "is gone" in h.reason:
        return None
    end = h.time + _seconds(md.spec.rollout.bake_time)
    return end if b.now < end else None


def _due(md: ModelDeployment, started: datetime | None, analysis: AnalysisStatus | None) -> datetime | None:
    """When the next window is due: one interval after the step started and after the last judgement."""
    if started is None:
        return None
    last = analysis.last_run if analysis and analysis.last_run else None
    base = max(started, last) if last else started
    return base + _seconds(md.spec.rollout.interval)


def _at_rest(
    md: ModelDeployment,
    b: _Builder,
    current: str,
    stable: str,
    stable_spec: ModelDeploymentSpec,
    previous: str | None,
    prev_expires: datetime | None,
    counts: Mapping[str, RevisionCounts],
    cmd: Command | None,
    measure: Measure | None,
) -> Decision:
    n = md.spec.replicas
    ro = md.spec.rollout
    st = md.status
    now = b.now
    analysis = st.analysis
    live = b.live
    prev_spec = live.get(previous) if previous else None
    if previous is not None and prev_spec is None:
        previous, prev_expires = None, None

    failback: tuple[str, Measurement | None, str] | None = None
    if (
        cmd is not None
        and cmd.action == "rollback"
        and previous is not None
        and cmd.revision in (None, stable)
    ):
        failback = ("manual rollback (kubectl modeldeploy rollback)", None, "manual")
    elif cmd is not None and cmd.action == "rollback" and previous is None:
        b.events.append(Event("Warning", "RollbackImpossible", "no warm previous revision to roll back to"))

    bake_end = _bake(md, b, stable) if previous is not None else None
    if failback is None and bake_end is not None:
        started = latest_entry(b.history, stable)
        due = _due(md, started.time if started else None, analysis)
        if due is not None and now >= due and measure is not None:
            req = AnalysisRequest(md.namespace, md.name, stable, None, ro.interval, "bake")
            out = advance(ro.analysis, analysis, measure(req), now)
            analysis = out.state
            _analysis_event(b, out, stable, "bake")
            if out.action == "fail":
                failback = (f"failed during bakeTime: {out.reason}", out.failing, "auto")
            else:
                b.at(_due(md, started.time if started else None, analysis))
        else:
            b.at(due)
        if failback is None:
            b.at(bake_end)

    if failback is not None and previous is not None and prev_spec is not None:
        reason, measurement, _ = failback
        b.record(stable, "FailedBack", f"{reason}; back to {previous}", measurement, "Warning", "failed_back")
        targets = [Target(previous, prev_spec, n, "stable", n)]
        targets += _failed_targets(md, b, {**live, stable: stable_spec}, {previous})
        ready = counts.get(previous, RevisionCounts()).in_traffic
        message = f"revision {stable} failed back to {previous}: {reason}"
        return Decision(
            targets=targets,
            stable=previous,
            analysis=analysis,
            progressing_reason="ScalingUp" if ready < n else None,
            progressing_message=f"revision {previous}: {ready}/{n} pods ready",
            degraded_reason="FailedBack",
            degraded_message=message,
            command_seen=cmd is not None,
        )

    targets = [Target(stable, stable_spec, n, "stable", n)]
    if previous is not None and prev_spec is not None:
        keep = ro.keep_previous.replicas
        targets.append(Target(previous, prev_spec, keep, "previous", 0))
        b.at(prev_expires)
    targets += _failed_targets(md, b, live, {stable, previous or ""})
    ready = counts.get(stable, RevisionCounts()).in_traffic
    d = Decision(
        targets=targets,
        stable=stable,
        previous=previous,
        previous_expires_at=prev_expires if previous else None,
        analysis=analysis,
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {stable}: {ready}/{n} pods ready",
        command_seen=cmd is not None,
    )
    if current != stable and has_failed(b.history, current):
        h = latest_entry(b.history, current)
        assert h is not None
        d.degraded_reason = h.outcome
        d.degraded_message = f"revision {current} {h.outcome}: {h.reason}"
    return d


def _analysis_event(b: _Builder, out: Outcome, revision: str, phase: str) -> None:
    # a failed window is AnalysisFailed even below failureLimit; a held window (no data) AnalysisHold
    verdict = {"Pass": "AnalysisPassed", "Fail": "AnalysisFailed", "NoData": "AnalysisHold"}[out.verdict]
    b.events.append(
        Event(
            "Normal" if out.verdict == "Pass" else "Warning",
            verdict,
            f"revision {revision} ({phase}): {out.reason}"
            + "".join(
                f"; {m.metric}={m.value} (threshold {m.threshold}, {m.verdict}) query: {m.query}"
                for m in out.state.measurements
                if m.time == b.now and m.revision == revision
            ),
        )
    )


def _canary(
    md: ModelDeployment,
    b: _Builder,
    current: str,
    stable: str,
    stable_spec: ModelDeploymentSpec,
    canary: str | None,
    previous: str | None,
    prev_expires: datetime | None,
    counts: Mapping[str, RevisionCounts],
    cmd: Command | None,
    measure: Measure | None,
) -> Decision:
    spec, st, ro = md.spec, md.status, md.spec.rollout
    n = spec.replicas
    now = b.now
    steps = ro.steps
    mode = ro.traffic_routing.mode
    step, started, analysis = st.step, st.step_started_at, st.analysis
    waiting = st.step_waiting_since

    if canary != current:
        if canary is not None and canary != stable and not has_failed(b.history, canary):
            b.record(
                canary,
                "Superseded",
                f"superseded by revision {current}",
                event_type="Warning",
                result="superseded",
            )
        b.events.append(
            Event("Normal", "CanaryStarted", f"revision {current}: canary started, steps {steps}")
        )
        step, started, analysis, waiting = 0, None, AnalysisStatus(), None
    step = min(step or 0, len(steps) - 1)

    def rollback(outcome: str, reason: str, m: Measurement | None, result: RolloutResult) -> Decision:
        b.record(current, outcome, reason, m, "Warning", result)
        live = b.live
        targets = [Target(stable, stable_spec, n, "stable", n)]
        prev_spec = live.get(previous) if previous else None
        if previous is not None and prev_spec is not None:
            targets.append(Target(previous, prev_spec, ro.keep_previous.replicas, "previous", 0))
            b.at(prev_expires)
        targets += _failed_targets(md, b, {**live, current: spec}, {stable, previous or ""})
        return Decision(
            targets=targets,
            stable=stable,
            previous=previous if prev_spec is not None else None,
            previous_expires_at=prev_expires if prev_spec is not None else None,
            analysis=analysis,
            degraded_reason=outcome,
            degraded_message=f"revision {current} {outcome}: {reason}",
            command_seen=cmd is not None,
        )

    def promote(reason: str) -> Decision:
        b.record(current, "Promoted", reason, result="promoted")
        keep = ro.keep_previous.replicas
        targets = [Target(current, spec, n, "stable", n)]
        new_prev: str | None = None
        expires: datetime | None = None
        if keep > 0:
            new_prev, expires = stable, now + _seconds(ro.keep_previous.ttl)
            targets.append(Target(stable, stable_spec, keep, "previous", 0))
            b.at(expires)
        if previous is not None and previous != stable:
            b.events.append(Event("Normal", "PreviousReplaced", f"revision {previous}: no longer kept warm"))
        bake = _seconds(ro.bake_time)
        if bake.total_seconds() > 0 and new_prev is not None:
            b.at(now + _seconds(ro.interval))
        ready = counts.get(current, RevisionCounts()).in_traffic
        return Decision(
            targets=targets,
            stable=current,
            previous=new_prev,
            previous_expires_at=expires,
            analysis=AnalysisStatus(measurements=analysis.measurements if analysis else []),
            progressing_reason=None if ready >= n else "ScalingUp",
            progressing_message=f"revision {current} promoted; replaced {stable}",
            command_seen=cmd is not None,
        )

    # -- commands, conditional on the state they were issued against
    if cmd is not None and cmd.revision in (None, current):
        if cmd.action in ("abort", "rollback"):
            return rollback("Aborted", "aborted (kubectl modeldeploy abort)", None, "aborted")
        if cmd.action == "promote" and cmd.full:
            return promote("promoted by hand (kubectl modeldeploy promote --full)")
        if cmd.action == "promote" and cmd.step == step:
            if step + 1 >= len(steps):
                return promote("promoted by hand at the last step (kubectl modeldeploy promote)")
            b.events.append(
                Event("Normal", "StepPromoted", f"revision {current}: step {step} -> {step + 1} by hand")
            )
            step, started = step + 1, None
            waiting = None

    # -- the step's pods: the clock starts once they are in traffic
    weight = steps[step]
    c_pods, s_in = replica_split(n, weight) if mode == "replicas" else (gateway_canary_pods(n, weight), n)
    c_counts = counts.get(current, RevisionCounts())
    if started is None and c_counts.in_traffic >= c_pods:
        started = now
    if started is None:
        # waiting for the step's pods: never silently forever (progressDeadline)
        waiting = waiting or now
        deadline = waiting + _seconds(ro.progress_deadline)
        if now >= deadline and not ro.paused:
            why = f"{c_counts.in_traffic}/{c_pods} canary pods in traffic"
            if c_counts.unschedulable:
                why += f"; {c_counts.unschedulable} unschedulable: {c_counts.scheduling_message}"
            return rollback(
                "Aborted",
                f"progressDeadline {ro.progress_deadline} exceeded at step {step} ({weight}%): {why}",
                None,
                "aborted",
            )
        if not ro.paused:
            b.at(deadline)
    else:
        waiting = None

    if started is not None and not ro.paused:
        due = _due(md, started, analysis if st.canary_revision == current else None)
        assert due is not None
        if now >= due and measure is not None:
            req = AnalysisRequest(
                md.namespace, md.name, current, stable if weight < 100 else None, ro.interval, "canary"
            )
            out = advance(ro.analysis, analysis, measure(req), now)
            analysis = out.state
            _analysis_event(b, out, current, f"step {step}, {weight}%")
            if out.action == "fail":
                return rollback(
                    "RolledBack",
                    f"analysis failed at step {step} ({weight}%): {out.reason}",
                    out.failing,
                    "rolled_back",
                )
            if out.action == "pass":
                if step + 1 >= len(steps):
                    return promote(f"all {len(steps)} steps passed")
                step, started = step + 1, None
                b.events.append(
                    Event("Normal", "StepAdvanced", f"revision {current}: step {step} ({steps[step]}%)")
                )
                weight = steps[step]
                c_pods, s_in = (
                    replica_split(n, weight) if mode == "replicas" else (gateway_canary_pods(n, weight), n)
                )
                if c_counts.in_traffic >= c_pods:
                    started = now  # enough canary pods already: the next step starts at once
                else:
                    waiting = now
    if started is not None and not ro.paused:
        b.at(_due(md, started, analysis))

    live = b.live
    targets = [
        Target(stable, stable_spec, n, "stable", s_in),
        Target(current, spec, c_pods, "canary", c_pods),
    ]
    prev_spec = live.get(previous) if previous else None
    if previous is not None and prev_spec is not None and previous not in (stable, current):
        targets.append(Target(previous, prev_spec, ro.keep_previous.replicas, "previous", 0))
        b.at(prev_expires)
    else:
        previous, prev_expires = None, None
    targets += _failed_targets(md, b, live, {stable, current, previous or ""})
    pending = "" if started is not None else " (waiting for its pods)"
    paused = " (paused)" if ro.paused else ""
    result = Decision(
        targets=targets,
        stable=stable,
        canary=current,
        previous=previous,
        previous_expires_at=prev_expires,
        weight=weight,
        step=step,
        step_started_at=started,
        step_waiting_since=waiting,
        analysis=analysis,
        progressing_reason="CanaryPaused" if ro.paused else "CanaryProgressing",
        progressing_message=f"revision {current}: step {step + 1}/{len(steps)} at {weight}%{pending}{paused}",
        command_seen=cmd is not None,
    )
    return result


# ---------------------------------------------------------------------------------------------- gates


def pod_gates(facts: Sequence[PodFacts], targets: Sequence[Target]) -> list[tuple[str, bool]]:
    """Pods whose in-traffic condition must change so that each revision has ``in_traffic_pods`` in.

    Pods already in traffic stay in (no churn), then ready pods, then by name; pods of revisions no
    longer planned leave traffic at once; terminating pods are left alone.
    """
    wanted = {t.revision: t.in_traffic_pods for t in targets}
    by_rev: dict[str, list[PodFacts]] = {}
    for p in facts:
        if p.terminating or p.revision is None:
            continue
        by_rev.setdefault(p.revision, []).append(p)
    out: list[tuple[str, bool]] = []
    for rev, pods in by_rev.items():
        order = sorted(pods, key=lambda p: (p.gate != "True", not p.containers_ready, p.name))
        k = wanted.get(rev, 0)  # a revision on its way out leaves traffic before its pods stop
        for i, p in enumerate(order):
            want = i < k
            if rev not in wanted and p.gate != "True":
                continue  # not ours to gate (a stray pod): only ever taken out of traffic
            if p.gate != ("True" if want else "False"):
                out.append((p.name, want))
    return sorted(out)
