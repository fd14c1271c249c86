"""The ModelDeployment API: pydantic v2 models of spec and status.

These models are the single source of truth of the API. ``modeldeploy.crdgen`` turns them into the
CRD's OpenAPI v3 structural schema (``crds/modeldeployment.yaml``); the operator parses live objects
with them. Every rule the apiserver enforces through a CEL ``x-kubernetes-validations`` rule is also
enforced here by a validator, so a spec that the apiserver accepts parses, and the unit tests can check
both sides against the same list of bad manifests.

Field names are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

import itertools
import os
import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError

from .promql_scope import ScopeError, render, scoped

GROUP = "modeldeploy.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ModelDeployment"
PLURAL = "modeldeployments"
SINGULAR = "modeldeployment"
SHORT_NAMES = ["md"]
CATEGORIES = ["modeldeploy"]

DEFAULT_IMAGE = "modeldeploy/modelserver:dev"


def default_image() -> str:
    """The image of ModelDeployments that set none: ``$MODELDEPLOY_DEFAULT_IMAGE`` or DEFAULT_IMAGE."""
    return os.environ.get("MODELDEPLOY_DEFAULT_IMAGE") or DEFAULT_IMAGE


#: a ModelDeployment's name becomes part of ``<name>-<revision>`` Service names (DNS-1035, 63 chars)
MAX_NAME_LENGTH = 52

#: the Gateway API's duration format (GEP-2257): 1 to 4 parts of 1 to 5 digits and a unit h, m, s or ms
#: (no fractions, no sign, no spaces; parts add up: "1h30m", "1m500ms"); the CRD validates the same
DURATION_PATTERN = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"
_NUMBER = r"(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
QUANTITY_PATTERN = rf"^{_NUMBER}(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?{_NUMBER}))?$"
NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"
_DNS_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
LABEL_KEY_PATTERN = rf"^{_DNS_PREFIX}[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
CONDITION_TYPE_PATTERN = rf"^{_DNS_PREFIX}(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
URI_PATTERN = r"^(file|https?|noop|s3|pvc)://.+$"
#: ``s3://bucket`` or ``s3://bucket/prefix-or-key`` (S3 bucket naming rules)
S3_URI_PATTERN = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$"
#: ``pvc://claim`` or ``pvc://claim/path/in/the/volume`` (a claim name is a DNS-1123 subdomain)
PVC_URI_PATTERN = r"^pvc://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(/.*)?$"

_DURATION_PART = re.compile(r"([0-9]+)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: str) -> float:
    """Seconds in a Gateway API duration (GEP-2257, :data:`DURATION_PATTERN`): ``"1m30s"`` -> 90.0."""
    if not re.fullmatch(DURATION_PATTERN, value):
        raise ValueError(f"not a duration (GEP-2257, e.g. 30s, 1m, 1h30m, 500ms): {value!r}")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value))


def _cel(rule: str, message: str, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The wire form (camelCase), without unset optional fields."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _default_of(model: type[_Model]) -> dict[str, Any]:
    """The schema default of a nested object: the whole object with its defaults (the apiserver checks
    a default against the CEL rules as it is, without filling in nested defaults first)."""
    return {"default": model().to_api()}


Duration = Annotated[str, Field(pattern=DURATION_PATTERN, max_length=32)]
Quantity = Annotated[
    int | str,
    Field(
        json_schema_extra={
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }
    ),
]


def _check_quantity(value: int | str | None) -> int | str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string such as 500m or 2Gi")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a quantity must not be negative")
        return value
    if not re.fullmatch(QUANTITY_PATTERN, value):
        raise ValueError(f"not a quantity (e.g. 500m, 2, 4Gi): {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- spec


class LocalObjectReference(_Model):
    """A reference to an object in the ModelDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class CABundleSpec(_Model):
    """A CA bundle (PEM) from a ConfigMap key, for an object store with a private CA."""

    config_map_ref: LocalObjectReference = Field(description="The ConfigMap holding the bundle.")
    key: str = Field(default="ca.crt", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class NodeCacheSpec(_Model):
    """A node-local cache of fetched models (a hostPath directory shared by the pods of a node)."""

    enabled: bool = Field(default=True, description="Fetch through the node's cache.")
    max_size: Quantity = Field(
        default="100Gi", description="Size cap of the node's cache; least recently used models go first."
    )

    _q = field_validator("max_size")(_check_quantity)


class StorageSpec(_Model):
    """How the fetch init container reaches an ``s3://`` model. The operator never reads the Secret:
    the pod references it."""

    secret_ref: LocalObjectReference | None = Field(
        default=None,
        description="A Secret with the keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (unset: anonymous).",
    )
    endpoint: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s/]+(/.*)?$",
        description="The S3-compatible endpoint URL (unset: AWS S3).",
    )
    region: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$", description="AWS_DEFAULT_REGION."
    )
    addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="Bucket in the path (most S3-compatible stores) or in the host name."
    )
    verify_tls: bool = Field(default=True, description="Verify the endpoint's TLS certificate.")
    ca_bundle: CABundleSpec | None = Field(default=None, description="Trust this CA for the endpoint.")
    timeout: Duration = Field(
        default="10m", description="The whole download's deadline; the pod reports DownloadTimeout after it."
    )
    max_size: Quantity | None = Field(
        default=None, description="Refuse a model larger than this (TooLarge) before downloading it."
    )
    node_cache: NodeCacheSpec | None = Field(
        default=None,
        description="Fetch through a node-local cache (restarts and rollbacks do not download again).",
    )

    _q = field_validator("max_size")(_check_quantity)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("spec.model.storage.timeout must be at least 1s")
        return value


