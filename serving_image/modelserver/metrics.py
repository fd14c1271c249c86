"""Prometheus metrics of the inference server, labelled ``model`` and ``version``.

The contract is in docs/server.md (Operations, Metrics; ``tests/unit/server/test_app.py`` checks it):
requests by code, request latency, queue wait per item, batch size, inference time and padding ratio per
batch, queue depth, rejections by reason; plus the process, platform and GC collectors. ``Metrics`` is
the batching queue's observer (``on_reject``, ``on_depth``); ``ModelService.on_batch`` observes the
per-batch figures and the queue waits.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client import (
    gc_collector as _gc,
)
from prometheus_client import (
    platform_collector as _platform,
)
from prometheus_client import (
    process_collector as _process,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
PADDING_BUCKETS = (1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)

REJECT_REASONS = (
    "queue_full",
    "deadline",
    "timeout",
    "too_long",
    "too_many_items",
    "overloaded",
    "draining",
    "not_ready",
)
SHADOW_RESULTS = ("agree", "disagree", "error", "timeout", "dropped")
SIMILARITY_BUCKETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)


class Metrics:
    def __init__(self, model: str, version: str, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()
        self.registry = registry or CollectorRegistry(auto_describe=True)
        r = self.registry
        _process.ProcessCollector(registry=r)
        _platform.PlatformCollector(registry=r)
        _gc.GCCollector(registry=r)
        labels = ("model", "version")
        lv = (model, version)
        self._lv = lv
        self.requests = Counter(
            "modelserver_requests", "Inference requests by HTTP status code", [*labels, "code"], registry=r
        )
        self.request_duration = Histogram(
            "modelserver_request_duration_seconds",
            "Inference request latency, from receipt to response",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.queue_wait = Histogram(
            "modelserver_queue_wait_seconds",
            "Time an item waited in the batching queue",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.batch_size = Histogram(
            "modelserver_batch_size", "Items per executed batch", labels, buckets=BATCH_BUCKETS, registry=r
        ).labels(*lv)
        self.inference_duration = Histogram(
            "modelserver_inference_duration_seconds",
            "Model execution time per batch",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        ).labels(*lv)
        self.inflight = Gauge(
            "modelserver_inflight_requests",
            "Inference requests received and not yet answered (queued or running)",
            labels,
            registry=r,
        ).labels(*lv)
        self.queue_depth = Gauge(
            "modelserver_queue_depth", "Items waiting in the batching queue", labels, registry=r
        ).labels(*lv)
        self.cpu_seconds = Counter(
            "modelserver_cpu_seconds",
            "Thread CPU seconds by part: tokenize (preprocess) and inference (the batch forward); the "
            "process CPU minus these is the HTTP layer and the batching around them",
            [*labels, "part"],
            registry=r,
        )
        self.rejected = Counter(
            "modelserver_rejected", "Requests rejected or expired, by reason", [*labels, "reason"], registry=r
        )
        self.padding_ratio = Histogram(
            "modelserver_padding_ratio",
            "Positions run / real tokens per batch (padded: size x longest; packed: rows x fullest row)",
            labels,
            buckets=PADDING_BUCKETS,
            registry=r,
        ).labels(*lv)
        self._shadow_metrics(r, (*labels, "shadow_revision"))
        self._codes: dict[int, Counter] = {}
        self._reasons: dict[str, Counter] = {}
        for reason in REJECT_REASONS:
            self.reject_child(reason)

    def _shadow_metrics(self, r: CollectorRegistry, shadow: tuple[str, ...]) -> None:
        """The shadow mirror's series, labelled by the shadow revision (modelserver.shadow)."""
        self.shadow_requests = Counter(
            "modelserver_shadow_requests",
            "Requests copied to a shadow revision, by result (agree, disagree, error, timeout, dropped)",
            [*shadow, "result"],
            registry=r,
        )
        self.shadow_similarity = Histogram(
            "modelserver_shadow_similarity",
            "Similarity of the shadow's outputs to this server's (cosine, or 1/0), per compared request",
            shadow,
            buckets=SIMILARITY_BUCKETS,
            registry=r,
        )
        self.shadow_duration = Histogram(
            "modelserver_shadow_duration_seconds",
            "Round trip of a copied request to the shadow revision",
            shadow,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.shadow_active = Gauge(
            "modelserver_shadow_active",
            "1 while this server copies a sample of its requests to the labelled shadow revision",
            [*shadow, "sample_rate"],
            registry=r,
        )
        self.shadow_refused = Counter(
            "modelserver_shadow_refused",
            "Shadow files refused (nothing copied), by reason: invalid, revision (not a DNS label), url (not"
            " the URL this server builds), no_service (no MODELSERVER_SHADOW_SERVICE)",
            [*shadow[:-1], "reason"],
            registry=r,
        )

    def refuse_shadow(self, reason: str) -> None:
        self.shadow_refused.labels(*self._lv, reason).inc()

    def reject_child(self, reason: str) -> Counter:
        c = self._reasons.get(reason)
        if c is None:
            c = self._reasons[reason] = self.rejected.labels(*self._lv, reason)
        return c

    def observe_request(self, code: int, seconds: float) -> None:
        c = self._codes.get(code)
        if c is None:
            c = self._codes[code] = self.requests.labels(*self._lv, str(code))
        c.inc()
        self.request_duration.observe(seconds)

    # batching observer ----------------------------------------------------------------------------------
    def on_reject(self, reason: str) -> None:
        self.reject_child(reason).inc()

    def on_depth(self, depth: int) -> None:
        self.queue_depth.set(depth)

    def shadow_children(self, revision: str) -> tuple[dict[str, Counter], Histogram, Histogram]:
        """The shadow metrics of one shadow revision (every result pre-initialised to 0)."""
        lv = (*self._lv, revision)
        results = {res: self.shadow_requests.labels(*lv, res) for res in SHADOW_RESULTS}
        return results, self.shadow_similarity.labels(*lv), self.shadow_duration.labels(*lv)

    def set_shadow_active(self, revision: str | None, sample_rate: float = 0.0) -> None:
        """Only the current shadow target's series is 1; older ones are removed."""
        self.shadow_active.clear()
        if revision is not None:
            self.shadow_active.labels(*self._lv, revision, f"{sample_rate:g}").set(1)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
