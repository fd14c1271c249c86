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

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from .analysis import Judgement, Outcome, advance, build_queries, build_shadow_queries
from .api import (
    HISTORY_LIMIT,
    AnalysisStatus,
    CompareSpec,
    HistoryEntry,
    HistoryKind,
    HistoryOutcome,
    Measurement,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
    RolloutSpec,
    ShadowSpec,
    ShadowStatus,
    parse_duration,
)
from .status import PodFacts, RevisionCounts

COMMAND_ANNOTATION = "modeldeploy.io/command"
MIN_REQUEUE = 0.5

RolloutResult = Literal["promoted", "rolled_back", "failed_back", "aborted", "superseded", "deployed"]

#: a revision whose latest history entry is one of these stays out of traffic until the spec changes
FAILED_KINDS: tuple[HistoryKind, ...] = ("RolledBack", "Aborted", "FailedBack")
#: history entries that are Warning events
WARNING_KINDS: tuple[HistoryKind, ...] = ("RolledBack", "Aborted", "FailedBack", "Superseded")
#: the operator metric's result label of each kind of history entry
RESULTS: dict[HistoryKind, RolloutResult] = {
    "Deployed": "deployed",
    "Promoted": "promoted",
    "RolledBack": "rolled_back",
    "Aborted": "aborted",
    "FailedBack": "failed_back",
    "Superseded": "superseded",
}


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
    phase: Literal["canary", "bake", "shadow"]
    agreement_with: str | None = None  # the revision the stable copies to (minAgreement)
    min_samples: float | None = None  # shadow: compared requests needed in this window

    def queries(self, md: ModelDeployment) -> list[Any]:
        ro = md.spec.rollout
        if self.phase == "shadow":
            assert ro.shadow is not None
            return build_shadow_queries(
                ro.shadow,
                ro.analysis,
                namespace=self.namespace,
                name=self.name,
                revision=self.revision,
                interval=self.interval,
                min_samples=self.min_samples,
            )
        return build_queries(
            ro.analysis,
            namespace=self.namespace,
            name=self.name,
            revision=self.revision,
            stable=self.stable,
            interval=self.interval,
            agreement_with=self.agreement_with,
        )


#: the analysis of one window: its judgement, or None while the measurement runs (off the reconcile path,
#: see :mod:`modeldeploy.measurements`; the reconcile is run again when it finishes)
Measure = Callable[[AnalysisRequest], Judgement | None]


class Probe(Protocol):
    """What the shadow stage asks Prometheus outside an analysis window (I/O; a fake in unit tests)."""

    def copying(self, namespace: str, name: str, source: str, target: str) -> int | None:
        """How many servers of ``source`` report that they copy to ``target`` (None: unknown)."""
        ...

    def agreement(
        self, namespace: str, name: str, target: str, seconds: float
    ) -> tuple[float | None, int | None]:
        """(share that agreed, compared requests) of the copies to ``target`` over the last ``seconds``."""
        ...


