"""An opt-in recorder of the ModelDeployment statuses that tests read, for fixtures of tools that judge a
status by its content (the Argo CD health script, kstatus: ``tests/unit/chart/test_argocd_health.py``).

With ``MODELDEPLOY_RECORD_STATUSES=<dir>`` set, every ModelDeployment that
:meth:`localcluster.testing.Kube.get` returns is written to ``<dir>`` as JSON, once per distinct state: its
phase, its conditions (type, status, reason, observedGeneration), ``status.observedGeneration``,
``metadata.generation`` and whether the analysis is paused. A state seen again is not written again. Unset
(the default) nothing is recorded and nothing else changes.

Each file holds ``{"test": <the pytest node that read it>, "object": <the ModelDeployment less
managedFields>}``.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ENV = "MODELDEPLOY_RECORD_STATUSES"


def state_key(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes two recorded statuses different for a health check."""
    status = obj.get("status") or {}
    conditions = tuple(
        (c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration"))
        for c in status.get("conditions") or []
    )
    return (
        (obj.get("metadata") or {}).get("namespace"),
        (obj.get("metadata") or {}).get("name"),
        status.get("phase"),
        conditions,
        status.get("observedGeneration"),
        (obj.get("metadata") or {}).get("generation"),
        bool((status.get("analysis") or {}).get("pausedReason")),
    )


class StatusRecorder:
    """Writes each distinct ModelDeployment state it is shown to a directory (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._seen: set[tuple[Any, ...]] = set()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> StatusRecorder | None:
        """A recorder into ``$MODELDEPLOY_RECORD_STATUSES``, or None when it is unset or empty."""
        where = os.environ.get(ENV)
        return cls(Path(where)) if where else None

    def saw(self, obj: Mapping[str, Any] | None) -> None:
        """Record ``obj`` if it is a ModelDeployment in a state not recorded yet; anything else is ignored."""
        if not obj or obj.get("kind") != "ModelDeployment":
            return
        key = state_key(obj)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            n = len(self._seen)
        meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
        record = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "object": {**obj, "metadata": meta}}
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{os.getpid()}-{n:04d}-{meta.get('namespace', '')}-{meta.get('name', '')}.json"
        (self.directory / name).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
