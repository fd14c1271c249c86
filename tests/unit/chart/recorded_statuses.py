"""ModelDeployment statuses recorded from the e2e and integration tests (fixtures/argocd/*.json), and what
Argo CD's health script and kstatus must make of each.

Recorded with ``MODELDEPLOY_RECORD_STATUSES=<dir>`` (localcluster.status_record), then trimmed to what a
health check reads: apiVersion, kind, metadata (name, generation) and status (phase, observedGeneration,
revision, conditions, analysis.pausedReason). Each file says which test produced it (``recordedFrom``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).with_name("fixtures") / "argocd"


@dataclass(frozen=True)
class Expected:
    argocd: str  # Argo CD health: Healthy, Progressing, Degraded, Suspended
    says: tuple[str, ...]  # what the Argo CD message must contain
    kstatus: str  # kstatus: Current, InProgress, Failed


#: every fixture and its expected verdicts (a fixture without an entry fails test_every_fixture_is_judged)
CASES: dict[str, Expected] = {
    # kstatus calls an object with no status at all Current (its generic rules find nothing to wait for):
    # a limit of kstatus, for the moment between create and the operator's first status write
    "no-status-yet.json": Expected("Progressing", ("Waiting for the modeldeploy operator",), "Current"),
    "first-revision-scaling-up.json": Expected(
        "Progressing", ("Progressing: ScalingUp: revision", "0/2 pods ready"), "InProgress"
    ),
    "spec-changed-not-yet-observed.json": Expected(
        "Progressing", ("observe generation 2 (status is of generation 1)",), "InProgress"
    ),
    "spec-changed-operator-stopped.json": Expected(
        "Progressing", ("observe generation 2 (status is of generation 1)",), "InProgress"
    ),
    "canary-step.json": Expected("Progressing", ("CanaryProgressing", "step 1/3 at 25%"), "InProgress"),
    "paused-canary.json": Expected("Suspended", ("Paused: CanaryPaused", "(paused)"), "InProgress"),
    "healthy-after-promotion.json": Expected(
        "Healthy", ("MinimumReplicasReady: 2/2 pods ready and in traffic",), "Current"
    ),
    "rolled-back.json": Expected("Degraded", ("RolledBack: revision", "error-rate"), "Failed"),
}


def recorded(name: str) -> dict[str, Any]:
    """The recorded ModelDeployment of fixture ``name``."""
    obj: dict[str, Any] = json.loads((FIXTURES / name).read_text())["object"]
    return obj


def fixture_names() -> list[str]:
    return sorted(p.name for p in FIXTURES.glob("*.json"))