@dataclass(frozen=True)
class Mirror:
    """The servers of ``source`` copy ``sample_rate`` of the requests they answer to ``target``."""

    source: str
    target: str
    sample_rate: float
    timeout_ms: float
    compare: CompareSpec

    def to_annotation(self, url: str) -> str:
        """The pod annotation ``modeldeploy.io/shadow`` the source's servers read (modelserver.shadow)."""
        c = self.compare
        doc = {
            "url": url,
            "revision": self.target,
            "sampleRate": self.sample_rate,
            "timeoutMs": self.timeout_ms,
            "compare": {"method": c.method, "minCosine": c.min_cosine, "rtol": c.rtol, "atol": c.atol},
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Command:
    action: Literal["promote", "abort", "rollback", "resume"]
    revision: str | None = None
    step: int | None = None
    full: bool = False
    shadow: bool = False  # issued against the shadow stage (promote: skip it)


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
    shadow: ShadowStatus | None = None  # the shadow stage, while in it
    mirror: Mirror | None = None  # which servers copy requests where
    fallback_revision: str | None = None  # the CPU fallback in traffic (modeldeploy.fallback): route to it


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
        if action not in ("promote", "abort", "rollback", "resume"):
            return None
        step = data.get("step")
        return Command(
            action=action,
            revision=data.get("revision") or None,
            step=int(step) if step is not None else None,
            full=bool(data.get("full", False)),
            shadow=data.get("stage") == "shadow",
        )
    except (ValueError, KeyError, TypeError):
        return None


def latest_entry(history: Sequence[HistoryEntry], revision: str) -> HistoryEntry | None:
    return next((h for h in reversed(history) if h.revision == revision), None)


def has_failed(history: Sequence[HistoryEntry], revision: str) -> bool:
    """A revision whose latest decision is a rollback, abort or failback stays out until the spec changes."""
    h = latest_entry(history, revision)
    return h is not None and h.kind in FAILED_KINDS


def _seconds(d: str) -> timedelta:
    return timedelta(seconds=parse_duration(d))


def _due(rollout: RolloutSpec, started: datetime, analysis: AnalysisStatus | None) -> datetime:
    """When the next window is due: one interval after the step started and after the last judgement."""
    last = analysis.last_run if analysis and analysis.last_run else None
    base = max(started, last) if last else started
    return base + _seconds(rollout.interval)


def shadow_replicas(replicas: int, shadow: ShadowSpec) -> int:
    """Pods of a shadow revision: enough for its share of the copies (``replicas x sampleRate``)."""
    if shadow.replicas is not None:
        return shadow.replicas
    return max(1, math.ceil(replicas * shadow.sample_rate - 1e-9))


def agreement_mirror(rollout: RolloutSpec, source: str, target: str) -> Mirror | None:
    """With ``analysis.minAgreement``: ``source``'s servers keep copying a sample to ``target``."""
    if rollout.analysis.min_agreement is None:
        return None
    shadow = rollout.shadow
    return Mirror(
        source,
        target,
        rollout.analysis.agreement_sample_rate,
        parse_duration(shadow.timeout) * 1000 if shadow else 5000.0,
        shadow.compare if shadow else CompareSpec(),
    )


# ---------------------------------------------------------------------------------------------- context


@dataclass
class Rollout:
    """One reconcile of the rollout: what was observed (the object and its status, the live revisions,
    their pods, the clock, the analysis) and what has been decided so far (history, events, results,
    when to look again). The state functions below read it and add to it; none does I/O."""

    md: ModelDeployment
    current: str  # the revision of the current spec
    live: dict[str, ModelDeploymentSpec | None]  # revision -> its pod-shaping spec (the current one included)
    counts: Mapping[str, RevisionCounts]
    now: datetime
    measure: Measure | None
    command: Command | None
    previous: str | None  # the warm standby, while its Deployment exists and its ttl has not run out
    previous_expires_at: datetime | None
    history: list[HistoryEntry]
    events: list[Event] = field(default_factory=list)
    results: list[RolloutResult] = field(default_factory=list)
    wake: list[datetime] = field(default_factory=list)
    probe: Probe | None = None
    hold: bool = False  # the CPU fallback is in traffic: nothing is judged (modeldeploy.fallback)

    @classmethod
    def observe(
        cls,
        md: ModelDeployment,
        current: str,
        live_specs: Mapping[str, ModelDeploymentSpec | None],
        counts: Mapping[str, RevisionCounts],
        now: datetime,
        measure: Measure | None,
        probe: Probe | None = None,
        hold: bool = False,
    ) -> Rollout:
        st = md.status
        ctx = cls(
            md=md,
            current=current,
            live={**live_specs, current: md.spec},
            counts=counts,
            now=now,
            measure=measure,
            command=parse_command(md),
            previous=st.previous_revision,
            previous_expires_at=st.previous_expires_at,
            history=list(st.history),
            probe=probe,
            hold=hold,
        )
        previous = ctx.previous
        if previous is not None and (live_specs.get(previous) is None or previous == st.stable_revision):
            ctx.previous, ctx.previous_expires_at = None, None
        elif previous is not None and ctx.previous_expires_at is not None and now >= ctx.previous_expires_at:
            ctx.events.append(
                Event("Normal", "PreviousExpired", f"revision {previous}: warm standby ttl over; scaled down")
            )
            ctx.previous, ctx.previous_expires_at = None, None
        return ctx

    @property
    def spec(self) -> ModelDeploymentSpec:
        return self.md.spec

    @property
    def rollout(self) -> RolloutSpec:
        return self.md.spec.rollout

    @property
    def replicas(self) -> int:
        return self.md.spec.replicas

    @property
    def frozen(self) -> bool:
        """Nothing is judged and no deadline runs: ``paused``, or the CPU fallback is in traffic."""
        return self.rollout.paused or self.hold

    @property
    def stable(self) -> str:
        """The stable revision (every state but ``deployed`` has one)."""
        stable = self.md.status.stable_revision
        assert stable is not None
        return stable

    def spec_of(self, revision: str) -> ModelDeploymentSpec:
        spec = self.live.get(revision)
        assert spec is not None, f"revision {revision} has no readable spec"
        return spec

    def in_traffic(self, revision: str) -> int:
        return self.counts.get(revision, RevisionCounts()).in_traffic

    def command_for(self, *revisions: str | None) -> Command | None:
        """The command, when it was issued against one of ``revisions`` (None: issued against any)."""
        cmd = self.command
        return cmd if cmd is not None and cmd.revision in revisions else None

    def record(
        self,
        revision: str,
        kind: HistoryKind,
        reason: str,
        measurement: Measurement | None = None,
        outcome: HistoryOutcome | None = None,
    ) -> None:
        """A decision about ``revision``: a history entry, an event, a result for the operator metric."""
        said = outcome or kind
        self.history = [
            *self.history,
            HistoryEntry(
                revision=revision,
                outcome=said,
                kind=kind,
                time=self.now,
                reason=reason[:4096],
                measurement=measurement,
            ),
        ][-HISTORY_LIMIT:]
        msg = f"revision {revision}: {reason}"
        if measurement is not None and measurement.query:
            m = measurement
            msg += f" [query: {m.query}; value: {m.value}; threshold: {m.threshold}]"
        self.events.append(Event("Warning" if kind in WARNING_KINDS else "Normal", said, msg))
        self.results.append(RESULTS[kind])

    def at(self, when: datetime | None) -> None:
        """Look again at ``when``."""
        if when is not None:
            self.wake.append(when)

    def judge(
        self,
        revision: str,
        stable: str | None,
        analysis: AnalysisStatus | None,
        phase: Literal["canary", "bake", "shadow"],
        what: str,
        *,
        window: str | None = None,
        agreement_with: str | None = None,
        min_samples: float | None = None,
    ) -> Outcome | None:
        """Judge the last window (``interval`` unless given) of ``revision`` (against ``stable``), with an
        event for the verdict; None while the measurement runs (looked at again when it finishes)."""
        assert self.measure is not None
        req = AnalysisRequest(
            self.md.namespace,
            self.md.name,
            revision,
            stable,
            window or self.rollout.interval,
            phase,
            agreement_with=agreement_with if self.rollout.analysis.min_agreement is not None else None,
            min_samples=min_samples,
        )
        judgement = self.measure(req)
        if judgement is None:
            self.at(self.now + MEASUREMENT_RECHECK)
            return None
        out = advance(self.rollout.analysis, analysis, judgement, self.now)
        # a failed window is AnalysisFailed even below failureLimit; a held window (no data) AnalysisHold;
        # a window whose queries failed AnalysisError
        verdict = {
            "Pass": "AnalysisPassed",
            "Fail": "AnalysisFailed",
            "NoData": "AnalysisHold",
            "Error": "AnalysisError",
        }[out.verdict]
        self.events.append(
            Event(
                "Normal" if out.verdict == "Pass" else "Warning",
                verdict,
                f"revision {revision} ({what}): {out.reason}"
                + "".join(
                    f"; {m.metric}={m.value} (threshold {m.threshold}, {m.verdict}) query: {m.query}"
                    for m in out.state.measurements
                    if m.time == self.now and m.revision == revision
                ),
            )
        )
        if out.action == "pause":
            self.events.append(
                Event(
                    "Warning",
                    "AnalysisPaused",
                    f"revision {revision} ({what}): {out.state.paused_reason}; nothing is judged until "
                    "`kubectl modeldeploy resume`",
                )
            )
        return out

    def warm_previous(self, *besides: str) -> list[Target]:
        """The warm standby (out of traffic), unless it is one of ``besides``."""
        previous = self.previous
        if previous is None or previous in besides or self.live.get(previous) is None:
            return []
        self.at(self.previous_expires_at)
        return [Target(previous, self.spec_of(previous), self.rollout.keep_previous.replicas, "previous", 0)]

    def failed(self, *besides: str) -> list[Target]:
        """Failed revisions kept out of traffic for ``abortScaleDownDelay`` (for debugging)."""
        delay = _seconds(self.rollout.abort_scale_down_delay)
        if delay.total_seconds() <= 0:
            return []
        out = []
        for rev, spec in self.live.items():
            if rev in besides or spec is None:
                continue
            h = latest_entry(self.history, rev)
            if h is None or h.kind not in FAILED_KINDS:
                continue
            until = h.time + delay
            if self.now < until:
                out.append(Target(rev, spec, self.replicas, "old", 0))
                self.at(until)
        return out

    def finish(self, d: Decision) -> Decision:
        d.history = self.history
        d.events = [*self.events, *d.events]
        d.results = [*self.results, *d.results]
        d.routing_mode = self.rollout.traffic_routing.mode
        d.requeue_at = min(self.wake) if self.wake else None
        return d


# ---------------------------------------------------------------------------------------------- decisions
#
# What a state function decides, as data; :func:`_canary` and :func:`_stable` carry them out.


@dataclass(frozen=True)
class Promote:
    """The canary becomes stable; the old stable becomes the warm previous."""

    reason: str


@dataclass(frozen=True)
class RollBack:
    """The canary leaves traffic at once; the stable takes 100 %."""

    kind: Literal["RolledBack", "Aborted"]
    reason: str
    measurement: Measurement | None = None


@dataclass(frozen=True)
class NextStep:
    """The step's window passed: on to the next step."""


@dataclass(frozen=True)
class FailBack:
    """The (baking) stable failed: back to the warm previous revision."""

    reason: str
    measurement: Measurement | None = None


CanaryDecision = Promote | RollBack | NextStep


@dataclass(frozen=True)
class CanaryStep:
    """Where a canary is: its step, the step's clock, and its analysis."""

    step: int
    started: datetime | None  # when the step's pods were all in traffic
    waiting: datetime | None  # since when the step waits for its pods
    analysis: AnalysisStatus | None
    shadow: ShadowStatus | None = None  # in the shadow stage (before ``step``)


# ---------------------------------------------------------------------------------------------- decide

State = Literal["deployed", "stable", "canary", "lost"]


def state_of(ctx: Rollout) -> State:
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
) -> Decision:
    """The rollout decision for one reconcile (pure, given a pure ``measure`` and ``probe``); ``hold``:
    the CPU fallback is in traffic, nothing is judged."""
    ctx = Rollout.observe(md, current, live_specs, counts, now, measure, probe, hold)
    return ctx.finish(_make_before_break(ctx, STATES[state_of(ctx)](ctx)))


