"""Operator metrics (prefix ``modeldeploy_``), served on ``--metrics-port`` at /metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "modeldeploy_reconciles_total", "Reconciles of a ModelDeployment, by result.", ["result"]
)
RECONCILE_ERRORS = Counter(
    "modeldeploy_reconcile_errors_total", "Reconciles that failed, by error class.", ["error"]
)
RECONCILE_DURATION = Histogram(
    "modeldeploy_reconcile_duration_seconds",
    "Wall time of one reconcile (observe, plan, write).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WRITES = Counter(
    "modeldeploy_writes_total", "Write requests sent to the apiserver, by kind and verb.", ["kind", "verb"]
)
READS = Counter(
    "modeldeploy_reads_total",
    "Read requests sent to the apiserver, by kind and verb (children come from the watches: no LIST).",
    ["kind", "verb"],
)
for _kind in ("Deployment", "Service", "PodDisruptionBudget", "Pod"):
    READS.labels(kind=_kind, verb="list")  # present at 0: "none" is a measurement, not a missing series
EVENTS = Counter(
    "modeldeploy_events_total", "Kubernetes events posted, by type and reason.", ["type", "reason"]
)
EVENTS_DROPPED = Counter(
    "modeldeploy_events_dropped_total", "Kubernetes events dropped because the posting queue was full."
)
EVENTS_FAILED = Counter("modeldeploy_events_failed_total", "Kubernetes events the apiserver did not take.")
NOTIFICATIONS = Counter(
    "modeldeploy_notifications_total",
    "Rollout notifications by result: delivered, failed (every try), dropped (the queue was full), "
    "refused (a host not allowed).",
    ["result"],
)
NOTIFICATION_ATTEMPTS = Counter(
    "modeldeploy_notification_attempts_total",
    "Webhook tries of rollout notifications, by result.",
    ["result"],
)
for _result in ("delivered", "failed", "dropped", "refused"):
    NOTIFICATIONS.labels(result=_result)
QUEUE_DEPTH = Gauge("modeldeploy_queue_depth", "ModelDeployments waiting for a reconcile.")
MANAGED = Gauge("modeldeploy_managed_modeldeployments", "ModelDeployments seen by this operator.")
CANARY_WEIGHT = Gauge(
    "modeldeploy_canary_weight",
    "Canary traffic share in percent (achieved: pods in traffic, or the route weight); 0 at rest.",
    ["namespace", "name"],
)
ANALYSIS_VALUE = Gauge(
    "modeldeploy_analysis_value",
    "Last value measured by a canary analysis check.",
    ["namespace", "name", "metric"],
)
ANALYSIS_QUERIES = Counter(
    "modeldeploy_analysis_queries_total",
    "Analysis queries by result: ok, nodata, or the error kind (timeout, refused, http, unparseable, "
    "shape, too-large, tls).",
    ["result"],
)
ANALYSIS_MEASUREMENT_SECONDS = Histogram(
    "modeldeploy_analysis_measurement_seconds",
    "Time one measurement (all queries of a window, concurrently) took, off the reconcile path.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WORKER_BUSY_SECONDS = Gauge(
    "modeldeploy_worker_longest_reconcile_seconds",
    "How long the longest-running reconcile now in progress has been running (0 when idle).",
)
ROLLOUTS = Counter(
    "modeldeploy_rollouts_total",
    "Rollout decisions: deployed, promoted, rolled_back, failed_back, aborted, superseded.",
    ["result"],
)
# Known label values start at 0, so a dashboard (or a test) tells "none yet" from "no such series".
for _result in ("changed", "unchanged", "gone", "error", "invalid"):
    RECONCILES.labels(result=_result)
for _result in ("deployed", "promoted", "rolled_back", "failed_back", "aborted", "superseded"):
    ROLLOUTS.labels(result=_result)

FALLBACK_ACTIVE = Gauge(
    "modeldeploy_fallback_active",
    "1 while the CPU fallback revision is in traffic instead of the GPU revision.",
    ["namespace", "name"],
)
LEADER = Gauge("modeldeploy_peering_active", "1 when this replica is the active one (peering), else 0.")
RESYNCS = Counter(
    "modeldeploy_resyncs_total",
    "Periodic LISTs of a kind of child that check the watch-fed cache, by result (ok, error).",
    ["kind", "result"],
)
RESYNC_REPAIRED = Counter(
    "modeldeploy_resync_repaired_total",
    "ModelDeployments whose children a resync found the watches had missed (deleted or created unseen).",
    ["kind"],
)


#: the series labelled with one ModelDeployment (namespace, name)
PER_MODELDEPLOYMENT = (CANARY_WEIGHT, ANALYSIS_VALUE, FALLBACK_ACTIVE)


def forget(namespace: str, name: str) -> None:
    """Remove a deleted ModelDeployment's series: a cluster where many teams come and go does not keep
    a series for every ModelDeployment that ever was."""
    for gauge in PER_MODELDEPLOYMENT:
        gauge.remove_by_labels({"namespace": namespace, "name": name})


def serve(port: int, addr: str) -> None:
    """Serve /metrics in a background thread (port 0 disables it)."""
    if port:
        start_http_server(port, addr=addr)
