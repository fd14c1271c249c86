"""The CPU fallback end to end on the local cluster: a "GPU" ModelDeployment (the noop model requesting
nvidia.com/gpu on the GPU node) under load loses its GPUs -- the node's nvidia.com/gpu set to 0 and its
pods deleted, so the ReplicaSet's new pods are Unschedulable -- and the CPU fallback answers; then the
GPUs come back and traffic returns to them. The failed requests of the gap are counted and reported
(never asserted as times: the machine is shared); what is asserted: the fallback answers, and nothing is
lost at the switch back."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from localcluster.testing import Kube, wait_for

from .canary_support import LoadGenerator, events, md_status, noop_md

NAME = "echo"
NODE = "gpu-node-0"
REPORT: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    yield REPORT
    text = json.dumps(REPORT, indent=2, sort_keys=True, default=str)
    sys.stderr.write(f"\n--- fallback e2e figures ---\n{text}\n")
    if os.environ.get("FALLBACK_E2E_REPORT"):
        Path(os.environ["FALLBACK_E2E_REPORT"]).write_text(text)


def gpu_md() -> dict[str, Any]:
    md = noop_md(NAME, "1", "noop://?delay_ms=2", replicas=1)
    md["spec"]["resources"] = {"gpu": 1, "cpu": "100m", "memory": "256Mi"}
    md["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    md["spec"]["fallback"] = {
        "after": "5s",
        "returnAfter": "5s",
        "replicas": 1,
        "cpu": "100m",
        "memory": "256Mi",
    }
    return md


def set_gpus(kube: Kube, count: str) -> None:
    body = {"status": {"capacity": {"nvidia.com/gpu": count}, "allocatable": {"nvidia.com/gpu": count}}}
    kube.api.request(
        "PATCH",
        f"/api/v1/nodes/{NODE}/status",
        body=body,
        content_type="application/merge-patch+json",
    )


def gpus(kube: Kube) -> str | None:
    node = kube.get(f"/api/v1/nodes/{NODE}") or {}
    return (node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu")


@pytest.fixture
def gpu_node(kube: Kube) -> Any:
    before = gpus(kube)
    assert before not in (None, "0")
    yield before
    set_gpus(kube, before)  # whatever happened, the GPUs come back for the next test


def test_gpus_gone_the_cpu_fallback_answers_and_traffic_returns(
    kube: Kube, operator: Any, namespace: str, gpu_node: str
) -> None:
    ns = namespace
    kube.apply(gpu_md(), ns)

    def stable() -> str | None:
        st = md_status(kube, ns, NAME)
        return st.get("stableRevision") if st.get("phase") == "Healthy" else None

    gpu_rev = wait_for(stable, timeout=90, interval=0.2, what="the GPU revision healthy")
    with LoadGenerator(kube, ns, NAME, workers=3, pause=0.02, max_seconds=180).wait_serving() as load:
        time.sleep(2)
        gone = time.monotonic()
        set_gpus(kube, "0")
        wait_for(lambda: gpus(kube) == "0", timeout=10, what="the node's GPUs at 0")
        for pod in kube.pods(ns, f"modeldeploy.io/name={NAME}"):
            kube.api.delete(f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")

        def fallback_active() -> dict[str, Any] | None:
            st = md_status(kube, ns, NAME)
            return st if (st.get("fallback") or {}).get("state") == "Active" else None

        st = wait_for(fallback_active, timeout=60, interval=0.2, what="the fallback active")
        fb_rev = st["fallback"]["revision"]

        def fallback_answers() -> float | None:
            recs = [r for r in load.snapshot(gone) if r.revision == fb_rev and r.kind == "ok"]
            return recs[0].t if recs else None

        first_fb = wait_for(fallback_answers, timeout=60, interval=0.1, what="an answer from the fallback")
        time.sleep(3)
        steady = time.monotonic()
        time.sleep(3)
        during = load.snapshot(steady)

        back = time.monotonic()
        set_gpus(kube, gpu_node)

        def returned() -> dict[str, Any] | None:
            st = md_status(kube, ns, NAME)
            return (
                st
                if (st.get("fallback") or {}).get("state") == "Idle" and st.get("phase") == "Healthy"
                else None
            )

        st = wait_for(returned, timeout=120, interval=0.2, what="traffic back on the GPU revision")
        returned_at = time.monotonic()
        time.sleep(4)
    recs = load.snapshot()
    gap = [r for r in recs if gone <= r.t < first_fb]
    after_back = load.snapshot(back)
    cond = next(c for c in st["conditions"] if c["type"] == "FallbackActive")
    REPORT["fallback"] = {
        "first_fallback_answer_after_gpus_gone_s": round(first_fb - gone, 2),
        "failed_requests_in_gap": sum(1 for r in gap if r.kind != "ok"),
        "requests_in_gap": len(gap),
        "gap_by_kind": {k: sum(1 for r in gap if r.kind == k) for k in sorted({r.kind for r in gap})},
        "traffic_back_after_gpus_back_s": round(returned_at - back, 2),
        "requests_after_gpus_back": len(after_back),
        "by_revision": {str(k): v for k, v in load.by_revision().items()},
    }
    print(REPORT["fallback"])
    # while the fallback serves, every request is answered, by it
    assert during and all(r.kind == "ok" and r.revision == fb_rev for r in during), during[:5]
    # the switch back loses nothing: every request after the GPUs came back is answered 200
    assert after_back and all(r.kind == "ok" for r in after_back), [r for r in after_back if r.kind != "ok"][
        :5
    ]
    assert {r.revision for r in load.snapshot(returned_at + 2)} == {gpu_rev}
    reasons = [e["reason"] for e in events(kube, ns, NAME) for _ in range(e.get("count") or 1)]  # repeats too
    assert reasons.count("FallbackActivated") == 1 and reasons.count("FallbackDeactivated") == 1
    assert cond["status"] == "False"
    assert not kube.pods(ns, f"modeldeploy.io/revision={fb_rev}") or all(
        p["metadata"].get("deletionTimestamp") for p in kube.pods(ns, f"modeldeploy.io/revision={fb_rev}")
    )
