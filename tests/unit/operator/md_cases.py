"""Shared test data of the operator unit tests (importable by name; conftest modules are not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
INVALID_DIR = REPO / "tests" / "integration" / "operator" / "invalid"

BASE_MD: dict[str, Any] = {
    "apiVersion": "modeldeploy.io/v1alpha1",
    "kind": "ModelDeployment",
    "metadata": {"name": "minilm", "namespace": "default", "uid": "md-uid-1", "generation": 1},
    "spec": {"model": {"name": "minilm", "version": "1", "uri": "file:///models/minilm"}},
}


def invalid_manifests() -> list[tuple[str, dict[str, Any], str, str]]:
    """(file name, manifest, expected field, pydantic: refuse|skip) for every bad manifest."""
    out = []
    for path in sorted(INVALID_DIR.glob("*.yaml")):
        text = path.read_text()
        head = dict(
            line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# ") and ": " in line
        )
        out.append((path.name, yaml.safe_load(text), head["expect-field"], head["pydantic"]))
    return out