class ModelSpec(_Model):
    """The model to serve and where the server loads it from."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=NAME_PATTERN,
        description="Model name; served under /v2/models/{name}.",
    )
    version: str = Field(
        default="1",
        min_length=1,
        max_length=63,
        pattern=NAME_PATTERN,
        description="Model version; a new version is a new revision.",
    )
    uri: str = Field(
        min_length=1,
        max_length=2048,
        pattern=URI_PATTERN,
        description="Where the model comes from: s3://bucket/prefix (fetched by an init container, see "
        "storage), pvc://claim/path (the claim mounted read-only), file:// (a path in the image), http(s):// "
        "or noop:// (the built-in test model).",
    )
    format: Literal["auto", "hf", "torchscript", "export", "custom", "noop"] = Field(
        default="auto",
        description="Model format: a Hugging Face directory (hf), TorchScript, a torch.export program, "
        "a custom Python handler class, or auto-detected.",
    )
    task: Literal["auto", "embedding", "classification"] = Field(
        default="auto", description="Task of a Hugging Face model."
    )
    handler: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Custom handler 'path/to/file.py:ClassName' or 'package.module:ClassName' "
        "(format custom).",
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[a-f0-9]{64}$",
        min_length=64,
        max_length=64,
        description="Expected sha256 of the model file or directory digest; the server (or, for s3://, the "
        "fetch) refuses a mismatch.",
    )
    storage: StorageSpec | None = Field(
        default=None, description="Object-store settings for an s3:// uri (endpoint, credentials, cache)."
    )

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "self.format != 'custom' || has(self.handler)",
                "spec.model.handler is required when spec.model.format is custom",
                ".handler",
                "FieldValueRequired",
            ),
            _cel(
                f"!self.uri.startsWith('s3://') || self.uri.matches('{S3_URI_PATTERN}')",
                "spec.model.uri: an s3 uri is s3://<bucket>[/<prefix or key>] with a valid bucket name",
                ".uri",
            ),
            _cel(
                f"!self.uri.startsWith('pvc://') || self.uri.matches('{PVC_URI_PATTERN}')",
                "spec.model.uri: a pvc uri is pvc://<claim name>[/<path in the volume>]",
                ".uri",
            ),
            _cel(
                "!has(self.storage) || self.uri.startsWith('s3://')",
                "spec.model.storage applies to s3:// uris only",
                ".storage",
            ),
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> ModelSpec:
        if self.format == "custom" and not self.handler:
            raise ValueError("spec.model.handler is required when spec.model.format is custom")
        if self.uri.startswith("s3://") and not re.fullmatch(S3_URI_PATTERN, self.uri):
            raise ValueError(
                "spec.model.uri: an s3 uri is s3://<bucket>[/<prefix or key>] with a valid bucket name"
            )
        if self.uri.startswith("pvc://") and not re.fullmatch(PVC_URI_PATTERN, self.uri):
            raise ValueError("spec.model.uri: a pvc uri is pvc://<claim name>[/<path in the volume>]")
        if self.storage is not None and not self.uri.startswith("s3://"):
            raise ValueError("spec.model.storage applies to s3:// uris only")
        return self


class ResourcesSpec(_Model):
    """Compute resources of each serving pod."""

    gpu: int = Field(
        default=0, ge=0, le=16, strict=True, description="nvidia.com/gpu per pod (an integer; 0 = CPU only)."
    )
    cpu: Quantity = Field(default="1", description="CPU request per pod (e.g. 500m, 2).")
    memory: Quantity = Field(default="2Gi", description="Memory request and limit per pod (e.g. 2Gi).")

    _q = field_validator("cpu", "memory")(_check_quantity)


class Toleration(_Model):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=317, pattern=LABEL_KEY_PATTERN)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_PATTERN)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "a toleration with operator Exists must not have a value",
                ".value",
            ),
            _cel(
                "has(self.key) || self.operator == 'Exists'",
                "a toleration without a key must use operator Exists",
                ".operator",
            ),
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> Toleration:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists must not have a value")
        if self.key is None and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        return self


#: length buckets of a spec that sets none (those above maxSequenceLength left out)
DEFAULT_BUCKETS = (32, 64, 128, 256)


class BatchingSpec(_Model):
    """Dynamic batching settings of the inference server."""

    max_batch_size: int = Field(default=16, ge=1, le=1024, description="Maximum items per batch.")
    max_queue_delay_ms: int = Field(
        default=5,
        ge=0,
        le=10_000,
        description="Longest time the oldest queued item waits for a batch to fill.",
    )
    max_queue_size: int = Field(
        default=1024, ge=1, le=1_000_000, description="Queued items beyond which requests get 503."
    )
    max_sequence_length: int = Field(
        default=256, ge=1, le=32_768, description="Maximum tokens per text input."
    )
    buckets: list[Annotated[int, Field(ge=1, le=32_768)]] = Field(
        default_factory=lambda: list(DEFAULT_BUCKETS),
        max_length=32,
        description="Length bucket upper bounds (strictly increasing, at most maxSequenceLength); "
        "empty = derived by the server; unset = 32, 64, 128, 256 up to maxSequenceLength.",
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            **_validations(_cel("self.isSorted()", "spec.batching.buckets must be strictly increasing")),
        },
    )
    default_timeout_ms: int = Field(
        default=10_000, ge=1, le=600_000, description="Per-request deadline when the caller sets none."
    )
    max_timeout_ms: int = Field(
        default=60_000, ge=1, le=600_000, description="Cap for a caller-supplied timeout."
    )

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "self.maxTimeoutMs >= self.defaultTimeoutMs",
                "spec.batching.maxTimeoutMs must be >= spec.batching.defaultTimeoutMs",
                ".maxTimeoutMs",
            ),
            _cel(
                "!has(self.buckets) || self.buckets.all(b, b <= self.maxSequenceLength)",
                "every one of spec.batching.buckets must be <= spec.batching.maxSequenceLength",
                ".buckets",
            ),
        )
    )

    @model_validator(mode="before")
    @classmethod
    def _default_buckets(cls, data: Any) -> Any:
        """Unset buckets are the default ones that fit maxSequenceLength (not a CRD default: that one
        would refuse a spec that only lowers maxSequenceLength, for buckets its author never wrote)."""
        if isinstance(data, dict) and "buckets" not in data:
            msl = data.get("maxSequenceLength", data.get("max_sequence_length", 256))
            if isinstance(msl, int):
                return {**data, "buckets": [b for b in DEFAULT_BUCKETS if b <= msl]}
        return data

    @model_validator(mode="after")
    def _rules(self) -> BatchingSpec:
        if self.max_timeout_ms < self.default_timeout_ms:
            raise ValueError("spec.batching.maxTimeoutMs must be >= spec.batching.defaultTimeoutMs")
        if any(b >= a for b, a in zip(self.buckets, self.buckets[1:], strict=False)):
            raise ValueError("spec.batching.buckets must be strictly increasing")
        if any(b > self.max_sequence_length for b in self.buckets):
            raise ValueError("every one of spec.batching.buckets must be <= spec.batching.maxSequenceLength")
        return self


class ParentRef(_Model):
    """A Gateway API parentRef (the Gateway the HTTPRoute attaches to)."""

    name: str = Field(min_length=1, max_length=253)
    namespace: str | None = Field(default=None, max_length=63)
    section_name: str | None = Field(default=None, max_length=253)
    port: int | None = Field(default=None, ge=1, le=65535)
    group: str = Field(default="gateway.networking.k8s.io", max_length=253)
    kind: str = Field(default="Gateway", max_length=63)


class HeaderMatch(_Model):
    """An HTTP request header (exact value), as in a Gateway API HTTPHeaderMatch."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    value: str = Field(min_length=1, max_length=4096)


