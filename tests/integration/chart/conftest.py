"""Fixtures of the chart's integration tests (helpers: chart_cluster.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_cluster import Helm


@pytest.fixture(scope="session")
def helm(kube: Any, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(Path(kube.kubeconfig), tmp_path_factory.mktemp("helm-home"))
