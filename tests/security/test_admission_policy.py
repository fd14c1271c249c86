"""Finding 3 of issue 24 (in part), played on the local cluster: the chart's ValidatingAdmissionPolicy
keeps an author's ModelDeployment within what the platform team allows -- images from the allowed
registries, tolerations of the GPU taint only -- and the apiserver's refusal names the field.

The policy and its binding are rendered from the chart (``helm template``, the values a platform team
would set) and applied as the cluster admin; the binding is limited to the author's namespace, so the
rest of the session's tests are untouched. The author acts through their own namespaced token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from localcluster.testing import Kube
from modeldeploy.kube import KubeError
from unit.chart.chart_render import CHART, helm

from .tenants import Author, author, grant

MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments"
VAP = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
#: what the platform team allows: a registry host, and one repository of another registry
PREFIXES = ["registry.example.com", "mirror.example.com/ml/modelserver"]
BINDING = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def md(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": {"name": "noop", "uri": "noop://model"}, "replicas": 1, **spec},
    }


def rendered_policy(namespace: str) -> list[dict[str, Any]]:
    out = helm(
        "template",
        "md",
        str(CHART),
        "--show-only",
        "templates/admission-policy.yaml",
        "--set-json",
        f"admissionPolicy.allowedImagePrefixes={json.dumps(PREFIXES)}",
        "--set",
        f"watchNamespaces[0]={namespace}",
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture
def policed(kube: Kube, crds: Any, namespace: str, tmp_path: Path) -> Iterator[Author]:
    docs = rendered_policy(namespace)
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for d in docs:
        kube.api.create(VAP if d["kind"] == "ValidatingAdmissionPolicy" else BINDING, d)
    a = author(kube, namespace, tmp_path)
    try:
        yield a
    finally:
        a.api.close()
        for d in reversed(docs):
            path = VAP if d["kind"] == "ValidatingAdmissionPolicy" else BINDING
            kube.api.delete(f"{path}/{d['metadata']['name']}")


def refusal(a: Author, body: dict[str, Any]) -> str | None:
    """The apiserver's message when it refuses the author's ModelDeployment, None when it takes it."""
    try:
        a.api.create(MD_PATH.format(ns=a.namespace), body)
    except KubeError as e:
        assert e.status in (403, 422), e
        return str(e)
    return None


def in_effect(a: Author) -> str:
    """Waits until the apiserver, which loads a new policy a moment later, refuses a bad image; the
    refusal's message."""
    deadline = time.monotonic() + 30
    while (msg := refusal(a, md("probe", image="evil.example/miner:1"))) is None:
        a.api.delete(f"{MD_PATH.format(ns=a.namespace)}/probe")
        assert time.monotonic() < deadline, "the admission policy never took effect"
        time.sleep(0.5)
    return msg


def test_the_chart_policy_refuses_images_and_tolerations_the_platform_team_did_not_allow(
    policed: Author,
) -> None:
    a = policed
    msg = in_effect(a)
    assert "spec.image: evil.example/miner:1 is not from an allowed registry" in msg
    assert "(allowed prefixes: registry.example.com, mirror.example.com/ml/modelserver)" in msg

    # allowed: an image from the registry, or none (the operator's default), and the GPU taint
    assert refusal(a, md("ok-image", image="registry.example.com/ml/modelserver:1.2")) is None
    assert refusal(a, md("ok-default")) is None
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert refusal(a, md("ok-gpu", tolerations=gpu)) is None

    # refused: another taint (a node pool kept for another team), or a toleration of every taint
    other = [{"key": "dedicated", "operator": "Equal", "value": "payments", "effect": "NoSchedule"}]
    msg = refusal(a, md("other-taint", tolerations=other))
    assert msg is not None and "spec.tolerations: only the taint keys nvidia.com/gpu" in msg
    assert refusal(a, md("every-taint", tolerations=[{"operator": "Exists"}])) is not None
    # an update cannot sneak it in either
    path = f"{MD_PATH.format(ns=a.namespace)}/ok-gpu"
    with pytest.raises(KubeError) as err:
        a.api.request(
            "PATCH",
            path,
            body={"spec": {"image": "evil.example/miner:1"}},
            content_type="application/merge-patch+json",
        )
    assert err.value.status in (403, 422) and "spec.image" in str(err.value)


