"""``spec.autoscaling`` as a KEDA ScaledObject (pure).

KEDA turns the ScaledObject into an HPA that targets the ModelDeployment's ``scale`` subresource: the HPA
writes ``spec.replicas``, the operator splits those replicas between revisions by the canary step's
weight (:func:`modeldeploy.traffic_split.replica_split`), so the autoscaler and a rollout never fight over a
Deployment's replicas -- the operator owns every Deployment, the HPA owns one number.

The serving signals come from the server's metrics contract, summed over every pod of the
ModelDeployment (warm pods wait for nothing, so they do not dilute the signal):

* ``concurrency`` (the default, as Knative's and KServe's): requests in the servers (queued or running), per
  pod -- an ``AverageValue`` target (``ceil(total / target)`` pods). Proportional to the load (Little's
  law), so it neither oscillates nor needs a queue to form before it scales;
* ``queueWaitP90``: the 90th percentile of the batching queue wait over ``window`` -- a ``Value`` target
  (the HPA scales by ``current x p90 / target``);
* ``queueDepth``: items waiting, per pod -- an ``AverageValue`` target (``ceil(total / target)`` pods);
* ``requestRate``: requests per second over ``window``, per pod -- an ``AverageValue`` target.

A generation server (``task: generation``) has no batching queue; its signals are the engine's
(modelserver.gen_metrics, vLLM's ``num_requests_running``/``_waiting`` and ``kv_cache_usage_perc``):

* ``concurrency``: sequences running or waiting, per pod -- requests in the server, as for encoders;
* ``waitingSequences``: sequences admitted and not started (the engine is full), per pod --
  ``AverageValue``;
* ``kvCacheUsage``: the mean share of the KV cache in use over the pods -- a ``Value`` target (the HPA
  scales by ``current x usage / target``, as for a utilisation).
"""

from __future__ import annotations

import math
from typing import Any

from . import builders
from .api import AutoscalingSpec, ModelDeployment, parse_duration

API_VERSION = "keda.sh/v1alpha1"
KIND = "ScaledObject"


def _selector(md: ModelDeployment) -> str:
    return f'namespace="{md.namespace}",modeldeploy_io_name="{md.name}"'


def query(md: ModelDeployment, spec: AutoscalingSpec) -> tuple[str, str]:
    """(PromQL, KEDA metricType) of the signal."""
    sel, win = _selector(md), spec.window
    if spec.metric == "queueWaitP90":
        rate = f"rate(modelserver_queue_wait_seconds_bucket{{{sel}}}[{win}])"
        q = f"histogram_quantile(0.9, sum by (le) ({rate}))"
        # no traffic: NaN; KEDA treats a NaN as an error -- the empty queue waits 0 s
        return f"({q}) or vector(0)", "Value"
    generation = md.spec.model.task == "generation"
    if spec.metric == "concurrency" and generation:
        running, waiting = (
            "modelserver_generation_requests_running",
            "modelserver_generation_requests_waiting",
        )
        return f"(sum({running}{{{sel}}}) + sum({waiting}{{{sel}}})) or vector(0)", "AverageValue"
    if spec.metric == "concurrency":
        return f"sum(modelserver_inflight_requests{{{sel}}}) or vector(0)", "AverageValue"
    if spec.metric == "waitingSequences":
        return f"sum(modelserver_generation_requests_waiting{{{sel}}}) or vector(0)", "AverageValue"
    if spec.metric == "kvCacheUsage":
        return f"avg(modelserver_generation_kv_cache_usage_ratio{{{sel}}}) or vector(0)", "Value"
    if spec.metric == "queueDepth":
        return f"sum(modelserver_queue_depth{{{sel}}}) or vector(0)", "AverageValue"
    return f"sum(rate(modelserver_requests_total{{{sel}}}[{win}])) or vector(0)", "AverageValue"


def _threshold(value: float) -> str:
    # KEDA parses the threshold as a resource quantity-like float string
    return f"{value:g}"


def build_scaled_object(md: ModelDeployment, spec: AutoscalingSpec, prometheus_url: str) -> dict[str, Any]:
    promql, metric_type = query(md, spec)
    labels = {**builders.common_labels(md), builders.LABEL_COMPONENT: "autoscaler"}
    return builders.stamp(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": md.name,
                "namespace": md.namespace,
                "labels": labels,
                "ownerReferences": [builders.owner_reference(md)],
            },
            "spec": {
                "scaleTargetRef": {"apiVersion": md.api_version, "kind": md.kind, "name": md.name},
                "minReplicaCount": spec.min_replicas,
                "maxReplicaCount": spec.max_replicas,
                "pollingInterval": max(1, math.ceil(parse_duration(spec.polling_interval))),
                "advanced": {
                    "horizontalPodAutoscalerConfig": {
                        "name": md.name,
                        "behavior": {
                            "scaleDown": {
                                "stabilizationWindowSeconds": math.ceil(
                                    parse_duration(spec.scale_down_stabilization)
                                )
                            },
                        },
                    }
                },
                "triggers": [
                    {
                        "type": "prometheus",
                        "name": spec.metric,
                        "metricType": metric_type,
                        "metadata": {
                            "serverAddress": prometheus_url,
                            "query": promql,
                            "threshold": _threshold(spec.target),
                        },
                    }
                ],
            },
        }
    )
