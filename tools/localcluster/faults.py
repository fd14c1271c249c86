"""Faults played on the local cluster's own processes, for the chaos tests (tests/chaos/).

Only processes that ``up`` started with the environment it was given and no extra variables (etcd,
kube-apiserver, Prometheus) can be killed and started again here: the same command line, the same log
file (appended), the same working directory, a new session; the cluster record gets the new pid, so that
``down`` stops the restarted process and a later ``running_cluster`` still finds every process alive.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from pathlib import Path

from .cluster import Cluster, _alive
from .state import ClusterRecord

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
