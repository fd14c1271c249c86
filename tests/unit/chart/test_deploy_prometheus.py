"""deploy/prometheus scrapes like the local cluster's Prometheus, so queries and the dashboard see the same
labels on kind as locally."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from chart_render import REPO
from localcluster import config
from localcluster.pki import KeyPair

MANIFEST = REPO / "deploy" / "prometheus" / "prometheus.yaml"


def docs() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def test_relabeling_matches_the_local_cluster_except_its_pod_ip_filter() -> None:
    (cm,) = [d for d in docs() if d["kind"] == "ConfigMap"]
    ours = yaml.safe_load(cm["data"]["prometheus.yml"])["scrape_configs"][0]["relabel_configs"]
    local = config.prometheus_config(
        apiserver="https://127.0.0.1:6443",
        ca=Path("/ca.crt"),
        client=KeyPair(Path("/c.crt"), Path("/c.key")),
        pod_cidr="10.244.1.0/24",
    )["scrape_configs"][0]["relabel_configs"]
    local = [
        r for r in local if r.get("source_labels") != ["__meta_kubernetes_pod_ip"] or r["action"] != "keep"
    ]
    assert ours == local


def test_service_is_what_the_chart_defaults_to() -> None:
    chart_values = yaml.safe_load((REPO / "charts" / "modeldeploy" / "values.yaml").read_text())
    (svc,) = [d for d in docs() if d["kind"] == "Service"]
    url = f"http://{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc:{svc['spec']['ports'][0]['port']}"
    assert chart_values["operator"]["prometheusUrl"] == url


def test_prometheus_pod_is_restricted_and_only_reads_pods() -> None:
    (dep,) = [d for d in docs() if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert ":" in c["image"] and not c["image"].endswith(":latest")
    (role,) = [d for d in docs() if d["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
