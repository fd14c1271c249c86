"""Bring the local cluster up and down.

``up`` starts etcd, kube-apiserver (RBAC, its own CA, service-account keys), kube-controller-manager,
kube-scheduler, kwok (fake GPU and CPU nodes), the process node agent and Prometheus, all on
127.0.0.1 with free ports, and, inside the cluster's pod network namespace, kube-proxy (Service
ClusterIPs, ``10.96.N.0/24``, answer from the host and from pods), Traefik (the Gateway API data
plane: the shared Gateway ``gateway-system/public-gateway`` answers at ``http://10.244.N.254:80``) and
versitygw (an S3 object store at ``http://10.244.N.254:9000``, credentials in ``s3-credentials.json``)
and CoreDNS (the cluster DNS at ``10.244.N.254:53``: ``<service>.<namespace>.svc.cluster.local``),
waits until the cluster is Ready, records everything it started in ``cluster.json`` and returns,
leaving the processes running (its steps, in order, are :mod:`localcluster.bringup`). ``down`` stops
exactly those processes (and any pod process the agent left) and removes the state directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import podnet
from .bringup import BringUp
from .objectstore_config import s3_credentials as s3_credentials  # importable from here, as before bringup.py
from .starter import ClusterError as ClusterError  # likewise
from .starter import Starter
from .state import REPO_ROOT, ClusterRecord, Layout


@dataclass(frozen=True)
class Cluster:
    """A running local cluster, as seen by its users."""

    state_dir: Path
    kubeconfig: Path
    prometheus_url: str
    apiserver_url: str
    service_cidr: str = ""  # the Service ClusterIP range (empty for a cluster not started here)
    gateway_url: str = ""  # the shared Gateway (Traefik), reachable from the host and from pods
    s3_url: str = ""  # the object store (versitygw), reachable from the host and from pods
    prometheus_url_pods: str = ""  # Prometheus as pods (and KEDA) reach it; "" where unknown
    node: str = "process"  # who runs pods: the process agent or the real node ("containerd")


def binaries_dir() -> Path:
    """Where the pinned binaries are (built on first use): ``$LOCALCLUSTER_BIN_DIR`` or the build cache."""
    if env := os.environ.get("LOCALCLUSTER_BIN_DIR"):
        return Path(env)
    out = subprocess.run(
        [str(REPO_ROOT / "tools" / "build-binaries.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def running_cluster(state_dir: Path) -> Cluster | None:
    """The cluster recorded in ``state_dir`` if all its processes are alive."""
    rec = ClusterRecord.load(state_dir)
    if rec is None or not rec.processes or not all(_alive(p.pid) for p in rec.processes):
        return None
    layout = Layout(state_dir)
    return Cluster(
        state_dir,
        layout.kubeconfig,
        rec.prometheus_url,
        rec.apiserver_url,
        rec.service_cidr,
        rec.gateway_url,
        rec.s3_url,
        rec.prometheus_url_pods,
        rec.node,
    )


def keda_enabled() -> bool:
    """Whether ``up`` starts KEDA (and its metrics server behind the aggregation layer): unless
    ``$LOCALCLUSTER_KEDA`` is ``0``."""
    return os.environ.get("LOCALCLUSTER_KEDA", "1") != "0"


def up(
    state_dir: Path,
    *,
    timeout: float = 120.0,
    audit: bool = True,
    keda: bool | None = None,
    node: str = "process",
) -> Cluster:
    """Start a cluster in ``state_dir`` (or return the one running there). ``node``: ``"process"`` (pods
    of our images run as host processes by the node agent) or ``"containerd"`` (a real node: kubelet,
    containerd, runc, CNI and a fake GPU device plugin; see :mod:`localcluster.realnode`)."""
    if node not in ("process", "containerd"):
        raise ValueError(f"node must be 'process' or 'containerd', not {node!r}")
    existing = running_cluster(state_dir)
    if existing is not None:
        return existing
    down(state_dir)  # clear a half-dead previous cluster
    bin_dir = binaries_dir()
    layout = Layout(state_dir)
    for d in (layout.root, layout.pki, layout.logs, layout.kwok_dir, layout.prometheus_dir, layout.agent_dir):
        d.mkdir(parents=True, exist_ok=True)
    rec = ClusterRecord(state_dir=str(state_dir), node=node, bin_dir=str(bin_dir))
    names = ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "prometheus")
    rec.ports = {n: free_port() for n in names}
    rec.save()
    net = podnet.choose(podnet.used_indices())
    net.create()
    rec.pod_network_index = net.index
    rec.service_cidr = net.service_cidr
    rec.save()
    starter = Starter(layout, rec)
    try:
        bringup = BringUp(
            starter,
            layout,
            rec,
            bin_dir,
            net,
            timeout,
            audit=audit,
            keda=keda_enabled() if keda is None else keda,
            node=node,
        )
        bringup.run()
        for note in bringup.notes:
            print(f"localcluster: {note}", file=sys.stderr)
    except BaseException:
        down(state_dir, keep_logs_on_error=True)
        raise
    return Cluster(
        state_dir,
        layout.kubeconfig,
        rec.prometheus_url,
        rec.apiserver_url,
        rec.service_cidr,
        rec.gateway_url,
        rec.s3_url,
        rec.prometheus_url_pods,
        rec.node,
    )


def _signal(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (all we start lead one), and ``pid`` itself."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _stop_pid(pid: int, timeout: float) -> None:
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)


def down(state_dir: Path, *, keep_logs_on_error: bool = False) -> None:
    """Stop everything ``up`` started (agent first, so it stops its pods), then remove the state."""
    rec = ClusterRecord.load(state_dir)
    if rec is not None and rec.node == "containerd":
        from .realnode import teardown

        teardown(state_dir, rec)  # while the pod network and the apiserver are still there
    if rec is not None:
        order = {
            "node-agent": 0,
            "kube-proxy": 1,
            "coredns": 1,
            "traefik": 1,
            "versitygw": 1,
            "prometheus": 1,
            "kwok": 2,
            "kube-scheduler": 3,
            "kube-controller-manager": 4,
            "kube-apiserver": 5,
            "etcd": 6,
        }
        for p in sorted(rec.processes, key=lambda p: order.get(p.name, -1)):
            _stop_pid(p.pid, timeout=15 if p.name == "node-agent" else 10)
    if rec is not None and rec.pod_network_index:
        net = podnet.PodNetwork(rec.pod_network_index)
        for pid in net.pids():
            _stop_pid(pid, timeout=5)
        net.destroy()
    procs_dir = Layout(state_dir).agent_dir / "procs"
    if procs_dir.is_dir():
        for f in procs_dir.iterdir():
            if f.name.isdigit():
                _stop_pid(int(f.name), timeout=5)
    if keep_logs_on_error:
        logs = Layout(state_dir).logs
        if logs.is_dir():
            saved = state_dir.parent / f"{state_dir.name}-failed-logs"
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(logs, saved)
    shutil.rmtree(state_dir, ignore_errors=True)
