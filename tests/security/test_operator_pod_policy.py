"""Issue 24, finding 3: the operator's `patch pods` right, narrowed by the chart's second admission policy
(``templates/operator-pod-policy.yaml``). Played with a stolen operator token: a ServiceAccount named as
the chart names the operator's, holding the chart's pod rights (patch pods, patch pods/status) in a
watched namespace. Without the policy that token swaps a serving pod's image (the attack is real); with
it the apiserver takes only what the operator itself writes -- the ``modeldeploy.io/shadow`` annotation
and the ``modeldeploy.io/in-traffic`` condition of a ModelDeployment's pod -- and refuses the rest with
a message that says so. Other users (here the cluster admin) are not affected by the policy."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster.kubeapi import KubeAPI
from localcluster.testing import Kube
from modeldeploy.kube import KubeError
from unit.chart.chart_render import CHART, helm

from .tenants import grant, token_client

VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"
# the pod rights of the chart's namespacedRules (pods: list, watch, patch; pods/status: patch), plus get
POD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
]
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "containers": [{"name": "server", "image": "registry.example.com/ml/modelserver:1"}],
            "readinessGates": [{"conditionType": "modeldeploy.io/in-traffic"}],
            "nodeSelector": {"no-such-node": "true"},  # stays Pending: nothing but us writes it
        },
    }


class StolenToken:
    """A client with the operator's ServiceAccount token, and the names of its namespaces."""

    def __init__(self, api: KubeAPI, namespace: str, release_namespace: str) -> None:
        self.api, self.ns, self.release_ns = api, namespace, release_namespace

    def patch(self, name: str, body: dict[str, Any], *, status: bool = False) -> str | None:
        """The apiserver's refusal of this patch (its message), None when it took it. A merge patch, as
        the operator sends for the annotation; a strategic one for the status (as the operator) and for
        the spec (containers merged by name, so only the image changes)."""
        path = f"/api/v1/namespaces/{self.ns}/pods/{name}" + ("/status" if status else "")
        kind = STRATEGIC if status or "spec" in body else MERGE
        try:
            self.api.request("PATCH", path, body=body, content_type=kind)
        except KubeError as e:
            assert e.status in (403, 422), e
            return e.message  # whole (str(e) shortens it)
        return None


def image(kube: Kube, namespace: str, name: str) -> str:
    got = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    assert got is not None
    return str(got["spec"]["containers"][0]["image"])


@pytest.fixture
def operator_token(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[StolenToken]:
    """The operator's ServiceAccount as the chart names it (release ``md``, in a namespace of its own)
    with the chart's pod rights in ``namespace``, which holds a serving pod and a neighbour's pod."""
    ops = f"ops-{uuid.uuid4().hex[:6]}"
    kube.api.create("/api/v1/namespaces", {"metadata": {"name": ops}})
    kube.api.create(f"/api/v1/namespaces/{ops}/serviceaccounts", {"metadata": {"name": "md-modeldeploy"}})
    grant(kube, namespace, subject=("md-modeldeploy", ops), rules=POD_RULES)
    for p in (pod("serving", {"modeldeploy.io/name": "minilm"}), pod("neighbour", {"app": "payments"})):
        kube.api.create(f"/api/v1/namespaces/{namespace}/pods", p)
    probe = f"/api/v1/namespaces/{namespace}/pods/serving"
    api = token_client(kube, ops, "md-modeldeploy", tmp_path, probe)
    try:
        yield StolenToken(api, namespace, ops)
    finally:
        api.close()
        kube.api.delete(f"/api/v1/namespaces/{ops}")


@pytest.fixture
def policy(kube: Kube, operator_token: StolenToken) -> Iterator[list[dict[str, Any]]]:
    """The chart's operator-pods policy and binding, rendered for release ``md`` in the token's
    namespace and watching the test's namespace, installed on the cluster (not yet in effect)."""
    t = operator_token
    out = helm(
        "template", "md", str(CHART), "--namespace", t.release_ns,
        "--show-only", "templates/operator-pod-policy.yaml", "--set", f"watchNamespaces[0]={t.ns}",
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    yield docs
    for d in reversed(docs):
        path = VAP if d["kind"] == "ValidatingAdmissionPolicy" else BINDING
        kube.api.delete(f"{path}/{d['metadata']['name']}")  # a missing one is fine


def test_a_stolen_operator_token_changes_only_the_shadow_annotation_and_the_traffic_gate(
    kube: Kube, operator_token: StolenToken, policy: list[dict[str, Any]]
) -> None:
    t = operator_token
    # Without the policy, the chart's RBAC alone lets the token run another image in a serving pod.
    assert (
        t.patch("serving", {"spec": {"containers": [{"name": "server", "image": "evil.example/miner:1"}]}})
        is None
    )
    assert image(kube, t.ns, "serving") == "evil.example/miner:1"

    for d in policy:
        kube.api.create(VAP if d["kind"] == "ValidatingAdmissionPolicy" else BINDING, d)
    # the apiserver loads a new policy a moment later: probe with a harmless label change until refused
    deadline = time.monotonic() + 30
    while t.patch("serving", {"metadata": {"labels": {"probe": str(time.monotonic())}}}) is None:
        assert time.monotonic() < deadline, "the operator-pods policy never took effect"
        time.sleep(0.5)

    # what the operator writes is taken: the shadow target, and the in-traffic gate either way
    assert (
        t.patch("serving", {"metadata": {"annotations": {"modeldeploy.io/shadow": "http://md-r2:8080"}}})
        is None
    )
    assert t.patch("serving", {"metadata": {"annotations": {"modeldeploy.io/shadow": None}}}) is None
    for status in ("True", "False"):
        gate = {"type": "modeldeploy.io/in-traffic", "status": status, "reason": "Test"}
        assert t.patch("serving", {"status": {"conditions": [gate]}}, status=True) is None

    # everything else is refused, with a message that says what the operator may do
    swap = {"spec": {"containers": [{"name": "server", "image": "evil.example/miner:2"}]}}
    msg = t.patch("serving", swap)
    assert msg is not None and "may change only its modeldeploy.io/shadow annotation" in msg
    assert image(kube, t.ns, "serving") == "evil.example/miner:1"
    assert t.patch("serving", {"metadata": {"annotations": {"prometheus.io/scrape": "false"}}}) is not None
    assert t.patch("serving", {"metadata": {"labels": {"modeldeploy.io/name": "other"}}}) is not None
    ready = {"type": "Ready", "status": "False", "reason": "Test"}
    msg = t.patch("serving", {"status": {"conditions": [ready]}}, status=True)
    assert msg is not None and "only its modeldeploy.io/in-traffic condition" in msg
    # a pod that is not a ModelDeployment's is not the operator's to touch at all
    msg = t.patch("neighbour", {"metadata": {"annotations": {"modeldeploy.io/shadow": "http://x:1"}}})
    assert msg is not None and "writes only the pods of ModelDeployments" in msg
    gate = {"type": "modeldeploy.io/in-traffic", "status": "False", "reason": "Test"}
    assert t.patch("neighbour", {"status": {"conditions": [gate]}}, status=True) is not None

    # the policy is the operator's only: the cluster admin still edits the pod
    kube.api.request(
        "PATCH", f"/api/v1/namespaces/{t.ns}/pods/serving", body={"metadata": {"labels": {"by": "admin"}}},
        content_type=MERGE,
    )  # fmt: skip
