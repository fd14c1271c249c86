"""``status`` of a ModelDeployment: conditions, revisions, measurements, the shadow, fallback and
analysis state, history (part of the ModelDeployment API, :mod:`modeldeploy.api`)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from .api_base import (
    CONDITION_TYPE_PATTERN,
    ApiModel,
)


class StatusModel(ApiModel):
    """A part of status: read leniently. Fields it does not know (written by a newer operator, or by
    hand) are ignored at any depth rather than refused: status holds the rollout state, and an operator
    that refused it would act as if there were none. The spec stays strict (``extra="forbid"``)."""

    model_config = ConfigDict(extra="ignore")


ConditionStatus = Literal["True", "False", "Unknown"]


Phase = Literal["Pending", "Progressing", "Shadowing", "Paused", "Healthy", "Degraded", "Failed"]


Role = Literal["stable", "canary", "shadow", "previous", "old", "fallback"]


class Condition(StatusModel):
    """A metav1.Condition."""

    type: str = Field(
        max_length=316,
        pattern=CONDITION_TYPE_PATTERN,
    )
    status: ConditionStatus
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: datetime
    reason: str = Field(max_length=1024, min_length=1, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field(max_length=32768)


class RevisionStatus(StatusModel):
    """Observed state of one revision (one Deployment)."""

    revision: str = Field(max_length=63)
    role: Role
    deployment: str = Field(max_length=253)
    replicas: int = Field(default=0, ge=0, description="Desired pods.")
    current_replicas: int = Field(default=0, ge=0, description="Pods that exist.")
    ready_replicas: int = Field(default=0, ge=0, description="Pods whose server is ready (warm).")
    in_traffic_replicas: int = Field(default=0, ge=0, description="Ready pods that receive traffic.")
    unschedulable_replicas: int = Field(default=0, ge=0)
    scheduling_message: str | None = Field(default=None, max_length=4096)
    model_version: str | None = Field(default=None, max_length=63)


class JudgeMeasurement(StatusModel):
    """What the statistical judge compared: medians, samples, the increase's interval and p-value."""

    canary: float | None = Field(default=None, description="The canary's median sample.")
    stable: float | None = Field(default=None, description="The stable's median sample.")
    canary_samples: int = Field(ge=0)
    stable_samples: int = Field(ge=0)
    low: float | None = Field(default=None, description="The increase's confidence interval, low end.")
    high: float | None = Field(default=None, description="The increase's confidence interval, high end.")
    p_value: float | None = Field(default=None, description="One-sided Mann-Whitney: the canary larger.")
    reason: str = Field(default="", max_length=256)


class Measurement(StatusModel):
    """One analysis measurement: the query, what it returned, the threshold and the verdict."""

    metric: str = Field(max_length=63)
    query: str = Field(max_length=8192)
    value: float | None = None
    threshold: float | None = None
    verdict: Literal["Pass", "Fail", "NoData", "Error", "Inconclusive"]
    revision: str | None = Field(default=None, max_length=63)
    time: datetime
    error: str | None = Field(
        default=None, max_length=512, description="Why the query failed (verdict Error): kind and message."
    )
    dry_run: bool | None = Field(
        default=None, description="Measured and shown, never decisive (analysis.dryRun)."
    )
    window: str | None = Field(
        default=None, max_length=64, description="The window it was taken for: a step, bake or shadow."
    )
    judge: JudgeMeasurement | None = Field(
        default=None, description="The statistical judge's view of the window (value: the increase)."
    )


class ShadowStatus(StatusModel):
    """The shadow stage of the canary revision (kept in status so a restarted operator resumes it)."""

    revision: str = Field(max_length=63)
    waiting_since: datetime | None = Field(
        default=None, description="Since when the stage waits for its pods and for the stable to copy."
    )
    started_at: datetime | None = Field(
        default=None, description="When every stable server reported copying (the stage's clock)."
    )
    copying_pods: int | None = Field(default=None, ge=0, description="Stable servers that report copying.")
    agreement: float | None = Field(default=None, description="Agreement so far (since started_at).")
    samples: int | None = Field(default=None, ge=0, description="Compared requests so far.")


GateName = Literal["beforeFirstStep", "beforePromotion"]


class GateStatus(StatusModel):
    """The gate the canary revision waits at, or last passed (spec.rollout.gates): who is being waited
    for, since when, and what it last answered."""

    gate: GateName
    revision: str = Field(max_length=63)
    host: str = Field(default="", max_length=512, description="The gate URL's scheme, host and port.")
    waiting_since: datetime | None = Field(default=None, description="When the rollout began asking it.")
    opened_at: datetime | None = Field(default=None, description="When it answered 200 (unset: waiting).")
    message: str = Field(default="", max_length=1024, description="Its last answer, e.g. HTTP 403.")


class FallbackStatus(StatusModel):
    """The CPU fallback: idle, active (answering instead of the GPU revision) or returning."""

    revision: str = Field(max_length=63)
    state: Literal["Idle", "Active", "Returning"] = "Idle"
    no_traffic_since: datetime | None = Field(
        default=None, description="Since when the GPU revision has had no pod in traffic (while idle)."
    )
    active_since: datetime | None = None
    ready_since: datetime | None = Field(
        default=None, description="Since when every GPU pod is ready again (while active: the hysteresis)."
    )
    cause: str | None = Field(default=None, max_length=4096)


