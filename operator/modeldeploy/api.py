"""The ModelDeployment API: pydantic v2 models of spec and status.

These models are the single source of truth of the API. ``modeldeploy.crdgen`` turns them into the
CRD's OpenAPI v3 structural schema (``crds/modeldeployment.yaml``); the operator parses live objects
with them. Every rule the apiserver enforces through a CEL ``x-kubernetes-validations`` rule is also
enforced here by a validator, so a spec that the apiserver accepts parses, and the unit tests can check
both sides against the same list of bad manifests.

Field names are camelCase on the wire (aliases) and snake_case in Python.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from .api_base import (
    API_VERSION,
    CATEGORIES,
    CONDITION_TYPE_PATTERN,
    DEFAULT_IMAGE,
    DURATION_PATTERN,
    GROUP,
    KIND,
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    MAX_NAME_LENGTH,
    NAME_PATTERN,
    PLURAL,
    PVC_URI_PATTERN,
    QUANTITY_PATTERN,
    S3_URI_PATTERN,
    SHORT_NAMES,
    SINGULAR,
    URI_PATTERN,
    VERSION,
    ApiModel,
    Duration,
    Quantity,
    cel_rule,
    cel_validations,
    check_quantity,
    default_image,
    default_of,
    parse_duration,
)
from .api_generation import GenerationSpec
from .api_rollout import (
    AnalysisSpec,
    AutoscalingSpec,
    CompareSpec,
    FallbackModelSpec,
    FallbackSpec,
    GateSpec,
    GatesSpec,
    GatewayAPISpec,
    HeaderMatch,
    JudgeSpec,
    KeepPreviousSpec,
    MetricCheck,
    ParentRef,
    RolloutSpec,
    ShadowSpec,
    TrafficRoutingSpec,
    WebhookSpec,
)
from .api_status import (
    HISTORY_LIMIT,
    AnalysisStatus,
    Condition,
    ConditionStatus,
    FallbackStatus,
    GateName,
    GateStatus,
    HistoryEntry,
    HistoryKind,
    HistoryOutcome,
    JudgeMeasurement,
    Measurement,
    ModelDeploymentStatus,
    Phase,
    RevisionStatus,
    Role,
    ShadowStatus,
    StatusModel,
)
from .promql_scope import ScopeError, render, scoped

#: the API, whichever module defines each part (api_base, api_rollout, api_status re-exported here)
__all__ = [
    "API_VERSION",
    "CATEGORIES",
    "CONDITION_TYPE_PATTERN",
    "DEFAULT_BUCKETS",
    "DEFAULT_IMAGE",
    "DURATION_PATTERN",
    "GROUP",
    "HISTORY_LIMIT",
    "KIND",
    "LABEL_KEY_PATTERN",
    "LABEL_VALUE_PATTERN",
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "PLURAL",
    "PVC_URI_PATTERN",
    "QUANTITY_PATTERN",
    "S3_URI_PATTERN",
    "SHORT_NAMES",
    "SINGULAR",
    "URI_PATTERN",
    "VERSION",
    "AnalysisSpec",
    "AnalysisStatus",
    "ApiModel",
    "AutoscalingSpec",
    "BatchingSpec",
    "CABundleSpec",
    "CompareSpec",
    "Condition",
    "ConditionStatus",
    "Duration",
    "FallbackModelSpec",
    "FallbackSpec",
    "FallbackStatus",
    "GateName",
    "GateSpec",
    "GateStatus",
    "GatesSpec",
    "GatewayAPISpec",
    "HeaderMatch",
    "HistoryEntry",
    "HistoryKind",
    "HistoryOutcome",
    "JudgeMeasurement",
    "JudgeSpec",
    "KeepPreviousSpec",
    "LocalObjectReference",
    "Measurement",
    "MetricCheck",
    "ModelDeployment",
    "ModelDeploymentSpec",
    "ModelDeploymentStatus",
    "ModelSpec",
    "NodeCacheSpec",
    "ParentRef",
    "Phase",
    "Quantity",
    "ResourcesSpec",
    "RevisionStatus",
    "Role",
    "RolloutSpec",
    "ShadowSpec",
    "ShadowStatus",
    "StatusModel",
    "StorageSpec",
    "Toleration",
    "TrafficRoutingSpec",
    "WebhookSpec",
    "cel_rule",
    "cel_validations",
    "check_quantity",
    "default_image",
    "default_of",
    "parse_duration",
]


# ---------------------------------------------------------------------------------------------- spec


class LocalObjectReference(ApiModel):
    """A reference to an object in the ModelDeployment's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class CABundleSpec(ApiModel):
    """A CA bundle (PEM) from a ConfigMap key, for an object store with a private CA."""

    config_map_ref: LocalObjectReference = Field(description="The ConfigMap holding the bundle.")
    key: str = Field(default="ca.crt", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class NodeCacheSpec(ApiModel):
    """A node-local cache of fetched models: one hostPath directory per namespace on each node, written
    only by the operator's fetch image, every hit verified against its files."""

    enabled: bool = Field(default=True, description="Fetch through the node's cache.")
    max_size: Quantity = Field(
        default="100Gi",
        description="Size cap of this namespace's part of the node's cache (least recently used models go "
        "first); the operator's per-namespace cap applies when it is smaller. Never evicts another "
        "namespace's models.",
    )

    _q = field_validator("max_size")(check_quantity)


class StorageSpec(ApiModel):
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

    _q = field_validator("max_size")(check_quantity)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: str) -> str:
        if parse_duration(value) < 1:
            raise ValueError("spec.model.storage.timeout must be at least 1s")
        return value


