"""``spec.rollout`` and the specs beside it (traffic routing, analysis, shadow stage, fallback,
autoscaling): part of the ModelDeployment API (:mod:`modeldeploy.api`)."""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .api_base import (
    NAME_PATTERN,
    URI_PATTERN,
    ApiModel,
    Duration,
    Quantity,
    cel_rule,
    cel_validations,
    check_http_url,
    check_quantity,
    default_of,
    http_url_extra,
    parse_duration,
)


class ParentRef(ApiModel):
    """A Gateway API parentRef (the Gateway the HTTPRoute attaches to)."""

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    section_name: str | None = Field(default=None, max_length=253)
    port: int | None = Field(default=None, ge=1, le=65535)
    group: str = Field(default="gateway.networking.k8s.io", max_length=253)
    kind: str = Field(default="Gateway", max_length=63)


class HeaderMatch(ApiModel):
    """An HTTP request header (exact value), as in a Gateway API HTTPHeaderMatch."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    value: str = Field(min_length=1, max_length=4096)


class GatewayAPISpec(ApiModel):
    """Routing through a Gateway API HTTPRoute with weighted per-revision backends."""

    parent_refs: list[ParentRef] = Field(min_length=1, max_length=16)
    hostnames: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=16)
    canary_header: HeaderMatch | None = Field(
        default=None,
        description="A request carrying this header (exact value), e.g. x-modeldeploy-canary: always, goes "
        "to the canary revision whatever the step's weight, during every step (not during the shadow "
        "stage, whose revision answers no client); removed at promotion or rollback.",
    )


class TrafficRoutingSpec(ApiModel):
    """How traffic is split between revisions."""

    mode: Literal["replicas", "gatewayAPI"] = Field(
        default="replicas",
        description="replicas: the model Service spreads over in-traffic pods (works anywhere); "
        "gatewayAPI: exact weights through an HTTPRoute.",
    )
    gateway_api: GatewayAPISpec | None = Field(default=None, alias="gatewayAPI")

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule(
                "self.mode != 'gatewayAPI' || has(self.gatewayAPI)",
                "spec.rollout.trafficRouting.gatewayAPI is required when mode is gatewayAPI",
                ".gatewayAPI",
                "FieldValueRequired",
            )
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> TrafficRoutingSpec:
        if self.mode == "gatewayAPI" and self.gateway_api is None:
            raise ValueError("spec.rollout.trafficRouting.gatewayAPI is required when mode is gatewayAPI")
        return self


class MetricCheck(ApiModel):
    """A custom analysis metric: a PromQL template and a max or min threshold.

    The query may use {{namespace}}, {{name}}, {{revision}} and {{interval}}.
    """

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    query: str = Field(
        min_length=1,
        max_length=4096,
        description="PromQL; may use {{namespace}}, {{name}}, {{revision}}, {{interval}}. Every selector must"
        ' carry namespace="{{namespace}}": a query that could read another namespace is refused (the'
        " ModelDeployment is reported InvalidSpec).",
    )
    max: float | None = Field(default=None, description="Fail when the value is above.")
    min: float | None = Field(default=None, description="Fail when the value is below.")

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule("has(self.max) != has(self.min)", "exactly one of max or min must be set")
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> MetricCheck:
        if (self.max is None) == (self.min is None):
            raise ValueError("exactly one of max or min must be set")
        return self


class JudgeSpec(ApiModel):
    """The statistical judge: the canary's samples against the stable's from the same window (Kayenta's
    Mann-Whitney judge; modeldeploy.judge_stats). One sample is one ``sampleInterval`` of the window: the
    mean request latency (for task generation: the mean time to first token) and the share of server
    errors of the revision's requests in it."""

    method: Literal["mannWhitney"] = Field(
        default="mannWhitney",
        description="Mann-Whitney U test with a Hodges-Lehmann effect estimate, beside Welch's t-test on the "
        "mean (a canary slow in a share of its intervals moves the mean, not the median). No sample is "
        "trimmed as an outlier.",
    )
    confidence: float = Field(
        default=0.98, ge=0.5, le=0.9999, description="An increase is significant when p < 1 - confidence."
    )
    max_increase: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="Latency: the largest allowed increase over the stable's median (and mean), as a "
        "fraction (0.25 = +25 %). A significant larger increase of either fails the window, and so does an "
        "interval of the increase that lies wholly above this, however wide.",
    )
    max_error_increase: float = Field(
        default=0.01,
        gt=0,
        le=1,
        description="Server error share: the largest allowed absolute increase over the stable's.",
    )
    sample_interval: Duration = Field(
        default="10s",
        description="The span of one sample; at least two Prometheus scrape intervals (a rate needs two "
        "scrapes). The window (spec.rollout.interval) holds interval / sampleInterval samples.",
        json_schema_extra=cel_validations(
            cel_rule(
                "duration(self) >= duration('1s')",
                "spec.rollout.analysis.judge.sampleInterval must be at least 1s",
            )
        ),
    )
    min_samples: int = Field(
        default=6, ge=3, le=1000, description="Fewer samples on either side: Inconclusive."
    )
    inconclusive_limit: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Consecutive Inconclusive windows (the step is held) before the rollout is paused for "
        "a human (`kubectl modeldeploy resume`).",
    )

    @field_validator("sample_interval")
    @classmethod
    def _sample_interval(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("spec.rollout.analysis.judge.sampleInterval must be at least 1s")
        return value


class AnalysisSpec(ApiModel):
    """How each canary step is judged from Prometheus."""

    max_error_rate: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Maximum share of the server's own failures: 5xx, and 413/429 from admission control.",
    )
    max_client_error_rate_increase: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Maximum increase of the canary's 4xx share (413/429 excepted) over the stable's in the "
        "same window (a renamed model answers 404 to every client). 1 turns the check off (for APIs "
        "where 4xx is normal and moves with traffic).",
    )
    error_limit: int = Field(
        default=4,
        ge=1,
        le=100,
        description="Consecutive windows whose queries failed (timeout, refused, non-2xx, unparseable, more "
        "than one series) before the rollout is paused for a human. An error never passes a window.",
    )
    query_timeout: Duration = Field(
        default="10s", description="Total deadline of one Prometheus query (connect, send, whole answer)."
    )
    max_p99_latency_ms: int = Field(
        default=1000,
        ge=1,
        le=600_000,
        description="Maximum p99 request latency (not asked for spec.model.task generation, where a "
        "request lasts as long as its answer: see maxTTFTP99Ms).",
    )
    max_ttft_p99_ms: int | None = Field(
        default=None,
        ge=1,
        le=600_000,
        alias="maxTTFTP99Ms",
        description="Generation: maximum p99 time to first token (unset: not checked).",
    )
    max_time_per_output_token_p99_ms: int | None = Field(
        default=None,
        ge=1,
        le=600_000,
        alias="maxTimePerOutputTokenP99Ms",
        description="Generation: maximum p99 time between two generated tokens (unset: not checked).",
    )
    max_latency_ratio_to_stable: float | None = Field(
        default=None, ge=1, le=100, description="Maximum canary p99 / stable p99."
    )
    min_requests: int = Field(
        default=20, ge=0, le=1_000_000, description="Fewer requests in a window count as no data."
    )
    failure_limit: int = Field(
        default=1, ge=1, le=100, description="Consecutive failed checks before rollback."
    )
    on_no_data: Literal["hold", "fail", "pass"] = Field(
        default="hold", description="What a window without enough data means."
    )
    no_data_timeout: Duration = Field(default="5m", description="How long 'hold' waits before failing.")
    prometheus_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://.+$",
        alias="prometheusURL",
        description="Prometheus to query (default: the operator's --prometheus-url).",
    )
    metrics: list[MetricCheck] = Field(default_factory=list, max_length=16)
    min_agreement: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Keep comparing outputs during every canary step and bakeTime: the stable copies "
        "agreementSampleRate of its requests to the canary (in bakeTime: the new stable to the warm "
        "previous revision); a lower share of agreeing answers fails the window.",
    )
    agreement_sample_rate: float = Field(
        default=0.2, gt=0, le=1, description="Share of requests copied for minAgreement (canary, bake)."
    )
    judge: JudgeSpec | None = Field(
        default=None,
        description="Also compare the canary's latency and error samples with the stable's in each window "
        "(unset: fixed thresholds only).",
    )
    dry_run: list[Annotated[str, Field(max_length=63)]] = Field(
        default_factory=list,
        max_length=32,
        alias="dryRun",
        description="Measurements (by metric name, e.g. judge-latency-ms, p99-latency-ms, a custom "
        "metric) that are measured and shown but never decide a window.",
    )
    measurement_retention: int = Field(
        default=5, ge=1, le=20, description="Measurements kept in status per metric (the newest)."
    )