class AnalysisStatus(StatusModel):
    """Rollout analysis state (kept in status so a restarted operator resumes it)."""

    consecutive_failures: int = Field(default=0, ge=0)
    consecutive_errors: int = Field(
        default=0, ge=0, description="Consecutive windows whose queries failed (errorLimit pauses)."
    )
    paused_reason: str | None = Field(
        default=None,
        max_length=1024,
        description="Set when errorLimit was reached: nothing is judged until `kubectl modeldeploy resume`.",
    )
    consecutive_inconclusive: int = Field(
        default=0,
        ge=0,
        description="Consecutive Inconclusive windows of the judge (inconclusiveLimit pauses).",
    )
    no_data_since: datetime | None = None
    last_run: datetime | None = None
    measurements: list[Measurement] = Field(default_factory=list, max_length=512)


#: entries kept in ``status.history`` (the oldest go first)
HISTORY_LIMIT = 20


#: what a history entry says to a reader (kubectl, events, the Degraded reason)
HistoryOutcome = Literal[
    "Deployed", "Promoted", "RolledBack", "Aborted", "Superseded", "FailedBack", "Expired"
]


#: what a history entry means to the rollout state machine. ``Deployed``: straight to 100 % without a
#: canary (the first revision, or the stable revision was gone), so nothing to bake; ``Promoted``: after a
#: canary (or by hand), so the bake analysis runs on it.
HistoryKind = Literal["Deployed", "Promoted", "RolledBack", "Aborted", "Superseded", "FailedBack"]


class HistoryEntry(StatusModel):
    """A decision about a revision."""

    revision: str = Field(max_length=63)
    outcome: HistoryOutcome
    kind: HistoryKind | None = Field(
        default=None,
        description="What the decision means to the rollout (outcome is what it says). Absent in entries "
        "written before this field existed: read as the outcome.",
    )
    time: datetime
    reason: str = Field(default="", max_length=4096)
    measurement: Measurement | None = None

    @model_validator(mode="after")
    def _legacy_kind(self) -> HistoryEntry:
        """An entry written by an older operator has no ``kind``: it is its outcome. (The one entry that
        reads differently -- ``Promoted`` because the stable revision was gone, kind ``Deployed`` -- never
        had a warm previous revision next to it, which is all that the difference decides.)"""
        if self.kind is None and self.outcome != "Expired":
            self.kind = self.outcome
        return self


class ModelDeploymentStatus(StatusModel):
    """Observed state of a ModelDeployment; all rollout state lives here."""

    observed_generation: int | None = Field(default=None, ge=0)
    phase: Phase | None = None
    revision: str | None = Field(default=None, max_length=63, description="The revision of the current spec.")
    stable_revision: str | None = Field(default=None, max_length=63)
    stable_spec: str | None = Field(
        default=None,
        max_length=65536,
        description="The stable revision's pod-shaping spec (JSON, as on its Deployment's "
        "modeldeploy.io/revision-spec annotation): the stable is rebuilt from it when its Deployment is "
        "missing or unreadable, never inferred from whatever Deployment exists.",
    )
    canary_revision: str | None = Field(default=None, max_length=63)
    previous_revision: str | None = Field(default=None, max_length=63)
    previous_expires_at: datetime | None = None
    canary_weight: int | None = Field(default=None, ge=0, le=100, description="Requested canary weight.")
    achieved_canary_weight: int | None = Field(default=None, ge=0, le=100)
    step: int | None = Field(default=None, ge=0, le=20, description="Index into spec.rollout.steps.")
    step_started_at: datetime | None = Field(
        default=None, description="When the current step's pods were all in traffic (its clock)."
    )
    step_waiting_since: datetime | None = Field(
        default=None,
        description="When the current step began waiting for its pods (progressDeadline counts from here).",
    )
    replicas: int | None = Field(default=None, ge=0, description="Pods of all revisions.")
    serving_replicas: int | None = Field(
        default=None,
        ge=0,
        description="The serving replicas the operator acted on (spec.replicas, split between revisions "
        "during a canary): the scale subresource's status replicas, which an HPA compares with its "
        "recommendation.",
    )
    selector: str | None = Field(
        default=None, max_length=1024, description="Label selector of the pods (the scale subresource's)."
    )
    autoscaler: str | None = Field(
        default=None,
        max_length=253,
        description="The KEDA ScaledObject the operator owns for spec.autoscaling.",
    )
    ready_replicas: int | None = Field(default=None, ge=0, description="In-traffic ready pods.")
    ready: str | None = Field(default=None, max_length=32, description="ready/desired, for printing.")
    revisions: list[RevisionStatus] = Field(
        default_factory=list,
        max_length=16,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["revision"]},
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=8,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    shadow: ShadowStatus | None = None
    gate: GateStatus | None = None
    fallback: FallbackStatus | None = None
    analysis: AnalysisStatus | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT)
