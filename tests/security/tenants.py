"""ModelDeployment authors as a platform team sets them up: a ServiceAccount per team namespace, a Role
that lets it manage ModelDeployments (and read their Events) there and nothing else, and a kubeconfig
with its own token (TokenRequest) -- so a test acts as that author, with that author's rights only."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from localcluster.kubeapi import KubeAPI
from localcluster.testing import Kube, wait_for
from modeldeploy.kube import KubeError

AUTHOR_RULES = [
    {
        "apiGroups": ["modeldeploy.io"],
        "resources": ["modeldeployments"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
]


@dataclass
class Author:
    namespace: str
    api: KubeAPI

    def denied(self, method: str, path: str, body: dict[str, Any] | None = None) -> bool:
        """Whether the apiserver refuses this author the call (403), as RBAC should."""
        try:
            kw: dict[str, Any] = {"body": body} if body is not None else {}
            if method == "PATCH":
                kw["content_type"] = "application/merge-patch+json"
            self.api.request(method, path, **kw)
        except KubeError as e:
            return e.status == 403
        return False


def account(
    kube: Kube, namespace: str, name: str, rules: list[dict[str, Any]], where: Path, probe: str
) -> KubeAPI:
    """A ServiceAccount ``name`` in ``namespace`` with a Role of ``rules`` there, and a client acting
    with its own token (TokenRequest); returns once the apiserver lets it GET ``probe``."""
    kube.api.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": name}})
    grant(kube, namespace, subject=(name, namespace), rules=rules)
    return token_client(kube, namespace, name, where, probe)


def grant(
    kube: Kube, namespace: str, *, subject: tuple[str, str], rules: list[dict[str, Any]], role: str = ""
) -> None:
    """A Role of ``rules`` in ``namespace`` (named ``role``, default the subject's name), bound to
    ServiceAccount ``subject`` (its name, its namespace)."""
    sa, sa_ns = subject
    name = role or sa
    kube.api.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {"metadata": {"name": name}, "rules": rules},
    )
    kube.api.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": sa_ns}],
        },
    )


def token_client(kube: Kube, namespace: str, name: str, where: Path, probe: str) -> KubeAPI:
    """A client with a fresh token of ServiceAccount ``namespace/name``, once it may GET ``probe``."""
    ns = namespace
    answer = kube.api.create(
        f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert answer is not None
    admin = yaml.safe_load(kube.cluster.kubeconfig.read_text())
    user = f"{name}-{ns}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": user, "user": {"token": answer["status"]["token"]}}],
        "contexts": [{"name": user, "context": {"cluster": admin["clusters"][0]["name"], "user": user}}],
        "current-context": user,
    }
    path = where / f"{user}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = KubeAPI(path)
    # the apiserver's RBAC authorizer learns of a new RoleBinding through its own watch, a moment later
    wait_for(lambda: api.get(probe) is not None, timeout=10, interval=0.1, what=f"the rights of {user}")
    return api


def author(kube: Kube, namespace: str, where: Path) -> Author:
    """The ModelDeployment author of ``namespace``: its ServiceAccount, Role, binding and token."""
    probe = f"/apis/modeldeploy.io/v1alpha1/namespaces/{namespace}/modeldeployments"
    return Author(namespace, account(kube, namespace, "author", AUTHOR_RULES, where, probe))