class CompareSpec(ApiModel):
    """How a shadow's output and the stable's are said to agree (per request; every output must agree)."""

    method: Literal["auto", "cosine", "argmax", "allclose", "exact", "tokenAgreement"] = Field(
        default="auto",
        description="auto: integer/bool/bytes -> exact; a classification model's scores -> argmax; other "
        "float tensors of rank >= 2 -> cosine per row, rank < 2 -> allclose; task generation -> "
        "tokenAgreement. A custom handler's compare(a, b) wins over any method. For task generation only "
        "auto, exact (the same text) and tokenAgreement.",
    )
    min_cosine: float = Field(default=0.99, ge=-1, le=1, description="cosine: the lowest row's minimum.")
    rtol: float = Field(default=1.0e-3, ge=0, le=1, description="allclose: relative tolerance.")
    atol: float = Field(default=1.0e-5, ge=0, description="allclose: absolute tolerance.")
    min_token_agreement: float = Field(
        default=0.9,
        ge=0,
        le=1,
        description="tokenAgreement: the share of positions holding the same token, up to the shorter of the "
        "two greedy answers, for a copy to agree.",
    )


class ShadowSpec(ApiModel):
    """A shadow stage before the first canary step: the stable servers copy a sample of the requests they
    answer to the new revision (out of traffic), compare its outputs with theirs and count; the
    agreement, the shadow's error rate and its p99 latency are judged at the end of ``duration``."""

    duration: Duration = Field(
        description="How long the new revision shadows the stable one (the clock starts once every stable "
        "server reports that it is copying).",
        json_schema_extra=cel_validations(
            cel_rule("duration(self) >= duration('1s')", "spec.rollout.shadow.duration must be at least 1s")
        ),
    )
    sample_rate: float = Field(
        default=0.2, gt=0, le=1, description="Share of the stable revision's requests copied to the shadow."
    )
    min_samples: int = Field(
        default=200,
        ge=0,
        le=100_000_000,
        description="Fewer compared requests by the end of duration is no data (onNoData applies).",
    )
    min_agreement: float = Field(
        default=0.99,
        ge=0,
        le=1,
        description="Share of compared requests that must agree; below it, rollback.",
    )
    compare: CompareSpec = Field(default_factory=CompareSpec, json_schema_extra=default_of(CompareSpec))
    timeout: Duration = Field(default="5s", description="A copy unanswered this long counts as a timeout.")
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Pods of the shadow revision (default: replicas x sampleRate, rounded up, at least 1).",
    )

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("spec.rollout.shadow.duration must be at least 1s")
        return value


