"""Faults played on the local cluster's own processes and network, for the chaos tests (tests/chaos/).

:func:`partitioned_from_apiserver` cuts a host process that talks to the apiserver through the pod
network's host address (``apiserver_url_pods``; :func:`kubeconfig_via_pod_network` writes such a
kubeconfig) off from it with nftables: every packet between that address's apiserver port and the host is
dropped, and the established connections are destroyed (``ss -K``) so that watches break as they do when
a partition outlasts their timeouts. Everything else (the node agent, the controllers, kube-proxy and the
pods in the pod network, the tests' own clients on 127.0.0.1) keeps talking to the apiserver.

:func:`node_unreachable` plays a node whose kubelet is cut off from the apiserver: its lease is no longer
renewed, so kube-controller-manager marks the node NotReady and its pods not ready after its grace period
(50 s), and the node agent stops reporting for the node's pods, whose containers run on.

Only processes that ``up`` started with the environment it was given and no extra variables (etcd,
kube-apiserver, Prometheus) can be killed and started again here: the same command line, the same log
file (appended), the same working directory, a new session; the cluster record gets the new pid, so that
``down`` stops the restarted process and a later ``running_cluster`` still finds every process alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from .agent import UNREACHABLE_NODES
from .cluster import Cluster, _alive
from .kubeapi import KubeAPI
from .state import ClusterRecord, Layout

RESTARTABLE = ("etcd", "kube-apiserver", "prometheus")


class FaultError(RuntimeError):
    """The fault could not be played (an unknown process, one that would not die)."""


def _record(cluster: Cluster, name: str) -> tuple[ClusterRecord, int]:
    rec = ClusterRecord.load(cluster.state_dir)
    if rec is None:
        raise FaultError(f"no cluster record in {cluster.state_dir}")
    for i, p in enumerate(rec.processes):
        if p.name == name:
            return rec, i
    raise FaultError(f"no process {name!r} in the cluster record")


def kill(cluster: Cluster, name: str, timeout: float = 10.0) -> None:
    """SIGKILL ``name`` and wait until it is gone."""
    rec, i = _record(cluster, name)
    pid = rec.processes[i].pid
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            raise FaultError(f"{name} (pid {pid}) still alive {timeout:g}s after SIGKILL")
        time.sleep(0.05)


def start_again(cluster: Cluster, name: str) -> int:
    """Start ``name`` again with its recorded command; the new pid."""
    if name not in RESTARTABLE:
        raise FaultError(f"{name} is not restartable here (only {', '.join(RESTARTABLE)})")
    rec, i = _record(cluster, name)
    p = rec.processes[i]
    with open(p.log, "ab") as logf:
        proc = subprocess.Popen(
            p.command,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=str(Path(cluster.state_dir)),
        )
    p.pid = proc.pid
    rec.save()
    return proc.pid


def pause(cluster: Cluster, name: str) -> int:
    """SIGSTOP ``name`` (it keeps its sockets: clients hang instead of being refused); its pid."""
    rec, i = _record(cluster, name)
    pid = rec.processes[i].pid
    os.kill(pid, signal.SIGSTOP)
    return pid


def resume(cluster: Cluster, name: str) -> None:
    rec, i = _record(cluster, name)
    os.kill(rec.processes[i].pid, signal.SIGCONT)


# ------------------------------------------------------------------------------------ the network
NFT_TABLE = "localcluster_chaos"


def _apiserver_pod_address(cluster: Cluster) -> tuple[str, int]:
    rec = ClusterRecord.load(cluster.state_dir)
    url = urlsplit(rec.apiserver_url_pods if rec else "")
    if not url.hostname or not url.port:
        raise FaultError(
            f"the cluster in {cluster.state_dir} records no apiserver address on the pod network"
        )
    return url.hostname, url.port


def kubeconfig_via_pod_network(cluster: Cluster, path: Path) -> Path:
    """The admin kubeconfig with the apiserver at its pod-network host address (which its certificate
    names): a process given it can be partitioned by :func:`partitioned_from_apiserver`."""
    host, port = _apiserver_pod_address(cluster)
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for entry in cfg.get("clusters", []):
        entry["cluster"]["server"] = f"https://{host}:{port}"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _nft(script: str) -> None:
    res = subprocess.run(["nft", "-f", "-"], input=script, text=True, capture_output=True, check=False)
    if res.returncode != 0:
        raise FaultError(f"nft refused the rules ({res.returncode}): {res.stderr.strip()}")


@contextmanager
def partitioned_from_apiserver(cluster: Cluster) -> Iterator[None]:
    """While inside: the host's processes that reach the apiserver at its pod-network host address get
    no packet through (new connections hang, as in a real partition), and the connections they had are
    gone. Healed on leaving, whatever happened inside."""
    host, port = _apiserver_pod_address(cluster)
    _nft(
        f"""table inet {NFT_TABLE} {{
  chain output {{
    type filter hook output priority 0; policy accept;
    ip daddr {host} tcp dport {port} drop
    ip saddr {host} tcp sport {port} ip daddr {host} drop
  }}
}}
"""
    )
    try:
        res = subprocess.run(
            ["ss", "-K", "dst", host, "dport", "=", str(port)], capture_output=True, text=True, check=False
        )
        if res.returncode != 0:
            raise FaultError(
                f"ss -K could not destroy the connections to {host}:{port}: {res.stderr.strip()}"
            )
        yield
    finally:
        _nft(f"delete table inet {NFT_TABLE}\n")


# ------------------------------------------------------------------------------------ nodes
#: how often the leases of the nodes that stay up are renewed while kwok is frozen (kwok: every 10 s;
#: kube-controller-manager's grace period is 50 s)
LEASE_RENEW_S = 5.0


def _micro_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())


@contextmanager
def node_unreachable(cluster: Cluster, node: str) -> Iterator[None]:
    """While inside: ``node`` is cut off from the apiserver. kwok, which renews every fake node's lease,
    is frozen (SIGSTOP) and the other nodes' leases are renewed here instead, so only ``node``'s lease
    runs out (kube-controller-manager then marks it NotReady and its pods not ready); the node agent
    reports nothing for ``node``'s pods, whose containers run on. Healed on leaving: kwok renews and marks
    the node Ready, the agent reports its pods again. Raises :class:`FaultError` when a renewal of another
    node's lease failed (that node may have gone NotReady too)."""
    api = KubeAPI(Path(cluster.kubeconfig))
    names = [n["metadata"]["name"] for n in (api.get("/api/v1/nodes") or {}).get("items", [])]
    if node not in names:
        api.close()
        raise FaultError(f"no node {node!r} (nodes: {', '.join(names)})")
    flag = Layout(Path(cluster.state_dir)).agent_dir / UNREACHABLE_NODES / node
    flag.parent.mkdir(parents=True, exist_ok=True)
    stop, failures = threading.Event(), []

    def renew_the_others() -> None:
        while not stop.wait(LEASE_RENEW_S):
            for other in names:
                if other == node:
                    continue
                try:
                    api.strategic_patch(
                        f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{other}",
                        {"spec": {"renewTime": _micro_now()}},
                    )
                except Exception as e:  # recorded, raised on leaving
                    failures.append(f"{other}: {e}")

    flag.touch()
    pause(cluster, "kwok")
    renewer = threading.Thread(target=renew_the_others, name="lease-renewer", daemon=True)
    renewer.start()
    try:
        yield
    finally:
        stop.set()
        renewer.join(LEASE_RENEW_S + 30)
        resume(cluster, "kwok")
        flag.unlink(missing_ok=True)
        api.close()
    if failures:
        raise FaultError(f"renewing the other nodes' leases failed: {failures[:3]}")