class GatewayAPISpec(_Model):
    """Routing through a Gateway API HTTPRoute with weighted per-revision backends."""

    parent_refs: list[ParentRef] = Field(min_length=1, max_length=16)
    hostnames: list[Annotated[str, Field(max_length=253)]] = Field(default_factory=list, max_length=16)
    canary_header: HeaderMatch | None = Field(
        default=None,
        description="A request carrying this header (exact value), e.g. x-modeldeploy-canary: always, goes "
        "to the canary revision whatever the step's weight, during every step (not during the shadow "
        "stage, whose revision answers no client); removed at promotion or rollback.",
    )


class TrafficRoutingSpec(_Model):
    """How traffic is split between revisions."""

    mode: Literal["replicas", "gatewayAPI"] = Field(
        default="replicas",
        description="replicas: the model Service spreads over in-traffic pods (works anywhere); "
        "gatewayAPI: exact weights through an HTTPRoute.",
    )
    gateway_api: GatewayAPISpec | None = Field(default=None, alias="gatewayAPI")

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
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


class MetricCheck(_Model):
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
        json_schema_extra=_validations(
            _cel("has(self.max) != has(self.min)", "exactly one of max or min must be set")
        )
    )

    @model_validator(mode="after")
    def _rules(self) -> MetricCheck:
        if (self.max is None) == (self.min is None):
            raise ValueError("exactly one of max or min must be set")
        return self


