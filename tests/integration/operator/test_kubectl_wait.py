"""`kubectl wait --for=condition=Ready md/NAME` with the real kubectl against the real apiserver and the
operator: it returns once the ModelDeployment serves, and it does not take the Ready of an older spec for
the new one -- with the operator stopped, a spec change leaves the condition's observedGeneration behind
and the wait runs out; restarted, the operator observes the new generation and the same wait returns.
(docs/install.md, "Argo CD, Flux and kubectl wait".)"""

from __future__ import annotations

import json
import time

from localcluster.testing import Kube, wait_for
from md_cluster import OperatorProcess, noop_md

MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"


def wait_ready(kube: Kube, ns: str, name: str, timeout: str) -> tuple[int, float, str]:
    """``kubectl wait --for=condition=Ready``: exit code, seconds it took, what it said."""
    start = time.monotonic()
    res = kube.kubectl(
        "wait", "-n", ns, "--for=condition=Ready", f"--timeout={timeout}", f"md/{name}", check=False
    )
    return res.returncode, time.monotonic() - start, res.stdout + res.stderr


def generations(kube: Kube, ns: str, name: str) -> tuple[int, int | None, int | None]:
    """metadata.generation, status.observedGeneration, and the Ready condition's observedGeneration."""
    obj = kube.get(MD_PATH.format(ns=ns, name=name)) or {}
    status = obj.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
    return obj["metadata"]["generation"], status.get("observedGeneration"), ready.get("observedGeneration")


def test_kubectl_wait_for_ready_waits_for_the_current_generation(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    kube.apply(noop_md("waited"), namespace=namespace)
    rc, _, said = wait_ready(kube, namespace, "waited", "180s")
    assert rc == 0, said
    assert "condition met" in said
    assert generations(kube, namespace, "waited") == (1, 1, 1)

    operator.stop()
    try:
        patch = {"spec": {"rollout": {"paused": True}}}  # applies in place: a new generation, no new pods
        kube.kubectl("patch", "-n", namespace, "md/waited", "--type=merge", "-p", json.dumps(patch))
        assert generations(kube, namespace, "waited") == (2, 1, 1)  # Ready=True, of generation 1
        rc, took, said = wait_ready(kube, namespace, "waited", "8s")
        assert rc != 0 and took >= 7, f"kubectl wait took the Ready of generation 1 for generation 2: {said}"
    finally:
        operator.start()
    rc, _, said = wait_ready(kube, namespace, "waited", "120s")
    assert rc == 0, f"{said}\noperator log:\n{operator.log_tail()}"
    assert generations(kube, namespace, "waited") == (2, 2, 2)


def test_a_paused_rollout_is_ready_but_not_done(
    kube: Kube, operator: OperatorProcess, namespace: str
) -> None:
    """Ready is "serving at full capacity": a paused canary is Ready, and waiting for the rollout's end
    (Progressing=False) runs out while it is paused."""
    kube.apply(noop_md("paused", rollout={"paused": True}), namespace=namespace)
    assert wait_ready(kube, namespace, "paused", "180s")[0] == 0
    patch = {"spec": {"model": {"version": "2"}}}  # a new revision: a canary, held by the pause
    kube.kubectl("patch", "-n", namespace, "md/paused", "--type=merge", "-p", json.dumps(patch))
    wait_for(
        lambda: (
            (kube.get(MD_PATH.format(ns=namespace, name="paused")) or {}).get("status", {}).get("phase")
            == "Paused"
        ),
        timeout=60,
        what=f"phase Paused; operator log:\n{operator.log_tail()}",
    )
    rc, _, said = wait_ready(kube, namespace, "paused", "30s")
    assert rc == 0, said
    res = kube.kubectl(
        "wait", "-n", namespace, "--for=condition=Progressing=False", "--timeout=5s", "md/paused", check=False
    )
    assert res.returncode != 0, res.stdout
