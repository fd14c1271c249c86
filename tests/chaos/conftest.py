"""Chaos fixtures: the e2e suite's CRDs on the session cluster, and the operator (one per module: a module
that does not ask for it has none running, and may start its own) as a process of its own that reaches
the apiserver at the pod network's host address (``localcluster.faults``), so that
:func:`~localcluster.faults.partitioned_from_apiserver` can cut it off while the tests' own clients, the
controllers and the node agent keep talking to the apiserver on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.canary_support import write_chaos_report
from e2e.conftest import crds, dripping
from localcluster import faults
from localcluster.operator_process import OperatorProcess
from localcluster.testing import Kube

__all__ = ["crds", "dripping", "operator", "report"]


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[dict[str, Any]]:
    """The module's figures, by scenario: written to $CHAOS_REPORT (make bench-chaos) when it ends."""
    figures: dict[str, Any] = {}
    yield figures
    write_chaos_report(figures)


@pytest.fixture(scope="module")
def operator(kube: Kube, crds: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    where = tmp_path_factory.mktemp("operator")
    kubeconfig = faults.kubeconfig_via_pod_network(kube.cluster, where / "kubeconfig")
    op = OperatorProcess(kube.cluster, where / "operator.log", kubeconfig=kubeconfig)
    try:
        yield op.wait_live()
    finally:
        op.stop()
        sys.stderr.write(f"\n--- operator log (tail) ---\n{op.log_tail()}\n")