class AnalysisSpec(_Model):
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
    max_p99_latency_ms: int = Field(default=1000, ge=1, le=600_000, description="Maximum p99 latency.")
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


class CompareSpec(_Model):
    """How a shadow's output and the stable's are said to agree (per request; every output must agree)."""

    method: Literal["auto", "cosine", "argmax", "allclose", "exact"] = Field(
        default="auto",
        description="auto: integer/bool/bytes -> exact; a classification model's scores -> argmax; other "
        "float tensors of rank >= 2 -> cosine per row, rank < 2 -> allclose. A custom handler's "
        "compare(a, b) wins over any method.",
    )
    min_cosine: float = Field(default=0.99, ge=-1, le=1, description="cosine: the lowest row's minimum.")
    rtol: float = Field(default=1.0e-3, ge=0, le=1, description="allclose: relative tolerance.")
    atol: float = Field(default=1.0e-5, ge=0, description="allclose: absolute tolerance.")


class ShadowSpec(_Model):
    """A shadow stage before the first canary step: the stable servers copy a sample of the requests they
    answer to the new revision (out of traffic), compare its outputs with theirs and count; the
    agreement, the shadow's error rate and its p99 latency are judged at the end of ``duration``."""

    duration: Duration = Field(
        description="How long the new revision shadows the stable one (the clock starts once every stable "
        "server reports that it is copying).",
        json_schema_extra=_validations(
            _cel("duration(self) >= duration('1s')", "spec.rollout.shadow.duration must be at least 1s")
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
    compare: CompareSpec = Field(default_factory=CompareSpec, json_schema_extra=_default_of(CompareSpec))
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


class KeepPreviousSpec(_Model):
    """Warm standby of the previous stable revision after a promotion."""

    replicas: int = Field(default=1, ge=0, le=100, description="Pods of the previous revision kept warm.")
    ttl: Duration = Field(default="30m", description="How long the previous revision is kept warm.")


class RolloutSpec(_Model):
    """Progressive delivery of a new revision."""

    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: [5, 25, 50, 100],
        min_length=1,
        max_length=20,
        description="Canary traffic percentages; strictly increasing, each 1..100, the last 100.",
        json_schema_extra={
            "default": [5, 25, 50, 100],
            "x-kubernetes-list-type": "set",
            **_validations(
                _cel("self.isSorted()", "spec.rollout.steps must be strictly increasing"),
                _cel("self[size(self) - 1] == 100", "the last of spec.rollout.steps must be 100"),
            ),
        },
    )
    interval: Duration = Field(
        default="1m",
        description="How long each step is held before it is judged.",
        json_schema_extra=_validations(
            _cel("duration(self) >= duration('1s')", "spec.rollout.interval must be at least 1s")
        ),
    )
    traffic_routing: TrafficRoutingSpec = Field(
        default_factory=TrafficRoutingSpec, json_schema_extra=_default_of(TrafficRoutingSpec)
    )
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec, json_schema_extra=_default_of(AnalysisSpec))
    bake_time: Duration = Field(default="5m", description="Analysis keeps running this long after promotion.")
    keep_previous: KeepPreviousSpec = Field(
        default_factory=KeepPreviousSpec, json_schema_extra=_default_of(KeepPreviousSpec)
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


class FallbackModelSpec(_Model):
    """A lighter model for the CPU fallback (unset fields: the serving revision's)."""

    version: str | None = Field(default=None, min_length=1, max_length=63, pattern=NAME_PATTERN)
    uri: str | None = Field(default=None, max_length=2048, pattern=URI_PATTERN)
    format: Literal["auto", "hf", "torchscript", "export", "custom", "noop"] | None = None
    task: Literal["auto", "embedding", "classification"] | None = None
    handler: str | None = Field(default=None, max_length=512)


class FallbackSpec(_Model):
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

    _q = field_validator("cpu", "memory")(_check_quantity)


class AutoscalingSpec(_Model):
    """Scale ``spec.replicas`` on a serving signal: the operator owns a KEDA ScaledObject (Prometheus
    trigger) whose HPA writes ``spec.replicas`` through the scale subresource; during a canary the operator
    splits those replicas between the revisions by the step's weight."""

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Never fewer serving pods.")
    max_replicas: int = Field(ge=1, le=1000, description="Never more serving pods.")
    metric: Literal["concurrency", "queueWaitP90", "queueDepth", "requestRate"] = Field(
        default="concurrency",
        description="concurrency: requests in the server (queued or running) per pod; queueWaitP90: the 90th "
        "percentile of the batching queue wait (seconds, all pods); queueDepth: items waiting per pod; "
        "requestRate: requests per second per pod.",
    )
    target: float = Field(
        gt=0, description="The value per pod (queueDepth, requestRate) or overall (queueWaitP90) to hold."
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
        description="Prometheus as KEDA reaches it (unset: spec.rollout.analysis.prometheusUrl, else the "
        "operator's).",
    )

    model_config = ConfigDict(
        json_schema_extra=_validations(
            _cel(
                "self.minReplicas <= self.maxReplicas",
                "spec.autoscaling.minReplicas must not exceed maxReplicas",
                ".minReplicas",
            )
        )
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("spec.autoscaling.minReplicas must not exceed maxReplicas")
        return self

    @field_validator("polling_interval", "window")
    @classmethod
    def _at_least_1s(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("must be at least 1s")
        return value


class ModelDeploymentSpec(_Model):
    """Desired state of a ModelDeployment."""

    model: ModelSpec
    image: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        pattern=r"^[^\s]+$",
        description="The serving image (runs `python -m modelserver`); unset: the operator's default "
        f"(env MODELDEPLOY_DEFAULT_IMAGE, else {DEFAULT_IMAGE}).",
    )
    replicas: int = Field(default=1, ge=0, le=1000, description="Serving pods of the stable revision.")
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, json_schema_extra=_default_of(ResourcesSpec)
    )
    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32, description="Node labels the serving pods must match."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    batching: BatchingSpec = Field(default_factory=BatchingSpec, json_schema_extra=_default_of(BatchingSpec))
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra=_default_of(RolloutSpec))
    fallback: FallbackSpec | None = Field(
        default=None, description="A CPU fallback for when the GPU pods cannot serve (unset: none)."
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale spec.replicas on a serving signal through KEDA (unset: spec.replicas rules, or "
        "your own HPA on the scale subresource).",
    )


# ---------------------------------------------------------------------------------------------- status


class _StatusModel(_Model):
    """A part of status: read leniently. Fields it does not know (written by a newer operator, or by
    hand) are ignored at any depth rather than refused: status holds the rollout state, and an operator
    that refused it would act as if there were none. The spec stays strict (``extra="forbid"``)."""

    model_config = ConfigDict(extra="ignore")


ConditionStatus = Literal["True", "False", "Unknown"]
Phase = Literal["Pending", "Progressing", "Shadowing", "Paused", "Healthy", "Degraded", "Failed"]
Role = Literal["stable", "canary", "shadow", "previous", "old", "fallback"]


class Condition(_StatusModel):
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


class RevisionStatus(_StatusModel):
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


class Measurement(_StatusModel):
    """One analysis measurement: the query, what it returned, the threshold and the verdict."""

    metric: str = Field(max_length=63)
    query: str = Field(max_length=8192)
    value: float | None = None
    threshold: float | None = None
    verdict: Literal["Pass", "Fail", "NoData", "Error"]
    revision: str | None = Field(default=None, max_length=63)
    time: datetime
    error: str | None = Field(
        default=None, max_length=512, description="Why the query failed (verdict Error): kind and message."
    )


class ShadowStatus(_StatusModel):
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


class FallbackStatus(_StatusModel):
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


class AnalysisStatus(_StatusModel):
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
    no_data_since: datetime | None = None
    last_run: datetime | None = None
    measurements: list[Measurement] = Field(default_factory=list, max_length=32)


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


class HistoryEntry(_StatusModel):
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


class ModelDeploymentStatus(_StatusModel):
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
    fallback: FallbackStatus | None = None
    analysis: AnalysisStatus | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT)


