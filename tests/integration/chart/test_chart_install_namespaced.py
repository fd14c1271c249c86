"""The chart installed for real in namespaced mode: the operator runs as a pod (the node agent's process) with
the chart's ServiceAccount token, reconciles a ModelDeployment under exactly the chart's RBAC, is not
allowed more, survives ``helm upgrade`` to a new image, and ``helm uninstall`` leaves the served models up.

The tests of this module run in order on one release (install -> reconcile -> rights -> canary -> upgrade ->
uninstall).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from chart_cluster import (
    CRDS,
    MD_PATH,
    RESTRICTED,
    Helm,
    Release,
    audit_events_of,
    audit_log,
    can_i,
    children,
    create_namespace,
    delete_namespace,
    events_from_operator,
    install,
    is_local,
    md_ready,
    noop_md,
    operator_log,
    operator_pods,
    refusal_lines,
    running_operator,
    token_subject,
    unique,
)
from localcluster.testing import wait_for

from tests.e2e.canary_support import LoadGenerator


@pytest.fixture(scope="module")
def release(kube: Any, helm: Helm) -> Iterator[Release]:
    rel = Release(name=unique("mdn"), namespace=unique("md-op"), watched=[unique("md-w")])
    other = unique("md-x")
    # Pod Security "restricted" enforced where the operator and the serving pods run: the apiserver
    # refuses any pod of the chart or of the operator that is not restricted.
    create_namespace(kube, rel.namespace, RESTRICTED)
    create_namespace(kube, rel.watched[0], RESTRICTED)
    create_namespace(kube, other)
    rel.values = []
    rel.other = other  # type: ignore[attr-defined]
    try:
        install(helm, kube, rel)
        yield rel
    finally:
        helm("uninstall", rel.name, "--namespace", rel.namespace, "--wait", check=False)
        for ns in (rel.watched[0], other, rel.namespace):
            delete_namespace(kube, ns)


def test_install_establishes_crds_and_runs_the_operator_with_the_chart_service_account(
    kube: Any, release: Release
) -> None:
    kube.api.wait_established(*CRDS)
    pod = wait_for(
        lambda: running_operator(kube, release), timeout=120, what="operator pod Running and Ready"
    )
    assert pod["spec"]["serviceAccountName"] == release.service_account
    if is_local(kube):  # the token the node agent requested for this pod (TokenRequest API)
        assert token_subject(kube, pod) == release.user
    log = wait_for(
        lambda: (text := operator_log(kube, pod)) and "starting:" in text and text,
        timeout=60,
        what="operator start line",
    )
    assert f"namespaces=['{release.watched[0]}']" in log
    assert "ModelDeploy" in release.notes and "namespaced mode" in release.notes
    assert "kubectl apply --server-side -f charts/modeldeploy/crds/" in release.notes


def test_modeldeployment_reconciled_under_the_chart_rbac(kube: Any, release: Release) -> None:
    ns, other = release.watched[0], release.other  # type: ignore[attr-defined]
    kube.apply(noop_md("outside"), namespace=other)  # not watched: must stay untouched
    kube.apply(noop_md("echo"), namespace=ns)
    obj = wait_for(lambda: md_ready(kube, ns, "echo"), timeout=180, interval=0.5, what="echo Ready")
    assert obj["status"]["phase"] == "Healthy"
    kids = children(kube, ns, "echo")
    assert len(kids["deployments"]) == 1 and kids["pdbs"] and kids["services"]
    uid = obj["metadata"]["uid"]
    for kind in ("deployments", "services", "pdbs"):
        for child in kids[kind]:
            assert any(o["uid"] == uid and o.get("controller") for o in child["metadata"]["ownerReferences"])
    (pod,) = kids["pods"]
    assert pod["status"]["phase"] == "Running"
    assert kube.endpoint_ips(ns, "echo") == {pod["status"]["podIP"]}  # Ready: the in-traffic gate was set
    assert {"Created", "Deployed"} <= {e["reason"] for e in events_from_operator(kube, ns, "echo")}

    # the writes were made with the chart's ServiceAccount, and none was refused
    if is_local(kube):
        assert audit_log(kube) is not None
        mine = audit_events_of(kube, release.user)
        wrote = {
            ((e.get("objectRef") or {}).get("resource"), (e.get("objectRef") or {}).get("subresource"))
            for e in mine
            if (e.get("responseStatus") or {}).get("code", 0) < 300
        }
        assert {
            ("modeldeployments", "status"),
            ("deployments", None),
            ("services", None),
            ("poddisruptionbudgets", None),
            ("pods", "status"),
            ("events", None),
            ("kopfpeerings", None),
        } <= wrote, wrote
        refused = [e for e in mine if (e.get("responseStatus") or {}).get("code") == 403]
        assert not refused, refused[:3]
    # reads too: kopf and our client log every refusal
    (op,) = operator_pods(kube, release)
    log = operator_log(kube, op)
    assert not refusal_lines(log), log[-3000:]

    outside = kube.get(MD_PATH.format(ns=other, name="outside"))
    assert outside is not None and not outside.get("status")
    assert not any(children(kube, other, "outside").values())


def test_rbac_is_not_wider_than_needed(kube: Any, release: Release) -> None:
    user, ns, other = release.user, release.watched[0], release.other  # type: ignore[attr-defined]
    peering = f"kopfpeerings/{release.fullname}"
    allowed = [
        ("list", "modeldeployments", ns, ""),
        ("watch", "modeldeployments", ns, ""),
        ("patch", "modeldeployments", ns, "status"),
        ("patch", "modeldeployments", ns, ""),  # clearing a handled command annotation
        ("create", "deployments.apps", ns, ""),
        ("patch", "deployments.apps", ns, ""),
        ("delete", "services", ns, ""),
        ("patch", "pods", ns, "status"),
        ("create", "events", ns, ""),
        ("patch", "events", ns, ""),  # an aggregated repeat
        ("get", "services", ns, ""),  # a child about to be created: is it someone else's?
        ("get", "deployments.apps", ns, ""),
        ("patch", peering, ns, ""),
        ("list", "customresourcedefinitions.apiextensions.k8s.io", None, ""),
    ]
    denied = [
        # no Secrets (nor ConfigMaps) anywhere, including its own namespace
        ("get", "secrets", ns, ""),
        ("list", "secrets", release.namespace, ""),
        ("list", "secrets", None, ""),
        ("get", "configmaps", ns, ""),
        # nothing in namespaces it does not watch
        ("list", "modeldeployments", other, ""),
        ("create", "deployments.apps", other, ""),
        ("list", "pods", other, ""),
        ("create", "events", other, ""),
        ("list", "modeldeployments", None, ""),
        ("list", "deployments.apps", release.namespace, ""),
        # only what the reconciler does, even where it works
        ("update", "modeldeployments", ns, ""),
        ("delete", "modeldeployments", ns, ""),
        ("create", "pods", ns, ""),
        ("delete", "pods", ns, ""),
        ("create", "pods", ns, "exec"),
        ("update", "deployments.apps", ns, ""),
        ("create", "kopfpeerings", ns, ""),
        ("patch", "kopfpeerings/someone-else", ns, ""),
        ("create", "clusterkopfpeerings", None, ""),
        ("create", "rolebindings.rbac.authorization.k8s.io", ns, ""),
        ("create", "serviceaccounts", ns, "token"),
        ("update", "customresourcedefinitions.apiextensions.k8s.io", None, ""),
    ]
    wrong = [
        (verb, res, n, sub, want)
        for want, rows in ((True, allowed), (False, denied))
        for verb, res, n, sub in rows
        if can_i(kube, user, verb, res, n, sub) != want
    ]
    assert not wrong, f"(verb, resource, namespace, subresource, expected): {wrong}"


def _judged(kube: Any, ns: str, name: str, revision: str) -> list[dict[str, Any]]:
    st = (kube.get(MD_PATH.format(ns=ns, name=name)) or {}).get("status") or {}
    return [m for m in (st.get("analysis") or {}).get("measurements", []) if m["revision"] == revision]


def test_canary_rollout_promoted_under_the_chart_rbac(kube: Any, release: Release) -> None:
    """A new model version goes through canary steps (readiness gates, analysis against Prometheus from the
    pod network, promotion) with the chart's credentials, under traffic and with no-data holding: it is
    promoted only because Prometheus, queried by the operator pod, measured the canary and passed it."""
    ns = release.watched[0]
    old = kube.get(MD_PATH.format(ns=ns, name="echo"))["status"]["stableRevision"]
    body = noop_md("echo")
    body["spec"]["model"].update(version="2", uri="noop://chart?delay_ms=1")
    body["spec"]["rollout"] = {
        "steps": [50, 100],
        "interval": "3s",
        "bakeTime": "1s",
        "keepPrevious": {"replicas": 0, "ttl": "1m"},
        "analysis": {"onNoData": "hold", "noDataTimeout": "10m", "minRequests": 5},
    }

    def promoted() -> dict[str, Any] | None:
        obj = md_ready(kube, ns, "echo")
        st = (obj or {}).get("status") or {}
        new = st.get("stableRevision")
        if not obj or st.get("phase") != "Healthy" or st.get("canaryRevision") or new in (None, old):
            return None
        live = children(kube, ns, "echo")["pods"]
        return (
            obj
            if len(live) == 1 and live[0]["metadata"]["labels"]["modeldeploy.io/revision"] == new
            else None
        )

    with LoadGenerator(kube, ns, "echo") as traffic:
        kube.apply(body, namespace=ns)
        obj = wait_for(promoted, timeout=180, interval=0.5, what="version 2 promoted, the old revision gone")
    new = obj["status"]["stableRevision"]
    # the canary windows were measured by Prometheus (no Error) and the promoting ones passed on real
    # requests (held windows, if any, had too few yet)
    measured = _judged(kube, ns, "echo", new)
    assert measured and "Error" not in {m["verdict"] for m in measured}, measured
    requests = [m for m in measured if m["metric"] == "requests" and m["verdict"] == "Pass"]
    assert requests and all(m["value"] >= 5 for m in requests), measured
    # every request answered 200 through the promotion, by one revision or the other
    assert traffic.by_kind()["ok"] > 0 and set(traffic.by_kind()) == {"ok"}, traffic.by_kind()
    passed = [e for e in events_from_operator(kube, ns, "echo") if e["reason"] == "AnalysisPassed"]
    assert passed and all("modelserver_requests_total" in e["message"] for e in passed)
    assert "Promoted" in {e["reason"] for e in events_from_operator(kube, ns, "echo")}
    if is_local(kube):
        refused = [
            e
            for e in audit_events_of(kube, release.user)
            if (e.get("responseStatus") or {}).get("code") == 403
        ]
        assert not refused, refused[:3]
    (op,) = operator_pods(kube, release)
    log = operator_log(kube, op)
    assert not refusal_lines(log), log[-3000:]


def test_negative_control_a_canary_judged_by_an_unreachable_prometheus_is_never_promoted(
    kube: Any, release: Release
) -> None:
    """The same rollout as above, the same traffic, only the Prometheus URL wrong: held at its first step."""
    ns = release.watched[0]
    name = "echo-ctl"
    kube.apply(noop_md(name), namespace=ns)
    wait_for(lambda: md_ready(kube, ns, name), timeout=120, interval=0.5, what=f"{name} v1 ready")
    body = noop_md(name)
    body["spec"]["model"].update(version="2", uri="noop://chart?delay_ms=1&rev=2")
    body["spec"]["rollout"] = {
        "steps": [50, 100],
        "interval": "3s",
        "bakeTime": "1s",
        "analysis": {
            "onNoData": "hold",
            "noDataTimeout": "10m",
            "minRequests": 5,
            "prometheusURL": "http://127.0.0.1:9",  # a closed port
        },
    }
    try:
        with LoadGenerator(kube, ns, name):
            kube.apply(body, namespace=ns)

            def three_windows() -> dict[str, Any] | None:
                st = (kube.get(MD_PATH.format(ns=ns, name=name)) or {}).get("status") or {}
                canary = st.get("canaryRevision")
                windows = {m["time"] for m in _judged(kube, ns, name, canary)} if canary else set()
                return st if len(windows) >= 3 else None

            st = wait_for(three_windows, timeout=120, interval=0.5, what="three windows judged")
        assert st["step"] == 0 and st["canaryRevision"] and st["phase"] != "Healthy", st
        assert {m["verdict"] for m in _judged(kube, ns, name, st["canaryRevision"])} == {"Error"}
        assert not [e for e in events_from_operator(kube, ns, name) if e["reason"] == "Promoted"]
    finally:
        kube.kubectl("delete", "-n", ns, f"md/{name}", "--wait=true", "--timeout=60s", check=False)


def test_upgrade_to_a_new_image_replaces_only_the_operator(kube: Any, release: Release, helm: Helm) -> None:
    ns = release.watched[0]
    before = running_operator(kube, release)
    assert before is not None
    # kopf's liveness endpoint has answered the probe all along
    assert all(cs["restartCount"] == 0 for cs in before["status"]["containerStatuses"])
    (serving,) = children(kube, ns, "echo")["pods"]
    helm(
        "upgrade", release.name, str(__import__("chart_cluster").CHART), "--namespace", release.namespace,
        "--reuse-values", "--set", "image.tag=upgrade-test", "--wait", "--timeout", "180s",
    )  # fmt: skip
    dep = kube.get(f"/apis/apps/v1/namespaces/{release.namespace}/deployments/{release.fullname}")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == "modeldeploy/operator:upgrade-test"
    after = wait_for(
        lambda: (
            (p := running_operator(kube, release)) and p["metadata"]["uid"] != before["metadata"]["uid"] and p
        ),
        timeout=120,
        what="the upgraded operator pod",
    )
    assert after["spec"]["containers"][0]["image"] == "modeldeploy/operator:upgrade-test"
    # the served model was not touched: same pod, never restarted, still in traffic
    (still,) = children(kube, ns, "echo")["pods"]
    assert still["metadata"]["uid"] == serving["metadata"]["uid"]
    assert all(cs["restartCount"] == 0 for cs in still["status"]["containerStatuses"])
    # the upgraded operator acts: a change is reconciled
    kube.kubectl("patch", "-n", ns, "md/echo", "--type=merge", "-p", '{"spec":{"replicas":2}}')
    wait_for(lambda: md_ready(kube, ns, "echo", replicas=2), timeout=180, interval=0.5, what="echo 2/2")
    log = operator_log(kube, after)
    assert not [ln for ln in log.splitlines() if any(m in ln for m in ("403", "Forbidden"))], log[-3000:]


def test_uninstall_keeps_modeldeployments_and_their_children_serving(
    kube: Any, release: Release, helm: Helm
) -> None:
    ns = release.watched[0]
    helm("uninstall", release.name, "--namespace", release.namespace, "--wait", "--timeout", "120s")
    wait_for(lambda: not operator_pods(kube, release), timeout=120, what="operator pod gone")
    assert kube.get(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles/{release.fullname}") is None
    assert kube.get(f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/{release.fullname}") is None
    # Helm never deletes crds/: the ModelDeployments stay, and so do their children, still serving
    for crd in CRDS:
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}") is not None
    assert kube.get(MD_PATH.format(ns=ns, name="echo")) is not None
    kids = children(kube, ns, "echo")
    assert kids["deployments"] and kids["services"] and kids["pdbs"]
    assert len(kids["pods"]) == 2
    assert len(kube.endpoint_ips(ns, "echo")) == 2


def test_reinstall_adopts_the_running_modeldeployments_without_restarting_them(
    kube: Any, release: Release, helm: Helm
) -> None:
    ns = release.watched[0]
    pods = {p["metadata"]["uid"] for p in children(kube, ns, "echo")["pods"]}
    assert len(pods) == 2
    install(helm, kube, release)
    wait_for(lambda: running_operator(kube, release), timeout=120, what="reinstalled operator Running")
    # the operator acts again (a change is reconciled) and the serving pods were never replaced
    kube.kubectl("patch", "-n", ns, "md/echo", "--type=merge", "-p", '{"spec":{"replicas":1}}')
    wait_for(lambda: md_ready(kube, ns, "echo", replicas=1), timeout=180, interval=0.5, what="echo 1/1")
    (left,) = wait_for(
        lambda: (
            len(
                live := [
                    p
                    for p in children(kube, ns, "echo")["pods"]
                    if not p["metadata"].get("deletionTimestamp")
                ]
            )
            == 1
            and live
        ),
        timeout=120,
        what="one serving pod left",
    )
    assert left["metadata"]["uid"] in pods
    assert all(cs["restartCount"] == 0 for cs in left["status"]["containerStatuses"])
