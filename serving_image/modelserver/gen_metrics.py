"""Prometheus series of text generation, next to the server's own (:class:`modelserver.metrics.Metrics`,
whose ``modelserver_requests_total{code}`` and request latency the operator's analysis reads for every
task). Names follow vLLM's meanings, which users' dashboards know (docs/server.md maps them):

==============================================================  =========================================
``modelserver_generation_time_to_first_token_seconds``          ``vllm:time_to_first_token_seconds``
``modelserver_generation_time_per_output_token_seconds``        ``vllm:time_per_output_token_seconds``
``modelserver_generation_e2e_request_latency_seconds``          ``vllm:e2e_request_latency_seconds``
``modelserver_generation_prompt_tokens_total``                  ``vllm:prompt_tokens_total``
``modelserver_generation_tokens_total``                         ``vllm:generation_tokens_total``
``modelserver_generation_requests_running``                     ``vllm:num_requests_running``
``modelserver_generation_requests_waiting``                     ``vllm:num_requests_waiting``
``modelserver_generation_kv_cache_usage_ratio``                 ``vllm:kv_cache_usage_perc`` (0..1)
``modelserver_generation_finished_total{finish_reason}``        ``vllm:request_success_total``
==============================================================  =========================================
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter, Gauge, Histogram

from .metrics import Metrics

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
FINISH_REASONS = ("stop", "length", "abort")


class GenerationMetrics:
    def __init__(
        self,
        base: Metrics,
        waiting: Callable[[], float],
        running: Callable[[], float],
        kv_usage: Callable[[], float | None],
    ) -> None:
        r, labels, lv = base.registry, ("model", "version"), base._lv
        self.ttft = Histogram(
            "modelserver_generation_time_to_first_token_seconds",
            "Time from receipt to the first generated token",
            labels, buckets=TTFT_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.tpot = Histogram(
            "modelserver_generation_time_per_output_token_seconds",
            "Time between two generated tokens of one sequence (inter-token latency)",
            labels, buckets=TPOT_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.e2e = Histogram(
            "modelserver_generation_e2e_request_latency_seconds",
            "Time from receipt to the last generated token",
            labels, buckets=E2E_BUCKETS, registry=r,
        ).labels(*lv)  # fmt: skip
        self.prompt_tokens = Counter(
            "modelserver_generation_prompt_tokens", "Prompt tokens of admitted requests", labels, registry=r
        ).labels(*lv)
        self.generation_tokens = Counter(
            "modelserver_generation_tokens", "Generated tokens", labels, registry=r
        ).labels(*lv)
        finished = Counter(
            "modelserver_generation_finished",
            "Sequences finished, by reason (stop: EOS or a stop string, length: max_tokens, abort: cut)",
            [*labels, "finish_reason"], registry=r,
        )  # fmt: skip
        self.finished = {reason: finished.labels(*lv, reason) for reason in FINISH_REASONS}
        Gauge("modelserver_generation_requests_running", "Sequences generating", labels, registry=r).labels(
            *lv
        ).set_function(running)
        Gauge(
            "modelserver_generation_requests_waiting", "Sequences admitted, no token yet", labels, registry=r
        ).labels(*lv).set_function(waiting)
        self.preemptions = Counter(
            "modelserver_generation_preemptions",
            "Sequences that yielded their place to a higher priority and were recomputed",
            labels,
            registry=r,
        ).labels(*lv)
        Gauge(
            "modelserver_generation_kv_cache_usage_ratio",
            "Share of the KV cache in use (0..1)",
            labels,
            registry=r,
        ).labels(*lv).set_function(lambda: kv_usage() or 0.0)
