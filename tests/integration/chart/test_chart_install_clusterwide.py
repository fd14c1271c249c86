"""The chart's default (cluster mode): one ClusterRole, ModelDeployments in any namespace reconciled under
it, and still no Secrets, no pod creation, no writes to the ModelDeployment spec, and only its own peering
object."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from chart_cluster import (
    CRDS,
    RESTRICTED,
    Helm,
    Release,
    audit_events_of,
    can_i,
    children,
    create_namespace,
    delete_namespace,
    install,
    is_local,
    md_ready,
    noop_md,
    operator_log,
    refusal_lines,
    running_operator,
    unique,
)
from localcluster.testing import wait_for


@pytest.fixture(scope="module")
def release(kube: Any, helm: Helm) -> Iterator[Release]:
    crds_before = {c: kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{c}") for c in CRDS}
    rel = Release(name=unique("mdc"), namespace=unique("md-op"), watched=[])
    rel.crds_before = crds_before  # type: ignore[attr-defined]
    create_namespace(kube, rel.namespace, RESTRICTED)
    try:
        install(helm, kube, rel)
        yield rel
    finally:
        helm("uninstall", rel.name, "--namespace", rel.namespace, "--wait", check=False)
        delete_namespace(kube, rel.namespace)


def test_cluster_mode_reconciles_in_any_namespace(kube: Any, release: Release, namespace: str) -> None:
    kube.api.wait_established(*CRDS)
    for crd in CRDS:
        if release.crds_before[crd] is None:  # type: ignore[attr-defined]
            # installed by this helm install from the chart's crds/
            crd_obj = kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
            managers = {m["manager"] for m in crd_obj["metadata"]["managedFields"]}
            assert "helm" in managers, managers
    pod = wait_for(lambda: running_operator(kube, release), timeout=120, what="operator Running")
    assert pod["spec"]["serviceAccountName"] == release.service_account
    assert "all namespaces (cluster mode)" in release.notes
    kube.apply(noop_md("anywhere"), namespace=namespace)
    wait_for(lambda: md_ready(kube, namespace, "anywhere"), timeout=180, interval=0.5, what="anywhere Ready")
    assert len(children(kube, namespace, "anywhere")["pods"]) == 1
    if is_local(kube):
        mine = audit_events_of(kube, release.user)
        assert any((e.get("objectRef") or {}).get("resource") == "clusterkopfpeerings" for e in mine)
        refused = [e for e in mine if (e.get("responseStatus") or {}).get("code") == 403]
        assert not refused, refused[:3]
    log = operator_log(kube, pod)
    assert "namespaces=cluster-wide" in log
    assert not refusal_lines(log), log[-3000:]
    kube.kubectl("delete", "-n", namespace, "md/anywhere", "--wait=true", "--timeout=60s")


def test_cluster_mode_rights(kube: Any, release: Release) -> None:
    user = release.user
    allowed = [
        ("list", "modeldeployments", None, ""),
        ("watch", "pods", None, ""),
        ("patch", "modeldeployments", "default", "status"),
        ("create", "deployments.apps", "default", ""),
        ("patch", f"clusterkopfpeerings/{release.fullname}", None, ""),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", None, ""),
    ]
    denied = [
        ("get", "secrets", None, ""),
        ("list", "secrets", release.namespace, ""),
        ("list", "configmaps", None, ""),
        ("create", "pods", "default", ""),
        ("create", "pods", "default", "exec"),
        ("update", "modeldeployments", "default", ""),
        ("delete", "modeldeployments", "default", ""),
        ("list", "namespaces", None, ""),  # kopf needs namespaces only in namespaced mode
        ("create", "clusterkopfpeerings", None, ""),
        ("patch", "clusterkopfpeerings/someone-else", None, ""),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", None, ""),
        ("list", "nodes", None, ""),
    ]
    wrong = [
        (verb, res, n, sub, want)
        for want, rows in ((True, allowed), (False, denied))
        for verb, res, n, sub in rows
        if can_i(kube, user, verb, res, n, sub) != want
    ]
    assert not wrong, f"(verb, resource, namespace, subresource, expected): {wrong}"