#: a pending measurement is looked at again this soon at the latest (its end also enqueues the reconcile)
MEASUREMENT_RECHECK = timedelta(seconds=15)


def analysis_paused(analysis: AnalysisStatus | None) -> bool:
    """``errorLimit`` consecutive windows whose queries failed: nothing is judged until resumed."""
    return analysis is not None and analysis.paused_reason is not None


def _resumed(ctx: Rollout, analysis: AnalysisStatus | None, *revisions: str) -> AnalysisStatus | None:
    """``kubectl modeldeploy resume`` issued against one of ``revisions``: an analysis paused by query
    errors is judged again (its error count starts over)."""
    cmd = ctx.command_for(None, *revisions)
    if cmd is None or cmd.action != "resume" or analysis is None or not analysis_paused(analysis):
        return analysis
    ctx.events.append(
        Event("Normal", "AnalysisResumed", f"analysis resumed by hand (was: {analysis.paused_reason})")
    )
    return analysis.model_copy(update={"paused_reason": None, "consecutive_errors": 0})


#: how soon a handover (see :func:`_make_before_break`) is looked at again, watch events aside
HANDOVER_RECHECK = timedelta(seconds=1)


def _make_before_break(ctx: Rollout, d: Decision) -> Decision:
    """No moment without a pod in traffic: while none of the revisions the decision puts in traffic has a
    Ready pod yet (a failback to warm pods whose gates are only now turned True; a rollback to a stable
    whose pods are down), the revisions whose pods are still in traffic keep them there, running. They
    leave at the first reconcile after a pod of the new stable is Ready (its pod's status change is a
    watch event), so a switch trades a moment of the old revision's answers for what would otherwise be a
    moment with no endpoint at all (every request refused)."""
    wanted = {t.revision for t in d.targets if t.in_traffic_pods > 0}
    if ctx.replicas == 0 or not wanted or any(ctx.in_traffic(rev) > 0 for rev in wanted):
        return d
    by_rev = {t.revision: t for t in d.targets}
    kept = False
    for rev, counts in sorted(ctx.counts.items()):
        spec = ctx.live.get(rev)
        if rev in wanted or counts.in_traffic == 0 or spec is None:
            continue
        t = by_rev.get(rev)
        replicas = max(t.replicas if t else 0, counts.current)
        by_rev[rev] = Target(rev, spec, replicas, t.role if t else "old", counts.in_traffic)
        kept = True
    if kept:
        d.targets = list(by_rev.values())
        ctx.at(ctx.now + HANDOVER_RECHECK)
    return d


