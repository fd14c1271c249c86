"""Render charts/modeldeploy with the real helm binary (`helm template`, no cluster) and index it."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "modeldeploy"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))


@cache
def helm_bin() -> Path:
    from localcluster.cluster import binaries_dir  # builds the pinned binaries on first use, else cached

    return binaries_dir() / "helm"


def helm_env(home: Path) -> dict[str, str]:
    """helm with its cache/config/data under ``home`` (nothing of the user's helm setup is read)."""
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }


def helm(
    *args: str, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="helm-") as home:
        res = subprocess.run(
            [str(helm_bin()), *args],
            capture_output=True,
            text=True,
            env=env or helm_env(Path(home)),
            timeout=120,
        )
    if check and res.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stderr}")
    return res


def template_text(*extra: str, release: str = "md", namespace: str = "md-system") -> str:
    return helm("template", release, str(CHART), "--namespace", namespace, *extra).stdout


def render(*extra: str, release: str = "md", namespace: str = "md-system") -> list[dict[str, Any]]:
    docs = yaml.safe_load_all(template_text(*extra, release=release, namespace=namespace))
    return [d for d in docs if d]


def by_kind(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def rule_table(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource[:resourceName,...]) -> verbs."""
    out: dict[tuple[str, str], set[str]] = {}
    for r in rules:
        for g in r.get("apiGroups", []):
            for res in r.get("resources", []):
                key = res if not r.get("resourceNames") else f"{res}:{','.join(r['resourceNames'])}"
                out.setdefault((g, key), set()).update(r["verbs"])
    return out
