"""``helm lint --strict`` and ``helm template`` output accepted by the real apiserver
(``kubectl apply --dry-run=server``) for the default values and every file in charts/modeldeploy/ci/."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_cluster import CHART, CRDS, REPO, Helm, create_namespace, delete_namespace

CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
VALUES = [None, *CI_VALUES]
IDS = ["defaults", *(p.name for p in CI_VALUES)]


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_helm_lint_strict(helm: Helm, values: Path | None) -> None:
    res = helm("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []), check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


@pytest.fixture(scope="module")
def prerequisites(kube: Any) -> Iterator[str]:
    """The chart's CRDs (as a user applies them for upgrades), the monitoring stand-in CRDs, and the
    namespaces the ci/ values name."""
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    kube.kubectl("apply", "--server-side", "-f", str(Path(__file__).with_name("monitoring-crds.yaml")))
    kube.api.wait_established(
        *CRDS, "servicemonitors.monitoring.coreos.com", "podmonitors.monitoring.coreos.com"
    )
    named: set[str] = set()
    for p in CI_VALUES:
        named |= set((yaml.safe_load(p.read_text()) or {}).get("watchNamespaces") or [])
    created = [ns for ns in sorted(named) if kube.get(f"/api/v1/namespaces/{ns}") is None]
    for ns in created:
        create_namespace(kube, ns)
    release_ns = "md-render"
    if kube.get(f"/api/v1/namespaces/{release_ns}") is None:
        create_namespace(kube, release_ns)
        created.append(release_ns)
    yield release_ns
    for ns in created:
        delete_namespace(kube, ns)


@pytest.mark.parametrize("values", VALUES, ids=IDS)
def test_template_accepted_by_the_apiserver(kube: Any, helm: Helm, prerequisites: str, values: Any) -> None:
    rendered = helm(
        "template", "md", str(CHART), "--namespace", prerequisites, *(["-f", str(values)] if values else [])
    ).stdout
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered) if d}
    assert "Deployment" in kinds
    res = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("(server dry run)") == sum(1 for d in yaml.safe_load_all(rendered) if d)


def test_deploy_prometheus_accepted_by_the_apiserver(kube: Any) -> None:
    """deploy/prometheus (the kind e2e run's Prometheus); its namespace must exist for a dry run."""
    manifest = REPO / "deploy" / "prometheus" / "prometheus.yaml"
    docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]
    (ns,) = [d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"]
    created = kube.get(f"/api/v1/namespaces/{ns}") is None
    if created:
        create_namespace(kube, ns)
    try:
        res = kube.kubectl("apply", "--dry-run=server", "-f", str(manifest), check=False)
        assert res.returncode == 0, res.stderr
        assert res.stdout.count("(server dry run)") == len(docs)
    finally:
        if created:
            delete_namespace(kube, ns)
