"""Where a local cluster keeps its files, and the record of what it started.

A cluster lives in one state directory (default ``<repo>/.localcluster``): certificates, kubeconfigs,
etcd data, component logs and ``cluster.json``, which records every process started (pid, process group,
command) and every port chosen, so ``down`` can stop exactly what ``up`` started.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = REPO_ROOT / ".localcluster"


def state_dir_from_env() -> Path:
    """The state directory: ``$LOCALCLUSTER_DIR`` or ``<repo>/.localcluster``."""
    return Path(os.environ.get("LOCALCLUSTER_DIR", str(DEFAULT_STATE_DIR))).resolve()


@dataclass
class ProcessRecord:
    name: str
    pid: int
    command: list[str]
    log: str


@dataclass
class ClusterRecord:
    """What ``up`` started; written to ``cluster.json`` as soon as each process starts."""

    state_dir: str
    ports: dict[str, int] = field(default_factory=dict)
    processes: list[ProcessRecord] = field(default_factory=list)
    prometheus_url: str = ""
    apiserver_url: str = ""
    pod_network_index: int = 0  # 0: none created yet
    service_cidr: str = ""  # the pod network's Service ClusterIP range (kube-proxy answers there)
    # The same endpoints as seen from inside the pod network (for pods such as the operator).
    apiserver_url_pods: str = ""
    prometheus_url_pods: str = ""
    gateway_url: str = ""  # the shared Gateway (Traefik on the pod network's anchor address)
    s3_url: str = ""  # the object store (versitygw on the pod network's anchor address)
    node: str = "process"  # who runs pods: the process agent, or "containerd" (the real node, realnode.py)
    bin_dir: str = ""  # the binaries the cluster was started from

    @property
    def path(self) -> Path:
        return Path(self.state_dir) / "cluster.json"

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(self.path)

    @classmethod
    def load(cls, state_dir: Path) -> ClusterRecord | None:
        path = state_dir / "cluster.json"
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        procs = [ProcessRecord(**p) for p in raw.pop("processes", [])]
        return cls(processes=procs, **raw)


@dataclass(frozen=True)
class Layout:
    """File names inside a state directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def prometheus_url_file(self) -> Path:
        return self.root / "prometheus-url"

    @property
    def gateway_url_file(self) -> Path:
        return self.root / "gateway-url"

    @property
    def s3_url_file(self) -> Path:
        return self.root / "s3-url"

    @property
    def s3_credentials_file(self) -> Path:
        """``{"accessKey": ..., "secretKey": ...}`` of the object store's root user (mode 0600)."""
        return self.root / "s3-credentials.json"

    @property
    def s3_data(self) -> Path:
        """The object store's POSIX root: a directory per bucket, a file per object."""
        return self.root / "s3" / "data"

    @property
    def s3_access_log(self) -> Path:
        """The object store's access log: one S3 server-access-log line per request."""
        return self.logs / "s3-access.log"

    @property
    def prometheus_dir(self) -> Path:
        return self.root / "prometheus"

    @property
    def kwok_dir(self) -> Path:
        return self.root / "kwok"

    @property
    def agent_dir(self) -> Path:
        return self.root / "agent"

    def component_kubeconfig(self, name: str) -> Path:
        return self.root / f"{name}.kubeconfig"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"
