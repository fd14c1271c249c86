"""Fixtures of the operator's integration tests (helpers: md_cluster.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from md_cluster import REPO, Audit, OperatorProcess


@pytest.fixture(scope="module")
def crds(kube: Any) -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kube.api.wait_established(
        "modeldeployments.modeldeploy.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"
    )


@pytest.fixture(scope="module")
def operator(kube: Any, crds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    from localcluster.testing import wait_for

    log = tmp_path_factory.mktemp("operator") / "operator.log"
    op = OperatorProcess(Path(kube.kubeconfig), log)
    op.start()
    try:
        wait_for(op.healthy, timeout=60, what=f"operator liveness endpoint; log:\n{op.log_tail()}")
        yield op
    finally:
        op.stop()
        sys.stderr.write(f"\n--- operator log (tail) ---\n{op.log_tail(200)}\n")


@pytest.fixture(scope="module")
def audit(kube: Any) -> Audit:
    return Audit(Path(kube.cluster.state_dir) / "logs" / "audit.log")