#: what a rollout notification tells (modeldeploy.notify maps Events to them)
NotificationType = Literal[
    "Started",
    "ShadowResult",
    "StepAdvanced",
    "Promoted",
    "RolledBack",
    "FailedBack",
    "Paused",
    "FallbackOn",
    "FallbackOff",
]


WEBHOOK_URL_FIELD = "spec.rollout.notifications[].url"


class WebhookSpec(ApiModel):
    """A receiver of this ModelDeployment's rollout events (never in the rollout's way)."""

    url: str = Field(
        max_length=2048,
        description="POSTed to for each event; signed (X-ModelDeploy-Timestamp, "
        "X-ModelDeploy-Signature-256) when the operator has a signing key. http(s), a host, a port from 1 "
        "to 65535 if any, no credentials.",
        json_schema_extra=http_url_extra(WEBHOOK_URL_FIELD),
    )
    format: Literal["json", "slack", "cloudevents"] = Field(
        default="json", description="json, a Slack-compatible {text}, or CloudEvents 1.0 (structured)."
    )
    events: list[NotificationType] = Field(
        default_factory=list,
        max_length=9,
        description="The events to send (empty: all).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    timeout: Duration = Field(
        default="5s",
        description="One try, connect to the answer's status (at most 30s); 3 tries with backoff.",
        json_schema_extra=cel_validations(
            cel_rule(
                "duration(self) <= duration('30s')",
                "spec.rollout.notifications[].timeout must be at most 30s",
            )
        ),
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_http_url(value, WEBHOOK_URL_FIELD)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        if parse_duration(value) > 30:
            raise ValueError("spec.rollout.notifications[].timeout must be at most 30s")
        return value


GATE_URL_FIELD = "spec.rollout.gates.beforeFirstStep/beforePromotion.url"


GATE_TIMEOUT_MESSAGE = "spec.rollout.gates.beforeFirstStep/beforePromotion.timeout must be at most 30s"


class GateSpec(ApiModel):
    """A URL the operator asks before the rollout goes on (Flagger's confirm-rollout / confirm-promotion):
    HTTP 200 = go; anything else, no answer in time included, = wait (asked again every few seconds)."""

    url: str = Field(
        max_length=2048,
        description="POSTed to ({namespace, name, revision, gate}); 200 opens the gate, anything else keeps "
        "it closed. Host in --notification-allowed-hosts, when set. http(s), a host, a port from 1 to 65535 "
        "if any, no credentials.",
        json_schema_extra=http_url_extra(GATE_URL_FIELD),
    )
    timeout: Duration = Field(
        default="5s",
        description="One ask, connect to the answer's status (at most 30s); no answer in time: closed.",
        json_schema_extra=cel_validations(
            cel_rule("duration(self) <= duration('30s')", GATE_TIMEOUT_MESSAGE)
        ),
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_http_url(value, GATE_URL_FIELD)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        if parse_duration(value) > 30:
            raise ValueError(GATE_TIMEOUT_MESSAGE)
        return value


class GatesSpec(ApiModel):
    """Gates a rollout waits at until their URL answers 200 (a closed gate never fails a rollout)."""

    before_first_step: GateSpec | None = Field(
        default=None,
        description="Asked before any traffic moves to the canary (after the shadow stage, if any): its "
        "pods come up warm, out of traffic, until the gate is open.",
    )
    before_promotion: GateSpec | None = Field(
        default=None,
        description="Asked once the last step's analysis passed: promotion waits until the gate is open "
        "(the last step's windows go on being judged meanwhile).",
    )


class KeepPreviousSpec(ApiModel):
    """Warm standby of the previous stable revision after a promotion."""

    replicas: int = Field(default=1, ge=0, le=100, description="Pods of the previous revision kept warm.")
    ttl: Duration = Field(default="30m", description="How long the previous revision is kept warm.")


JUDGE_WINDOW_MESSAGE = (
    "spec.rollout.analysis.judge.sampleInterval: a window (spec.rollout.interval) must hold at least "
    "judge.minSamples samples of sampleInterval"
)


class RolloutSpec(ApiModel):
    """Progressive delivery of a new revision."""

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [5, 25, 50, 100],
        min_length=1,
        max_length=20,
        description="Canary traffic percentages; strictly increasing, each 1..100, the last 100.",
        json_schema_extra={
            "default": [5, 25, 50, 100],
            "x-kubernetes-list-type": "set",
            **cel_validations(
                cel_rule("self.isSorted()", "spec.rollout.steps must be strictly increasing"),
                cel_rule("self[size(self) - 1] == 100", "the last of spec.rollout.steps must be 100"),
            ),
        },
    )
    interval: Duration = Field(
        default="1m",
        description="How long each step is held before it is judged.",
        json_schema_extra=cel_validations(
            cel_rule("duration(self) >= duration('1s')", "spec.rollout.interval must be at least 1s")
        ),
    )
    traffic_routing: TrafficRoutingSpec = Field(
        default_factory=TrafficRoutingSpec, json_schema_extra=default_of(TrafficRoutingSpec)
    )
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, json_schema_extra=default_of(AnalysisSpec))
    bake_time: Duration = Field(default="5m", description="Analysis keeps running this long after promotion.")
    keep_previous: KeepPreviousSpec = Field(
        default_factory=KeepPreviousSpec, json_schema_extra=default_of(KeepPreviousSpec)
    )
    progress_deadline: Duration = Field(
        default="10m", description="A canary whose pods are not ready within this is aborted."
    )
    abort_scale_down_delay: Duration = Field(
        default="0s", description="How long a failed revision's pods are kept for debugging."
    )
    paused: bool = Field(default=False, description="Hold the current step.")
    shadow: ShadowSpec | None = Field(
        default=None, description="A shadow stage before the first step (unset: none)."
    )
    notifications: list[WebhookSpec] = Field(
        default_factory=list,
        max_length=8,
        description="Webhooks told of this rollout's events (started, shadow result, step advanced, "
        "promoted, rolled back, failed back, paused, fallback on/off).",
    )
    gates: GatesSpec | None = Field(
        default=None,
        description="URLs asked before the first step and before promotion (200: go; anything else: wait).",
    )

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule(
                "!has(self.analysis) || !has(self.analysis.judge)"
                " || duration(self.interval).getMilliseconds() >= self.analysis.judge.minSamples"
                " * duration(self.analysis.judge.sampleInterval).getMilliseconds()",
                JUDGE_WINDOW_MESSAGE,
                ".analysis.judge.sampleInterval",
            )
        )
    )

    @model_validator(mode="after")
    def _judge_fits(self) -> RolloutSpec:
        judge = self.analysis.judge
        if judge is not None:
            samples = parse_duration(self.interval) / parse_duration(judge.sample_interval)
            if samples < judge.min_samples:
                raise ValueError(JUDGE_WINDOW_MESSAGE)
        return self

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError("spec.rollout.steps must be strictly increasing")
        if steps and steps[-1] != 100:
            raise ValueError("the last of spec.rollout.steps must be 100")
        return steps

    @field_validator("interval")
    @classmethod
    def _interval(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("spec.rollout.interval must be at least 1s")
        return value


class FallbackModelSpec(ApiModel):
    """A lighter model for the CPU fallback (unset fields: the serving revision's)."""

    version: str | None = Field(default=None, min_length=1, max_length=63, pattern=NAME_PATTERN)
    uri: str | None = Field(default=None, max_length=2048, pattern=URI_PATTERN)
    format: Literal["auto", "hf", "torchscript", "export", "custom", "noop"] | None = None
    task: Literal["auto", "embedding", "classification", "generation"] | None = None
    handler: str | None = Field(default=None, max_length=512)


class FallbackSpec(ApiModel):
    """A CPU revision that answers while the GPU revision has no pod in traffic (GPUs gone, node failed,
    pods unschedulable or crash-looping): slower, but the service keeps answering."""

    enabled: bool = Field(default=True, description="false: never fall back (the spec may stay).")
    after: Duration = Field(
        default="60s", description="How long the GPU revision may have no pod in traffic before the fallback."
    )
    return_after: Duration = Field(
        default="30s",
        description="How long every GPU pod must be ready again before traffic returns to them (hysteresis).",
    )
    replicas: int = Field(default=1, ge=1, le=100, description="Pods of the fallback revision while active.")
    idle_replicas: int = Field(
        default=0, ge=0, le=100, description="Pods kept warm (out of traffic) while the fallback is idle."
    )
    cpu: Quantity = Field(default="2", description="CPU request per fallback pod.")
    memory: Quantity = Field(default="4Gi", description="Memory request and limit per fallback pod.")
    model: FallbackModelSpec | None = Field(default=None, description="A lighter model (default: the same).")

    _q = field_validator("cpu", "memory")(check_quantity)


SPELLING_MESSAGE = (
    "spec.autoscaling.prometheusUrl is the deprecated spelling of prometheusURL: set only prometheusURL"
)


class AutoscalingSpec(ApiModel):
    """Scale ``spec.replicas`` on a serving signal: the operator owns a KEDA ScaledObject (Prometheus
    trigger) whose HPA writes ``spec.replicas`` through the scale subresource; during a canary the operator
    splits those replicas between the revisions by the step's weight."""

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Never fewer serving pods.")
    max_replicas: int = Field(ge=1, le=1000, description="Never more serving pods.")
    metric: Literal[
        "concurrency", "queueWaitP90", "queueDepth", "requestRate", "waitingSequences", "kvCacheUsage"
    ] = Field(
        default="concurrency",
        description="concurrency: requests in the server (queued or running; for task generation the "
        "sequences running or waiting) per pod; queueWaitP90: the 90th percentile of the batching queue "
        "wait (seconds, all pods); queueDepth: items waiting per pod; requestRate: requests per second per "
        "pod; waitingSequences (task generation): sequences admitted and not started, per pod; "
        "kvCacheUsage (task generation): the mean share of the KV cache in use, 0..1.",
    )
    target: float = Field(
        gt=0,
        description="The value per pod (concurrency, queueDepth, requestRate, waitingSequences) or overall "
        "(queueWaitP90 in seconds, kvCacheUsage as a share at most 1) to hold.",
    )
    window: Duration = Field(default="1m", description="The rate window of queueWaitP90 and requestRate.")
    polling_interval: Duration = Field(default="15s", description="How often KEDA reads the metric.")
    scale_down_stabilization: Duration = Field(
        default="5m", description="The highest recommendation of this long wins a scale-down (HPA behavior)."
    )
    prometheus_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://.+$",
        alias="prometheusURL",
        description="Prometheus as KEDA reaches it (unset: spec.rollout.analysis.prometheusURL, else the "
        "operator's).",
    )
    prometheus_url_deprecated: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://.+$",
        alias="prometheusUrl",
        description="Deprecated: the old spelling of prometheusURL, still read (a DeprecatedField warning "
        "event says so); not together with prometheusURL.",
    )

    @property
    def prometheus(self) -> str | None:
        """The Prometheus URL for KEDA, by either spelling."""
        return self.prometheus_url or self.prometheus_url_deprecated

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule(
                "self.minReplicas <= self.maxReplicas",
                "spec.autoscaling.minReplicas must not exceed maxReplicas",
                ".minReplicas",
            ),
            cel_rule(
                "!has(self.metric) || self.metric != 'kvCacheUsage' || self.target <= 1.0",
                "spec.autoscaling.target: kvCacheUsage is a share of the KV cache, at most 1",
                ".target",
            ),
            cel_rule(
                "!has(self.prometheusURL) || !has(self.prometheusUrl)",
                SPELLING_MESSAGE,
                ".prometheusUrl",
            ),
        )
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must not exceed maxReplicas")
        if self.metric == "kvCacheUsage" and self.target > 1:
            raise ValueError("spec.autoscaling.target: kvCacheUsage is a share of the KV cache, at most 1")
        if self.prometheus_url is not None and self.prometheus_url_deprecated is not None:
            raise ValueError(SPELLING_MESSAGE)
        return self

    @field_validator("polling_interval", "window")
    @classmethod
    def _at_least_1s(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("must be at least 1s")
        return value
