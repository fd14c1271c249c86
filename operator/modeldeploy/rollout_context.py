"""One reconcile of the rollout as the state functions of :mod:`modeldeploy.canary` see it
(:class:`ReconcileContext`): what was observed and what has been decided so far; and the step clock's
helpers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from .analysis import Judgement, Outcome, advance
from .api import (
    HISTORY_LIMIT,
    AnalysisStatus,
    HistoryEntry,
    HistoryKind,
    HistoryOutcome,
    Measurement,
    ModelDeployment,
    ModelDeploymentSpec,
    RolloutSpec,
    parse_duration,
)
from .rollout_types import (
    FAILED_KINDS,
    MEASUREMENT_RECHECK,
    RESULTS,
    WARNING_KINDS,
    AnalysisRequest,
    Command,
    Decision,
    Event,
    Gates,
    Measure,
    Probe,
    RolloutResult,
    Target,
    latest_entry,
    parse_command,
)
from .status import RevisionCounts


def seconds_of(d: str) -> timedelta:
    return timedelta(seconds=parse_duration(d))


def window_due(rollout: RolloutSpec, started: datetime, analysis: AnalysisStatus | None) -> datetime:
    """When the next window is due: one interval after the step started and after the last judgement."""
    last = analysis.last_run if analysis and analysis.last_run else None
    base = max(started, last) if last else started
    return base + seconds_of(rollout.interval)


def tagged(j: Judgement, window: str) -> Judgement:
    """``j`` with each measurement naming the window it was taken for (status, the plugin, history)."""

    def tag(m: Measurement) -> Measurement:
        return m.model_copy(update={"window": window[:64]})

    return replace(j, measurements=[tag(m) for m in j.measurements], failing=j.failing and tag(j.failing))


@dataclass
class ReconcileContext:
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
    gates: Gates | None = None  # the newest answers of spec.rollout.gates (modeldeploy.gate_stage)

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
        gates: Gates | None = None,
    ) -> ReconcileContext:
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
            gates=gates,
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

    def pods_in_traffic(self, revision: str) -> int:
        return self.counts.get(revision, RevisionCounts()).pods_in_traffic

    def routable(self, revision: str) -> bool:
        return self.counts.get(revision, RevisionCounts()).routable

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

    def wake_at(self, when: datetime | None) -> None:
        """Reconcile again at ``when`` (the earliest of these is the requeue time)."""
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
            self.wake_at(self.now + MEASUREMENT_RECHECK)
            return None
        judgement = tagged(judgement, what)
        out = advance(self.rollout.analysis, analysis, judgement, self.now)
        # a failed window is AnalysisFailed even below failureLimit; a held window (no data) AnalysisHold;
        # a window whose queries failed AnalysisError
        verdict = {
            "Pass": "AnalysisPassed",
            "Fail": "AnalysisFailed",
            "NoData": "AnalysisHold",
            "Error": "AnalysisError",
            "Inconclusive": "AnalysisInconclusive",
        }[out.verdict]
        self.events.append(
            Event(
                "Normal" if out.verdict == "Pass" else "Warning",
                verdict,
                f"revision {revision} ({what}): {out.reason}"
                + "".join(
                    f"; {m.metric}={m.value} (threshold {m.threshold}, {m.verdict}"
                    f"{', dry run' if m.dry_run else ''}) query: {m.query}"
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
        self.wake_at(self.previous_expires_at)
        return [Target(previous, self.spec_of(previous), self.rollout.keep_previous.replicas, "previous", 0)]

    def failed_kept(self, *besides: str) -> list[Target]:
        """Failed revisions kept out of traffic for ``abortScaleDownDelay`` (for debugging)."""
        delay = seconds_of(self.rollout.abort_scale_down_delay)
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
                self.wake_at(until)
        return out

    def finish(self, d: Decision) -> Decision:
        d.history = self.history
        d.events = [*self.events, *d.events]
        d.results = [*self.results, *d.results]
        d.routing_mode = self.rollout.traffic_routing.mode
        d.requeue_at = min(self.wake) if self.wake else None
        return d
