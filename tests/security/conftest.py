"""The security tests play an attacker (issue 24): against a server process, and against the local
cluster with ModelDeployment authors who act through their own namespaced tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.conftest import crds, operator
from localcluster.testing import Kube, wait_for

from .tenants import Author, author

__all__ = ["crds", "operator", "team_a", "team_b"]


@pytest.fixture
def team_a(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[Author]:
    """The attacker: an author with their own token in their own namespace."""
    a = author(kube, namespace, tmp_path)
    yield a
    a.api.close()


@pytest.fixture
def team_b(kube: Kube) -> Iterator[str]:
    """The victim's namespace (with its default ServiceAccount, which its pods need)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    wait_for(lambda: kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), timeout=30, what="sa")
    yield name
    kube.api.delete(f"/api/v1/namespaces/{name}")
