"""The rollout state machine's values (pure data and small helpers; :mod:`modeldeploy.canary` decides):
what it decides (:class:`Decision`, :class:`Target`, events, history kinds), what it asks for
(:class:`AnalysisRequest`, :data:`Measure`, :class:`Probe`), the copies it sets up (:class:`Mirror`),
commands, and the outcome of one canary step (:class:`Promote`, :class:`RollBack`, :class:`NextStep`,
:class:`FailBack`, :class:`CanaryStep`)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from .analysis import Judgement, build_queries, build_shadow_queries
from .api import (
    AnalysisStatus,
    CompareSpec,
    GateName,
    GateStatus,
    HistoryEntry,
    HistoryKind,
    Measurement,
    ModelDeployment,
    ModelDeploymentSpec,
    Role,
    RolloutSpec,
    ShadowSpec,
    ShadowStatus,
    parse_duration,
)

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
                generation=md.spec.model.task == "generation",
            )
        return build_queries(
            ro.analysis,
            namespace=self.namespace,
            name=self.name,
            revision=self.revision,
            stable=self.stable,
            interval=self.interval,
            agreement_with=self.agreement_with,
            generation=md.spec.model.task == "generation",
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
class GateAnswer:
    """A gate's answer: open (it answered 200) or closed, with a one-line reason (``HTTP 403``, ``no
    answer within 5s``, ``host ... is not allowed``)."""

    open: bool
    reason: str


class Gates(Protocol):
    """Where the rollout's gates are asked (I/O off the reconcile path, :mod:`modeldeploy.gates`; a fake
    in unit tests)."""

    def ask(
        self, namespace: str, name: str, revision: str, gate: GateName, url: str, timeout: float
    ) -> GateAnswer | None:
        """The newest answer of ``gate`` for ``revision`` (None: not answered yet); asking again in the
        background when it is a few seconds old."""
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
        """The pod annotation ``modeldeploy.io/shadow`` the source's servers read (modelserver.shadow).
        Current servers take the revision from it and build the URL themselves (refusing the file if
        ``url`` differs); ``url`` is there for servers of older images, which copy to it."""
        c = self.compare
        doc = {
            "url": url,
            "revision": self.target,
            "sampleRate": self.sample_rate,
            "timeoutMs": self.timeout_ms,
            "compare": {
                "method": c.method,
                "minCosine": c.min_cosine,
                "rtol": c.rtol,
                "atol": c.atol,
                "minTokenAgreement": c.min_token_agreement,
            },
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
    gate: GateStatus | None = None  # the gate the canary waits at, or last passed (spec.rollout.gates)
    mirror: Mirror | None = None  # which servers copy requests where
    fallback_revision: str | None = None  # the CPU fallback in traffic (modeldeploy.fallback): route to it


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
    gate: GateStatus | None = None  # the gate it waits at, or last passed


#: a pending measurement is looked at again this soon at the latest (its end also enqueues the reconcile)
MEASUREMENT_RECHECK = timedelta(seconds=15)


def analysis_paused(analysis: AnalysisStatus | None) -> bool:
    """``errorLimit`` consecutive windows whose queries failed: nothing is judged until resumed."""
    return analysis is not None and analysis.paused_reason is not None
