"""Helpers for the chart's integration tests: helm against the test cluster, the operator pod the node
agent runs, the apiserver's audit log, ``kubectl auth can-i`` as the chart's ServiceAccount.

``install_release`` is what an e2e scenario needs to run under the chart's credentials (issue 5's
scenario 1 can use it as it is): it installs the chart, waits for the operator, and yields a
:class:`Release`; ``uninstall`` removes it.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localcluster.audit import completed

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "modeldeploy"
MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}"
CRDS = ("modeldeployments.modeldeploy.io", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev")
# Every refusal the operator can log names itself: the apiserver's 403 carries reason Forbidden
# ("... is forbidden: User ..."), and kopf says "Not enough permissions". A bare "403" is not a
# marker: it turns up inside millisecond timestamps and the random peering priority.
REFUSAL = re.compile(r"forbidden|not enough permissions", re.IGNORECASE)


def refusal_lines(log: str) -> list[str]:
    """The operator log's lines that report the apiserver refusing the operator something."""
    return [line for line in log.splitlines() if REFUSAL.search(line)]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


class Helm:
    """The pinned helm binary with the test cluster's kubeconfig and a private helm home."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        from localcluster.cluster import binaries_dir

        self.bin = str(binaries_dir() / "helm")
        self.env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        res = subprocess.run([self.bin, *args], capture_output=True, text=True, env=self.env, timeout=timeout)
        if check and res.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}"
            )
        return res


@dataclass
class Release:
    name: str
    namespace: str  # where the operator runs
    watched: list[str]  # [] = cluster mode (rbac.clusterWide=true; the chart's default is namespaced)
    values: list[str] = field(default_factory=list)
    notes: str = ""

    @property
    def fullname(self) -> str:
        return self.name if "modeldeploy" in self.name else f"{self.name}-modeldeploy"

    @property
    def service_account(self) -> str:
        return self.fullname

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component=operator"


def prometheus_url_for_pods(kube: Any) -> str:
    """The cluster's Prometheus as reachable from pods (local cluster), else the chart's default."""
    from localcluster.state import ClusterRecord

    rec = ClusterRecord.load(Path(kube.cluster.state_dir))
    return (
        rec.prometheus_url_pods
        if rec and rec.prometheus_url_pods
        else "http://prometheus.monitoring.svc:9090"
    )


def create_namespace(kube: Any, name: str, labels: dict[str, str] | None = None) -> None:
    kube.api.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels or {}}})


def delete_namespace(kube: Any, name: str) -> None:
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


def install(helm: Helm, kube: Any, rel: Release, *extra: str) -> Release:
    args = [
        "install", rel.name, str(CHART), "--namespace", rel.namespace,
        "--set", f"operator.prometheusUrl={prometheus_url_for_pods(kube)}",
        # short keep-alives: a replaced operator pod's peer entry expires quickly
        "--set", "operator.peering.lifetime=10",
        *(
            ["--set", "watchNamespaces={" + ",".join(rel.watched) + "}"]
            if rel.watched
            else ["--set", "rbac.clusterWide=true"]
        ),
        *rel.values, *extra,
        "--wait", "--timeout", "180s",
    ]  # fmt: skip
    res = helm(*args)
    rel.notes = res.stdout
    return rel


def operator_pods(kube: Any, rel: Release) -> list[dict[str, Any]]:
    return [p for p in kube.pods(rel.namespace, rel.selector) if not p["metadata"].get("deletionTimestamp")]


def running_operator(kube: Any, rel: Release) -> dict[str, Any] | None:
    pods = operator_pods(kube, rel)
    if len(pods) != 1:
        return None
    pod = pods[0]
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])
    return pod if pod["status"].get("phase") == "Running" and ready else None


def pod_dir(kube: Any, pod: dict[str, Any]) -> Path | None:
    """Where the local node agent keeps a pod's logs and service-account kubeconfig (None elsewhere)."""
    meta = pod["metadata"]
    d = (
        Path(kube.cluster.state_dir)
        / "agent"
        / "pods"
        / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
    )
    return d if d.is_dir() else None


