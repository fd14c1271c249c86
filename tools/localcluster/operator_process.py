"""The operator as a process of its own on the local cluster: ``python -m modeldeploy``, standalone (no
leader election), with the cluster's admin kubeconfig -- as the e2e suite, the benchmarks and
``make demo`` run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from .cluster import Cluster, free_port


def notification_key_file(cluster: Cluster) -> Path:
    """The operator's notification signing key (32 random bytes, made once per cluster): what a chart
    install mounts from a Secret; tests derive a namespace's key from it to check signatures."""
    path = cluster.state_dir / "notification-signing.key"
    if not path.exists():
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
    return path


def operator_env(
    cluster: Cluster,
    *,
    metrics_port: int,
    health_port: int,
    base: Mapping[str, str] | None = None,
    kubeconfig: Path | None = None,
) -> dict[str, str]:
    """The operator's environment: ``base`` (default: this process's) with ``kubeconfig`` (default: the
    cluster's admin kubeconfig) and
    Prometheus, the node cache under the cluster's state (both nodes are this machine), and its ports on
    127.0.0.1 (0: any free port)."""
    return {
        **(os.environ if base is None else base),
        "KUBECONFIG": str(kubeconfig or cluster.kubeconfig),
        "MODELDEPLOY_PROMETHEUS_URL": cluster.prometheus_url,
        "MODELDEPLOY_NODE_CACHE_PATH": str(cluster.state_dir / "node-cache"),
        "MODELDEPLOY_STANDALONE": "1",
        "MODELDEPLOY_BIND_HOST": "127.0.0.1",
        "MODELDEPLOY_METRICS_PORT": str(metrics_port),
        "MODELDEPLOY_HEALTH_PORT": str(health_port),
        "MODELDEPLOY_NOTIFICATION_SIGNING_KEY_FILE": str(notification_key_file(cluster)),
    }


class OperatorNotLive(RuntimeError):
    """The operator process exited, or its liveness endpoint did not answer in time."""


class OperatorProcess:
    """A started operator process; its output goes to ``log``."""

    def __init__(
        self,
        cluster: Cluster,
        log: Path,
        *,
        base_env: Mapping[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.log = log
        self.metrics_port, self.health_port = free_port(), free_port()
        env = operator_env(
            cluster,
            metrics_port=self.metrics_port,
            health_port=self.health_port,
            base=base_env,
            kubeconfig=kubeconfig,
        )
        with log.open("ab") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "modeldeploy"], env=env, stdout=f, stderr=subprocess.STDOUT
            )

    def wait_live(self, timeout: float = 60) -> OperatorProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise OperatorNotLive(f"the operator exited ({self.proc.returncode}); see {self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise OperatorNotLive(f"the operator is not live after {timeout:.0f} s; see {self.log}")

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def stop(self, timeout: float = 30) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)

    def log_tail(self, lines: int = 60) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
