"""The object store down while the autoscaler adds a pod (issue 23, section 3): a ModelDeployment whose
model lives in the cluster's S3 (versitygw, no node cache: every pod fetches), autoscaled by KEDA, serves
one pod under load through kube-proxy; versitygw is frozen (SIGSTOP: connections hang, as with a store
that is down behind a load balancer), and the autoscaler's floor is raised so that KEDA's HPA adds a pod.

Promises (docs/reliability.md): the clients see no failed request -- the new pod, whose fetch cannot
finish, never takes traffic; the failure is visible (``Ready`` False, ``ReplicasNotReady``, and the
fetch container's failed attempts in the pod's status); once the store is back the new pod fetches and
takes traffic without anyone's help. Times are printed and written to $CHAOS_REPORT when set (make
bench-chaos), never asserted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.canary_support import LoadGenerator, md_status, noop_md
from localcluster import faults
from localcluster.objectstore import ObjectStore
from localcluster.testing import Kube, wait_for

NAME = "stored"
#: the fetch's own deadline (spec.model.storage.timeout): a hanging store fails the fetch after this long
FETCH_TIMEOUT = "10s"


@pytest.fixture
def stored_model(kube: Kube, s3: ObjectStore, s3_bucket: str, namespace: str) -> Iterator[str]:
    """A noop model in a fresh bucket, and the store's credentials as a Secret in ``namespace``."""
    s3.put(s3_bucket, "noop/v1/model.txt", b"noop model v1\n" * 1000)
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s3-credentials"},
            "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
        },
        namespace,
    )
    yield f"s3://{s3_bucket}/noop/v1/"


def elastic_md(kube: Kube, s3: ObjectStore, uri: str, min_replicas: int) -> dict[str, Any]:
    body = noop_md(NAME, "1", uri)
    body["spec"]["model"]["storage"] = {
        "endpoint": s3.url,
        "region": s3.region,
        "addressingStyle": "path",
        "secretRef": {"name": "s3-credentials"},
        "timeout": FETCH_TIMEOUT,
    }
    body["spec"]["autoscaling"] = {
        "minReplicas": min_replicas,
        "maxReplicas": 3,
        "metric": "concurrency",
        "target": 1000,  # the load never asks for more: only the floor moves
        "pollingInterval": "5s",
        # KEDA runs in the pod network: Prometheus as pods reach it
        "prometheusURL": kube.cluster.prometheus_url_pods or kube.cluster.prometheus_url,
    }
    del body["spec"]["replicas"]  # the HPA owns it
    return body


def condition(kube: Kube, ns: str, type_: str) -> dict[str, Any]:
    return next((c for c in md_status(kube, ns, NAME).get("conditions", []) if c["type"] == type_), {})


def failed_fetches(kube: Kube, ns: str) -> int:
    """How many fetch attempts of the ModelDeployment's pods ended in failure so far."""
    n = 0
    for p in kube.pods(ns, f"modeldeploy.io/name={NAME}"):
        for s in p["status"].get("initContainerStatuses") or []:
            n += s.get("restartCount", 0)
            n += int(((s.get("state") or {}).get("terminated") or {}).get("exitCode", 0) != 0)
    return n


def test_the_object_store_down_while_the_autoscaler_adds_a_pod(
    kube: Kube, operator: Any, namespace: str, s3: ObjectStore, stored_model: str, report: dict[str, Any]
) -> None:
    ns = namespace
    kube.apply(elastic_md(kube, s3, stored_model, min_replicas=1), ns)
    wait_for(lambda: md_status(kube, ns, NAME).get("readyReplicas") == 1, timeout=180, what="one pod ready")
    revision = md_status(kube, ns, NAME)["revision"]
    load = LoadGenerator(kube, ns, NAME, max_seconds=240).wait_serving().start()
    try:
        started = time.monotonic()
        faults.pause(kube.cluster, "versitygw")
        try:
            kube.apply(elastic_md(kube, s3, stored_model, min_replicas=2), ns)  # KEDA -> HPA: one pod more
            wait_for(
                lambda: len(kube.pods(ns, f"modeldeploy.io/name={NAME}")) == 2,
                timeout=90,
                what="a second pod",
            )
            added = time.monotonic()
            failures_while_down = wait_for(
                lambda: failed_fetches(kube, ns), timeout=90, interval=0.5, what="a failed fetch"
            )
            seen = condition(kube, ns, "Ready")
            down_for = time.monotonic() - started
        finally:
            faults.resume(kube.cluster, "versitygw")
        back = time.monotonic()
        wait_for(
            lambda: md_status(kube, ns, NAME).get("readyReplicas") == 2,
            timeout=240,
            interval=0.5,
            what="the added pod ready once the store is back",
        )
        in_traffic = time.monotonic()
        time.sleep(2)
    finally:
        load.stop()
    rollout = load.snapshot(started)
    failed = [r for r in rollout if r.kind != "ok"]
    out = {
        "store_down_s": round(down_for, 1),
        "pod_added_after_store_down_s": round(added - started, 1),
        "fetch_failures_while_down": failures_while_down,
        "ready_while_down": f"{seen.get('status')} {seen.get('reason')}: {seen.get('message')}",
        "added_pod_in_traffic_after_store_back_s": round(in_traffic - back, 1),
        "requests": len(rollout),
        "failed_by_kind": {k: v for k, v in load.by_kind(started).items() if k != "ok"},
        "outcome": "the added pod served after the store came back; no revision change",
    }
    report["object_store_down_during_scale_out"] = out
    print(f"object store down during scale-out: {out}")
    assert not failed, f"{len(failed)} failed requests, e.g. {failed[:3]}"
    assert seen.get("status") == "False" and seen.get("reason") == "ReplicasNotReady", seen
    assert md_status(kube, ns, NAME)["revision"] == revision  # the floor is not a new revision
    assert condition(kube, ns, "Ready").get("status") == "True"