def test_an_allowed_prefix_admits_an_image_only_where_a_part_of_its_reference_ends(policed: Author) -> None:
    """A plain startsWith let the prefix registry.example.com admit registry.example.com.evil.io/x. The
    rule (templates/admission-policy.yaml): a host prefix admits the images under it, not another port
    of it nor the host alone; a repository prefix admits itself, its tags, digests and the repositories
    under it, not a longer name."""
    a = policed
    in_effect(a)
    refused = [
        "registry.example.com.evil.io/x:1",
        "registry.example.com:5000/x:1",  # another port is another registry
        "registry.example.com",  # a Docker Hub name: docker.io/library/registry.example.com
        "mirror.example.com/ml/modelserver-evil:1",
    ]
    for i, image in enumerate(refused):
        msg = refusal(a, md(f"refused-{i}", image=image))
        assert msg is not None and f"spec.image: {image} is not from an allowed registry" in msg, image
    admitted = [
        "registry.example.com/x:1",
        "mirror.example.com/ml/modelserver:1.2",
        "mirror.example.com/ml/modelserver@sha256:" + "0" * 64,
        "mirror.example.com/ml/modelserver/cpu:1",
    ]
    for i, image in enumerate(admitted):
        assert refusal(a, md(f"admitted-{i}", image=image)) is None, image


def test_an_author_may_hand_their_pods_only_the_secrets_and_claims_they_may_read_themselves(
    kube: Kube, policed: Author
) -> None:
    """The operator's pods would mount a Secret, a ConfigMap or a claim the author names: the policy
    asks the apiserver's authorizer whether the *author* may get it, for every reference they add."""
    a = policed
    in_effect(a)
    storage = {"secretRef": {"name": "payments-db"}}
    s3 = {"name": "m", "uri": "s3://models/m/", "storage": storage}
    msg = refusal(a, md("secret", model=s3))
    assert msg is not None and "spec.model.storage.secretRef: you may not read Secret payments-db" in msg
    ca = {"name": "m", "uri": "s3://models/m/", "storage": {"caBundle": {"configMapRef": {"name": "pki"}}}}
    msg = refusal(a, md("ca", model=ca))
    assert (
        msg is not None and "spec.model.storage.caBundle.configMapRef: you may not read ConfigMap pki" in msg
    )
    msg = refusal(a, md("claim", model={"name": "m", "uri": "pvc://payments-data/models/m"}))
    assert msg is not None and "spec.model.uri: you may not read PersistentVolumeClaim payments-data" in msg
    fallback = {"model": {"uri": "pvc://payments-data/small"}}
    msg = refusal(a, md("fb", fallback=fallback))
    assert msg is not None and "you may not read PersistentVolumeClaim payments-data" in msg

    # granted get on exactly that Secret and that claim, the author may use them
    pvc = {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}
    rules = [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["payments-db"], "verbs": ["get"]},
        {**pvc, "resourceNames": ["payments-data"]},
    ]
    grant(kube, a.namespace, subject=("author", a.namespace), rules=rules, role="reads")
    deadline = time.monotonic() + 10  # the RBAC authorizer sees the new binding a moment later
    while refusal(a, md("secret", model=s3)) is not None:
        assert time.monotonic() < deadline, "the granted Secret is still refused"
        time.sleep(0.2)
    assert refusal(a, md("claim", model={"name": "m", "uri": "pvc://payments-data/models/m"})) is None

    # the grant taken back: a new reference is refused again, but an update that keeps a reference it
    # does not add is not asked about (the operator's own patches of a ModelDeployment are such updates)
    kube.api.delete(f"/apis/rbac.authorization.k8s.io/v1/namespaces/{a.namespace}/roles/reads")
    deadline = time.monotonic() + 10
    while refusal(a, md("secret-2", model=s3)) is None:
        a.api.delete(f"{MD_PATH.format(ns=a.namespace)}/secret-2")
        assert time.monotonic() < deadline, "the revoked Secret is still taken"
        time.sleep(0.2)
    a.api.request(
        "PATCH",
        f"{MD_PATH.format(ns=a.namespace)}/secret",
        body={"metadata": {"annotations": {"team": "payments"}}},
        content_type="application/merge-patch+json",
    )