class ModelSpec(ApiModel):
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
    task: Literal["auto", "embedding", "classification", "generation"] = Field(
        default="auto",
        description="Task of a Hugging Face model (generation: a causal LM served through the OpenAI-"
        "compatible /v1/completions and /v1/chat/completions; auto picks it for a *ForCausalLM config).",
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
        json_schema_extra=cel_validations(
            cel_rule(
                "self.format != 'custom' || has(self.handler)",
                "spec.model.handler is required when spec.model.format is custom",
                ".handler",
                "FieldValueRequired",
            ),
            cel_rule(
                f"!self.uri.startsWith('s3://') || self.uri.matches('{S3_URI_PATTERN}')",
                "spec.model.uri: an s3 uri is s3://<bucket>[/<prefix or key>] with a valid bucket name",
                ".uri",
            ),
            cel_rule(
                f"!self.uri.startsWith('pvc://') || self.uri.matches('{PVC_URI_PATTERN}')",
                "spec.model.uri: a pvc uri is pvc://<claim name>[/<path in the volume>]",
                ".uri",
            ),
            cel_rule(
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


class ResourcesSpec(ApiModel):
    """Compute resources of each serving pod."""

    gpu: int = Field(
        default=0, ge=0, le=16, strict=True, description="nvidia.com/gpu per pod (an integer; 0 = CPU only)."
    )
    cpu: Quantity = Field(default="1", description="CPU request per pod (e.g. 500m, 2).")
    memory: Quantity = Field(default="2Gi", description="Memory request and limit per pod (e.g. 2Gi).")

    _q = field_validator("cpu", "memory")(check_quantity)


class Toleration(ApiModel):
    """A pod toleration (core/v1 Toleration)."""

    key: str | None = Field(default=None, max_length=317, pattern=LABEL_KEY_PATTERN)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_PATTERN)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = Field(default=None, ge=0)

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule(
                "self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "a toleration with operator Exists must not have a value",
                ".value",
            ),
            cel_rule(
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


class BatchingSpec(ApiModel):
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
            **cel_validations(
                cel_rule("self.isSorted()", "spec.batching.buckets must be strictly increasing")
            ),
        },
    )
    default_timeout_ms: int = Field(
        default=10_000, ge=1, le=600_000, description="Per-request deadline when the caller sets none."
    )
    max_timeout_ms: int = Field(
        default=60_000, ge=1, le=600_000, description="Cap for a caller-supplied timeout."
    )

    model_config = ConfigDict(
        json_schema_extra=cel_validations(
            cel_rule(
                "self.maxTimeoutMs >= self.defaultTimeoutMs",
                "spec.batching.maxTimeoutMs must be >= spec.batching.defaultTimeoutMs",
                ".maxTimeoutMs",
            ),
            cel_rule(
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


#: how a generation server's shadow copies are compared (modelserver.gen_shadow)
GENERATION_COMPARE_METHODS = ("auto", "exact", "tokenAgreement")
GEN_COMPARE_HINT = "for task generation use exact or tokenAgreement (auto: tokenAgreement)"
#: autoscaling signals only one kind of server exports
ENCODER_AUTOSCALING_METRICS = ("queueWaitP90", "queueDepth")
GENERATION_AUTOSCALING_METRICS = ("waitingSequences", "kvCacheUsage")
GEN_METRICS_HINT = "for task generation use concurrency, requestRate, waitingSequences or kvCacheUsage"


class ModelDeploymentSpec(ApiModel):
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
        default_factory=ResourcesSpec, json_schema_extra=default_of(ResourcesSpec)
    )
    node_selector: dict[Annotated[str, Field(max_length=317)], Annotated[str, Field(max_length=63)]] = Field(
        default_factory=dict, max_length=32, description="Node labels the serving pods must match."
    )
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    batching: BatchingSpec = Field(default_factory=BatchingSpec, json_schema_extra=default_of(BatchingSpec))
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra=default_of(RolloutSpec))
    fallback: FallbackSpec | None = Field(
        default=None, description="A CPU fallback for when the GPU pods cannot serve (unset: none)."
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description="Scale spec.replicas on a serving signal through KEDA (unset: spec.replicas rules, or "
        "your own HPA on the scale subresource).",
    )
    generation: GenerationSpec | None = Field(
        default=None,
        description="Sizes of the text generation engine, for spec.model.task generation only (unset: the "
        "server's defaults).",
    )

    @model_validator(mode="after")
    def _shadow_compare_of_the_task(self) -> ModelDeploymentSpec:
        """The CRD's rules of the same meaning: a generation server compares answers by their text or
        tokens (modelserver.gen_shadow), an encoder compares tensors (modelserver.compare)."""
        shadow = self.rollout.shadow
        if shadow is None:
            return self
        method = shadow.compare.method
        if self.model.task == "generation" and method not in GENERATION_COMPARE_METHODS:
            raise ValueError(
                f"spec.rollout.shadow.compare.method: {method} compares tensors; {GEN_COMPARE_HINT}"
            )
        if self.model.task != "generation" and method == "tokenAgreement":
            raise ValueError(
                "spec.rollout.shadow.compare.method: tokenAgreement only for spec.model.task generation"
            )
        return self

    @model_validator(mode="after")
    def _autoscaling_metric_of_the_task(self) -> ModelDeploymentSpec:
        """The CRD's rules of the same meaning: each server exports its own signals (modelserver.metrics,
        modelserver.gen_metrics); a metric the pods do not export would read 0 and never scale out."""
        metric = self.autoscaling.metric if self.autoscaling else None
        generation = self.model.task == "generation"
        if generation and metric in ENCODER_AUTOSCALING_METRICS:
            raise ValueError(
                f"spec.autoscaling.metric: {metric} is an encoder's batching queue; {GEN_METRICS_HINT}"
            )
        if not generation and metric in GENERATION_AUTOSCALING_METRICS:
            raise ValueError(f"spec.autoscaling.metric: {metric} only for spec.model.task generation")
        return self

    @model_validator(mode="after")
    def _generation_sizes_only_for_generation(self) -> ModelDeploymentSpec:
        """The CRD's rule of the same meaning (an encoder has no generation engine to size)."""
        if self.generation is not None and self.model.task != "generation":
            raise ValueError("spec.generation: only for spec.model.task generation")
        return self


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


def deprecated_fields(spec: ModelDeploymentSpec) -> list[str]:
    """What ``spec`` says in a deprecated way, each as the warning a user reads (pure; docs/upgrade.md)."""
    out = []
    if spec.autoscaling is not None and spec.autoscaling.prometheus_url_deprecated is not None:
        out.append(
            "spec.autoscaling.prometheusUrl is deprecated: write spec.autoscaling.prometheusURL (spelled as "
            "spec.rollout.analysis.prometheusURL); the old spelling is still read"
        )
    return out