def _deployed(ctx: Rollout) -> Decision:
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
    ready = ctx.in_traffic(current)
    return Decision(
        targets=[Target(current, ctx.spec, n, "stable", n)],
        stable=current,
        progressing_reason=None if ready >= n else "ScalingUp",
        progressing_message=f"revision {current}: {ready}/{n} pods ready",
        command_seen=ctx.command is not None,
    )


def _lost(ctx: Rollout) -> Decision:
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
            progressing_reason="ScalingUp" if ctx.in_traffic(current) < n else None,
            progressing_message=f"revision {current}: {ctx.in_traffic(current)}/{n} pods ready",
            command_seen=True,
        )
    failed = latest_entry(ctx.history, current)
    assert failed is not None
    return Decision(
        targets=ctx.failed(),
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


def _stable(ctx: Rollout) -> Decision:
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


def _rollback_command(ctx: Rollout) -> FailBack | None:
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


def _abort_canary(ctx: Rollout) -> None:
    """The spec went back to the stable revision mid-canary: the canary is aborted."""
    canary = ctx.md.status.canary_revision
    if canary is None or canary in (ctx.stable, ctx.current) or has_failed(ctx.history, canary):
        return  # no canary, or it has just failed (already recorded)
    ctx.record(canary, "Aborted", "the spec went back to the stable revision")


def _bake_end(ctx: Rollout) -> datetime | None:
    """When the bake of the stable revision ends, while it bakes (promoted, with a warm previous)."""
    if ctx.previous is None:
        return None
    promoted = latest_entry(ctx.history, ctx.stable)
    if promoted is None or promoted.kind != "Promoted":
        return None
    end = promoted.time + _seconds(ctx.rollout.bake_time)
    return end if ctx.now < end else None


def _baking(ctx: Rollout, analysis: AnalysisStatus | None) -> tuple[AnalysisStatus | None, FailBack | None]:
    """During ``bakeTime`` after a promotion (with a warm previous to fail back to), the canary's analysis
    goes on on the new stable revision (its agreement with the warm previous one, with minAgreement)."""
    end = _bake_end(ctx)
    if end is None:
        return analysis, None
    stable = ctx.stable
    promoted = latest_entry(ctx.history, stable)
    assert promoted is not None
    due = _due(ctx.rollout, promoted.time, analysis)
    analysis = _resumed(ctx, analysis, stable)
    if ctx.hold or analysis_paused(analysis):
        ctx.at(end)
        return analysis, None
    if ctx.now >= due and ctx.measure is not None:
        out = ctx.judge(stable, None, analysis, "bake", "bake", agreement_with=ctx.previous)
        if out is not None:
            analysis = out.state
            if out.action == "fail":
                return analysis, FailBack(f"failed during bakeTime: {out.reason}", out.failing)
            ctx.at(_due(ctx.rollout, promoted.time, analysis))
    else:
        ctx.at(due)
    ctx.at(end)
    return analysis, None


def _failed_back(ctx: Rollout, analysis: AnalysisStatus | None, fb: FailBack) -> Decision:
    """The warm previous revision's pods go into traffic at once (no restart), it is scaled back up; the
    failed stable leaves traffic and is scaled down."""
    stable, previous, n = ctx.stable, ctx.previous, ctx.replicas
    assert previous is not None
    ctx.record(stable, "FailedBack", f"{fb.reason}; back to {previous}", fb.measurement)
    targets = [Target(previous, ctx.spec_of(previous), n, "stable", n), *ctx.failed(previous)]
    ready = ctx.in_traffic(previous)
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


def _at_rest(ctx: Rollout, analysis: AnalysisStatus | None) -> Decision:
    stable, current, n = ctx.stable, ctx.current, ctx.replicas
    targets = [
        Target(stable, ctx.spec_of(stable), n, "stable", n),
        *ctx.warm_previous(),
        *ctx.failed(stable, ctx.previous or ""),
    ]
    ready = ctx.in_traffic(stable)
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


def _canary(ctx: Rollout) -> Decision:
    """A canary of the current revision: each state function in turn, until one decides."""
    cs = _deploying(ctx)
    decision: CanaryDecision | None = None
    for state in (_command, _shadowing, _step, _judging):
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


def _deploying(ctx: Rollout) -> CanaryStep:
    """Resume the canary of the current revision, or start it (superseding an older canary)."""
    st, current, steps = ctx.md.status, ctx.current, ctx.rollout.steps
    canary = st.canary_revision
    if canary == current:
        shadow = st.shadow if st.shadow is not None and st.shadow.revision == current else None
        return CanaryStep(
            min(st.step or 0, len(steps) - 1), st.step_started_at, st.step_waiting_since, st.analysis, shadow
        )
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


def _command(ctx: Rollout, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
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
        return _end_shadow(ctx, cs), None
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


#: how soon the shadow stage looks again while it waits for the stable servers to copy (a Prometheus
#: signal, not a watch event), and how often its live agreement is refreshed in status
SHADOW_RECHECK = timedelta(seconds=2)
SHADOW_REFRESH = timedelta(seconds=5)


def _end_shadow(ctx: Rollout, cs: CanaryStep) -> CanaryStep:
    """The shadow stage is over: step 0 begins (its clock starts once its pods are in traffic)."""
    kept = cs.analysis.measurements if cs.analysis else []
    return replace(
        cs, step=0, shadow=None, started=None, waiting=ctx.now, analysis=AnalysisStatus(measurements=kept)
    )


def _shadowing(ctx: Rollout, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
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
        return _end_shadow(ctx, cs), None
    if sh.started_at is None:
        return _shadow_waiting(ctx, cs, sh, spec)
    started = sh.started_at
    end = started + _seconds(spec.duration)
    if ctx.probe is not None:
        agreement, samples = ctx.probe.agreement(
            ctx.md.namespace, ctx.md.name, current, max(1.0, (now - started).total_seconds())
        )
        sh = sh.model_copy(update={"agreement": agreement, "samples": samples})
        cs = replace(cs, shadow=sh)
    if ctx.frozen or analysis_paused(cs.analysis):
        ctx.at(min(end, now + SHADOW_REFRESH))
        return cs, None
    if now < end:
        ctx.at(min(end, now + SHADOW_REFRESH))
        if parse_duration(ro.interval) >= parse_duration(spec.duration):
            return cs, None
        due = _due(ro, started, cs.analysis)
        if due >= end:
            return cs, None
        if now < due or ctx.measure is None:
            ctx.at(due)
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
        ctx.at(_due(ro, started, cs.analysis))
        return cs, None
    last = cs.analysis.last_run if cs.analysis else None
    due = end if last is None or last < end else last + _seconds(ro.interval)
    if now < due or ctx.measure is None:
        ctx.at(due)
        return cs, None
    out = ctx.judge(current, stable, cs.analysis, "shadow", "end of the shadow stage", window=spec.duration)
    if out is None:
        return cs, None
    cs = replace(cs, analysis=out.state)
    if out.action == "fail":
        return cs, RollBack("RolledBack", f"shadow stage failed: {out.reason}", out.failing)
    if out.action in ("hold", "pause"):
        ctx.at(now + _seconds(ro.interval))
        return cs, None
    ctx.events.append(
        Event(
            "Normal", "ShadowPassed", f"revision {current}: shadow stage passed ({out.reason}); steps begin"
        )
    )
    return _end_shadow(ctx, cs), None


def _shadow_waiting(
    ctx: Rollout, cs: CanaryStep, sh: ShadowStatus, spec: ShadowSpec
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
        ctx.at(now + min(_seconds(spec.duration), _seconds(ro.interval)))
        return replace(cs, shadow=sh, analysis=AnalysisStatus()), None
    waiting = sh.waiting_since or now
    cs = replace(cs, shadow=sh.model_copy(update={"waiting_since": waiting, "copying_pods": copying}))
    ctx.at(now + SHADOW_RECHECK)
    if ctx.frozen:
        return cs, None
    deadline = waiting + _seconds(ro.progress_deadline)
    if now >= deadline:
        why = f"{warm}/{want} shadow pods warm, {copying or 0}/{servers} stable servers copying"
        return cs, RollBack(
            "Aborted", f"progressDeadline {ro.progress_deadline} exceeded in the shadow stage: {why}"
        )
    ctx.at(deadline)
    return cs, None


def _split(ctx: Rollout, step: int) -> tuple[int, int]:
    """(canary pods, stable pods in traffic) at ``step``."""
    n, weight = ctx.replicas, ctx.rollout.steps[step]
    if ctx.rollout.traffic_routing.mode == "replicas":
        return replica_split(n, weight)
    return gateway_canary_pods(n, weight), n


def _step(ctx: Rollout, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """The step's pods: its clock starts once they are in traffic; waiting for them never lasts past
    ``progressDeadline`` (never silently forever), except while paused."""
    if cs.shadow is not None:
        return cs, None
    if cs.started is not None:
        return replace(cs, waiting=None), None
    ro, now = ctx.rollout, ctx.now
    c_pods, _ = _split(ctx, cs.step)
    have = ctx.counts.get(ctx.current, RevisionCounts())
    if have.in_traffic >= c_pods:
        return replace(cs, started=now, waiting=None), None
    cs = replace(cs, waiting=cs.waiting or now)
    assert cs.waiting is not None
    if ctx.frozen:
        return cs, None
    deadline = cs.waiting + _seconds(ro.progress_deadline)
    if now >= deadline:
        why = f"{have.in_traffic}/{c_pods} canary pods in traffic"
        if have.unschedulable:
            why += f"; {have.unschedulable} unschedulable: {have.scheduling_message}"
        weight = ro.steps[cs.step]
        reason = f"progressDeadline {ro.progress_deadline} exceeded at step {cs.step} ({weight}%): {why}"
        return cs, RollBack("Aborted", reason)
    ctx.at(deadline)
    return cs, None


def _judging(ctx: Rollout, cs: CanaryStep) -> tuple[CanaryStep, CanaryDecision | None]:
    """A step whose interval is over is judged: pass -> next step (or promotion after the last),
    fail -> rollback, hold -> judged again one interval later. Not while paused."""
    ro, started = ctx.rollout, cs.started
    if started is None or ctx.frozen or cs.shadow is not None or analysis_paused(cs.analysis):
        return cs, None
    due = _due(ro, started, cs.analysis)
    if ctx.now < due or ctx.measure is None:
        ctx.at(due)
        return cs, None
    step, weight = cs.step, ro.steps[cs.step]
    stable = ctx.stable if weight < 100 else None
    out = ctx.judge(
        ctx.current,
        stable,
        cs.analysis,
        "canary",
        f"step {step}, {weight}%",
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
            return cs, Promote(f"all {len(ro.steps)} steps passed")
        return cs, NextStep()
    ctx.at(_due(ro, started, cs.analysis))
    return cs, None


def _next_step(ctx: Rollout, cs: CanaryStep) -> CanaryStep:
    """On to the next step; it starts at once when enough canary pods are already in traffic."""
    step = cs.step + 1
    ctx.events.append(
        Event("Normal", "StepAdvanced", f"revision {ctx.current}: step {step} ({ctx.rollout.steps[step]}%)")
    )
    c_pods, _ = _split(ctx, step)
    if ctx.in_traffic(ctx.current) >= c_pods:
        cs = replace(cs, step=step, started=ctx.now)
        ctx.at(_due(ctx.rollout, ctx.now, cs.analysis))
        return cs
    return replace(cs, step=step, started=None, waiting=ctx.now)


def _progressing(ctx: Rollout, cs: CanaryStep) -> Decision:
    """Mid-canary: the stable keeps all its pods, ``s`` of them in traffic next to the step's canary pods.
    In the shadow stage: every stable pod in traffic, the shadow's pods warm and out of traffic."""
    if cs.shadow is not None:
        return _shadow_progressing(ctx, cs, cs.shadow)
    stable, current, ro = ctx.stable, ctx.current, ctx.rollout
    steps, weight = ro.steps, ro.steps[cs.step]
    c_pods, s_in = _split(ctx, cs.step)
    if s_in == 0:
        # at 100 % the stable has no pod in traffic of its own: its pods stand in for the canary pods that
        # are not (yet, or no longer: their node lost) in traffic, so the Service never runs out of
        # endpoints. Below 100 % the stable keeps a pod in traffic: missing canary pods cost capacity only
        s_in = ctx.replicas - min(ctx.in_traffic(current), c_pods)
    warm = ctx.warm_previous(stable, current)
    previous = ctx.previous if warm else None
    targets = [
        Target(stable, ctx.spec_of(stable), ctx.replicas, "stable", s_in),
        Target(current, ctx.spec, c_pods, "canary", c_pods),
        *warm,
        *ctx.failed(stable, current, previous or ""),
    ]
    pending = "" if cs.started is not None else " (waiting for its pods)"
    paused = " (paused)" if ro.paused else ""
    message = f"revision {current}: step {cs.step + 1}/{len(steps)} at {weight}%{pending}{paused}"
    reason = "CanaryPaused" if ro.paused else "CanaryProgressing"
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
    )


def _shadow_progressing(ctx: Rollout, cs: CanaryStep, sh: ShadowStatus) -> Decision:
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
        *ctx.failed(stable, current, previous or ""),
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
        what = f"{so_far}; ends {(sh.started_at + _seconds(spec.duration)).strftime('%H:%M:%SZ')}"
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


def _promoted(ctx: Rollout, cs: CanaryStep, p: Promote) -> Decision:
    """The canary becomes stable; the old stable keeps ``keepPrevious.replicas`` pods warm, out of
    traffic, for ``keepPrevious.ttl``; the bake analysis starts one interval later."""
    stable, current, ro, now, n = ctx.stable, ctx.current, ctx.rollout, ctx.now, ctx.replicas
    ctx.record(current, "Promoted", p.reason)
    keep = ro.keep_previous.replicas
    targets = [Target(current, ctx.spec, n, "stable", n)]
    new_prev: str | None = None
    expires: datetime | None = None
    if keep > 0:
        new_prev, expires = stable, now + _seconds(ro.keep_previous.ttl)
        targets.append(Target(stable, ctx.spec_of(stable), keep, "previous", 0))
        ctx.at(expires)
    if ctx.previous is not None and ctx.previous != stable:
        ctx.events.append(
            Event("Normal", "PreviousReplaced", f"revision {ctx.previous}: no longer kept warm")
        )
    if _seconds(ro.bake_time).total_seconds() > 0 and new_prev is not None:
        ctx.at(now + _seconds(ro.interval))
    ready = ctx.in_traffic(current)
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


def _rolled_back(ctx: Rollout, cs: CanaryStep, rb: RollBack) -> Decision:
    """The canary's pods leave traffic at once, the stable takes 100 %; the failed revision is scaled down
    (kept out of traffic for ``abortScaleDownDelay`` first); Degraded until the spec changes."""
    stable, current, n = ctx.stable, ctx.current, ctx.replicas
    ctx.record(current, rb.kind, rb.reason, rb.measurement)
    warm = ctx.warm_previous()
    targets = [
        Target(stable, ctx.spec_of(stable), n, "stable", n),
        *warm,
        *ctx.failed(stable, ctx.previous or ""),
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


STATES: dict[State, Callable[[Rollout], Decision]] = {
    "deployed": _deployed,
    "stable": _stable,
    "canary": _canary,
    "lost": _lost,
}


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