class ModelDeployment(BaseModel):
    """A ModelDeployment as the operator reads it (metadata kept as a plain dict)."""

    model_config = ConfigDict(extra="ignore")

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: dict[str, Any]
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus = Field(default_factory=ModelDeploymentStatus)

    @property
    def name(self) -> str:
        return str(self.metadata["name"])

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", "default"))

    @property
    def generation(self) -> int:
        return int(self.metadata.get("generation", 0))

    @property
    def uid(self) -> str:
        return str(self.metadata.get("uid", ""))

    @classmethod
    def from_api(cls, obj: dict[str, Any]) -> ModelDeployment:
        """Parse a live object; an unset ``spec.image`` becomes the operator's default image, so the
        image is part of the revision like everything else that shapes the pods."""
        md = cls.model_validate(
            {**obj, "status": obj.get("status") or {}},
        )
        _check_query_scope(md)
        if md.spec.image is None:
            md.spec = md.spec.model_copy(update={"image": default_image()})
        return md


def _check_query_scope(md: ModelDeployment) -> None:
    """Every custom analysis query reads the ModelDeployment's own namespace only (modeldeploy.promql_scope);
    a ValidationError naming the field otherwise, as for any invalid spec."""
    errors: list[InitErrorDetails] = []
    for i, m in enumerate(md.spec.rollout.analysis.metrics):
        rendered = render(m.query, namespace=md.namespace, name=md.name, revision="0" * 10, interval="1m")
        try:
            scoped(rendered, md.namespace)
        except ScopeError as e:
            errors.append(
                InitErrorDetails(
                    type=PydanticCustomError("query_scope", "{why}", {"why": str(e)}),
                    loc=("spec", "rollout", "analysis", "metrics", i, "query"),
                    input=m.query,
                )
            )
    if errors:
        raise ValidationError.from_exception_data(KIND, errors)
