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


def author(kube: Kube, namespace: str, where: Path) -> Author:
    """The ModelDeployment author of ``namespace``: its ServiceAccount, Role, binding and token."""
    ns = namespace
    kube.api.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "author"}})
    kube.api.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        {"metadata": {"name": "modeldeployment-author"}, "rules": AUTHOR_RULES},
    )
    kube.api.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        {
            "metadata": {"name": "modeldeployment-author"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "modeldeployment-author",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "author", "namespace": ns}],
        },
    )
    answer = kube.api.create(
        f"/api/v1/namespaces/{ns}/serviceaccounts/author/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    assert answer is not None
    admin = yaml.safe_load(kube.cluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": f"author-{ns}", "user": {"token": answer["status"]["token"]}}],
        "contexts": [
            {"name": "author", "context": {"cluster": admin["clusters"][0]["name"], "user": f"author-{ns}"}}
        ],
        "current-context": "author",
    }
    path = where / f"author-{ns}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    api = KubeAPI(path)
    # the apiserver's RBAC authorizer learns of a new RoleBinding through its own watch, a moment later
    wait_for(
        lambda: api.get(f"/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments") is not None,
        timeout=10,
        interval=0.1,
        what=f"the author's rights in {ns}",
    )
    return Author(ns, api)
