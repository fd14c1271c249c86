"""The opt-in recorder of ModelDeployment statuses (localcluster.status_record): off unless asked, one file
per distinct state, nothing but ModelDeployments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from localcluster.status_record import ENV, StatusRecorder


def md(phase: str, generation: int = 1, observed: int = 1, ready: str = "True") -> dict:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ns", "generation": generation, "managedFields": [{}]},
        "status": {
            "phase": phase,
            "observedGeneration": observed,
            "conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "x"}],
        },
    }


def recorded(where: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(where.glob("*.json"))]


def test_off_unless_the_variable_names_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert StatusRecorder.from_env() is None
    monkeypatch.setenv(ENV, "")
    assert StatusRecorder.from_env() is None


def test_each_distinct_state_is_written_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/e2e/test_x.py::test_y (call)")
    rec = StatusRecorder.from_env()
    assert rec is not None
    for obj in (md("Progressing"), md("Progressing"), md("Healthy"), md("Healthy", generation=2)):
        rec.saw(obj)
    out = recorded(tmp_path)
    assert [(r["object"]["status"]["phase"], r["object"]["metadata"]["generation"]) for r in out] == [
        ("Progressing", 1),
        ("Healthy", 1),
        ("Healthy", 2),
    ]
    assert out[0]["test"] == "tests/e2e/test_x.py::test_y (call)"
    assert "managedFields" not in out[0]["object"]["metadata"]


def test_other_objects_and_misses_are_ignored(tmp_path: Path) -> None:
    rec = StatusRecorder(tmp_path)
    rec.saw(None)
    rec.saw({"kind": "Deployment", "metadata": {"name": "d"}, "status": {}})
    assert recorded(tmp_path) == []
