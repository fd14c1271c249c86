"""The security tests play an attacker (issue 24): against a server process, and against the local
cluster with ModelDeployment authors who act through their own namespaced tokens."""

from __future__ import annotations

from e2e.conftest import crds, operator

__all__ = ["crds", "operator"]
