"""kstatus, the status library behind Flux's health checks (sigs.k8s.io/cli-utils' status.Compute, built
as tools/kstatus by tools/build-binaries.sh), on the statuses the e2e and integration tests produced:
Current only when the operator is done with the current generation, InProgress while a rollout runs or the
status describes an older spec, Failed when only a change of spec helps (recorded_statuses.py)."""

from __future__ import annotations

import copy
import json
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from recorded_statuses import CASES, recorded


@cache
def kstatus_bin() -> Path:
    from localcluster.cluster import binaries_dir  # builds the pinned binaries on first use, else cached

    return binaries_dir() / "kstatus"


def kstatus(obj: dict[str, Any]) -> dict[str, str]:
    res = subprocess.run(
        [str(kstatus_bin())], input=json.dumps(obj), capture_output=True, text=True, timeout=30, check=False
    )
    assert res.returncode == 0, res.stderr
    out: dict[str, str] = json.loads(res.stdout)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_status_gets_its_kstatus(name: str) -> None:
    got = kstatus(recorded(name))
    assert got["status"] == CASES[name].kstatus, got["message"]


def test_a_status_of_an_older_generation_is_in_progress() -> None:
    healthy = next(n for n, c in sorted(CASES.items()) if c.kstatus == "Current")
    obj = copy.deepcopy(recorded(healthy))
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    got = kstatus(obj)
    assert got["status"] == "InProgress"
    assert "latest observed generation" in got["message"]