def operator_log(kube: Any, pod: dict[str, Any]) -> str:
    d = pod_dir(kube, pod)
    if d is not None:
        return (d / "operator.log").read_text(errors="replace") if (d / "operator.log").exists() else ""
    res = kube.kubectl("logs", "-n", pod["metadata"]["namespace"], pod["metadata"]["name"], check=False)
    return res.stdout


def token_subject(kube: Any, pod: dict[str, Any]) -> str | None:
    """The ``sub`` of the ServiceAccount token the node agent handed the pod (local cluster only)."""
    import yaml

    d = pod_dir(kube, pod)
    if d is None or not (d / "serviceaccount.kubeconfig").exists():
        return None
    cfg = yaml.safe_load((d / "serviceaccount.kubeconfig").read_text())
    token = cfg["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return str(claims["sub"])


def is_local(kube: Any) -> bool:
    """The test cluster is a local one (not E2E_KUBECONFIG): agent pod dirs and the audit log exist."""
    return (Path(kube.cluster.state_dir) / "cluster.json").exists()


def audit_log(kube: Any) -> Path | None:
    p = Path(kube.cluster.state_dir) / "logs" / "audit.log"
    return p if p.exists() else None


def audit_events_of(kube: Any, user: str) -> list[dict[str, Any]]:
    """Audit events (the local cluster logs writes) whose user is ``user``."""
    path = audit_log(kube)
    if path is None:
        return []
    return [ev for ev in completed(path) if (ev.get("user") or {}).get("username") == user]


def rbac_refusals(kube: Any, user: str) -> list[dict[str, Any]]:
    """The audit events of ``user`` that RBAC refused (403), but for events about a namespace that is
    already being deleted (a test's teardown, not the chart's RBAC)."""
    return [
        e
        for e in audit_events_of(kube, user)
        if (e.get("responseStatus") or {}).get("code") == 403
        and "being terminated" not in (e.get("responseStatus") or {}).get("message", "")
    ]


def can_i(
    kube: Any, user: str, verb: str, resource: str, namespace: str | None = None, subresource: str = ""
) -> bool:
    """``kubectl auth can-i`` as ``user``; ``resource`` may be ``TYPE/NAME``; ``namespace`` None: ``-A``."""
    args = ["auth", "can-i", verb, resource, f"--as={user}"]
    if subresource:
        args.append(f"--subresource={subresource}")
    args += ["-n", namespace] if namespace else ["-A"]
    res = kube.kubectl(*args, check=False)
    answer = res.stdout.strip()
    assert answer in ("yes", "no"), f"kubectl {' '.join(args)}: {res.stdout} {res.stderr}"
    return answer == "yes"


def noop_md(name: str, replicas: int = 1) -> dict[str, Any]:
    """A ModelDeployment of the server's built-in noop model (real server process, no torch)."""
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "echo", "version": "1", "uri": "noop://chart", "format": "noop"},
            "replicas": replicas,
            "resources": {"cpu": "100m", "memory": "128Mi"},
            "batching": {"maxSequenceLength": 512, "buckets": [32, 128, 512]},
        },
    }


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return {}


def md_ready(kube: Any, ns: str, name: str, replicas: int = 1) -> dict[str, Any] | None:
    obj = kube.get(MD_PATH.format(ns=ns, name=name))
    st = (obj or {}).get("status") or {}
    if (
        condition(obj, "Ready").get("status") == "True"
        and st.get("observedGeneration") == (obj or {}).get("metadata", {}).get("generation")
        and st.get("ready") == f"{replicas}/{replicas}"
    ):
        return obj
    return None


def children(kube: Any, ns: str, name: str) -> dict[str, list[dict[str, Any]]]:
    return kube.labelled(ns, f"modeldeploy.io/name={name}", ("deployments", "services", "pdbs", "pods"))


def events_from_operator(kube: Any, ns: str, name: str) -> list[dict[str, Any]]:
    items = (kube.api.get(f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    return [
        e
        for e in items
        if e["involvedObject"].get("name") == name
        and (e.get("source") or {}).get("component") == "modeldeploy"
    ]
