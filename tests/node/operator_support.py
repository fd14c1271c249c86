"""The operator for the real-node tier: the CRDs and the operator out of cluster (admin credentials), as
tests/e2e's ``operator`` fixture runs it, under names of their own so that they never shadow a fixture
the tier's conftest may define. Import the fixtures into a test module to use them. The operator lives
for one module: another module of the tier may run an operator of its own (the chart's), and two
operators must never reconcile the same ModelDeployments."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.canary_support import apply_crds, run_operator
from localcluster.testing import Kube

#: the serving image as ``make images`` names it (imported into the node's containerd at ``up``)
SERVER_IMAGE = "docker.io/modeldeploy/modelserver:dev"


@pytest.fixture(scope="session")
def md_crds(kube: Kube) -> None:
    apply_crds(kube)


@pytest.fixture(scope="module")
def md_operator(
    kube: Kube, md_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[subprocess.Popen[bytes]]:
    yield from run_operator(kube, tmp_path_factory.mktemp("operator") / "operator.log")


def noop_md(name: str, version: str, memory: str, **rollout: Any) -> dict[str, Any]:
    """One replica of the built-in noop model (no files, no torch) in the serving image, short intervals."""
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "echo", "version": version, "uri": "noop://?delay_ms=2", "format": "noop"},
            "image": SERVER_IMAGE,
            "replicas": 1,
            "resources": {"cpu": "100m", "memory": memory},
            "batching": {"maxBatchSize": 8, "maxQueueDelayMs": 1},
            "rollout": {
                "steps": [50, 100],
                "interval": "10s",
                "progressDeadline": "10m",
                "keepPrevious": {"replicas": 0},
                **rollout,
            },
        },
    }
