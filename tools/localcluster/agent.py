"""The process node agent: a minimal kubelet for pods of this repository's images.

It watches pods bound to any node, takes those whose image maps to a local command
(:mod:`localcluster.images`), and for each one:

* gives it a pod IP of the cluster's pod network (:mod:`localcluster.podnet`: ``10.244.N.0/24``, added to
  the one network namespace all pods share) and starts every container as a local process inside that
  namespace (``ip netns exec``, own process group) with the container's command, args and env (values
  from fields, Secrets and ConfigMaps resolved; ``KUBECONFIG`` a kubeconfig with the pod's service-account
  token), told to bind to the pod IP; a container of an unmapped image (a sidecar) is reported running
  and not run;
* probes it (startup, readiness, liveness: httpGet, tcpSocket, exec) and writes pod status like a
  kubelet: phase, podIP, container states, restart counts, ``ContainersReady`` and ``Ready``, where
  ``Ready`` also requires every ``spec.readinessGates`` condition to be True;
* restarts a crashed container (per restartPolicy, with back-off) and counts the restart;
* provides ``downwardAPI`` volumes (:mod:`localcluster.volumes`): written the kubelet's atomic way under
  ``<pod dir>/volumes/<name>``, rewritten whenever the watch brings a change of the pod's labels or
  annotations, and bind-mounted at the container's ``mountPath`` in a private mount namespace of the
  container (:mod:`localcluster.podmount`); removed with the pod;
* on deletion runs the preStop hook, sends SIGTERM, waits the grace period, SIGKILLs what is left and
  removes the pod object.

Pods of other images are left to kwok's simulated stages.

This module watches the pods and hands each one to a :class:`~localcluster.pod_runner.PodRunner`, which
runs it; :mod:`localcluster.container_env` makes its containers' environment.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import urllib3
import yaml

from . import images
from .kubeapi import KubeAPI, KubeError
from .pod_runner import PodRunner
from .podnet import PodNetwork
from .volumes import keep_paths

log = logging.getLogger("localcluster.agent")

#: a file ``<agent state dir>/unreachable-nodes/<node>`` cuts that node's "kubelet" off from the apiserver
#: (:func:`localcluster.faults.node_unreachable`): its pods keep running, nothing is reported for them
UNREACHABLE_NODES = "unreachable-nodes"


class IPPool:
    def __init__(self, addresses: list[str]) -> None:
        self._free = list(addresses)
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            if not self._free:
                raise RuntimeError("pod network exhausted")
            return self._free.pop(0)

    def give_back(self, ip: str) -> None:
        with self._lock:
            self._free.append(ip)


class ProcessRegistry:
    """Pids of live pod processes on disk, so ``localcluster down`` can stop them even if we die."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int) -> None:
        (self.dir / str(pid)).touch()

    def remove(self, pid: int) -> None:
        (self.dir / str(pid)).unlink(missing_ok=True)


class NodeAgent:
    def __init__(self, kubeconfig: Path, state_dir: Path, net: PodNetwork) -> None:
        self.api = KubeAPI(kubeconfig)
        self.net = net
        port = self.api.server.rsplit(":", 1)[1]
        self.server_for_pods = f"https://{net.host_ip}:{port}"
        self.ca_file = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"][
            "certificate-authority"
        ]
        self.state_dir = state_dir
        self.ips = IPPool(net.pod_ips())
        self.procs = ProcessRegistry(state_dir / "procs")
        # host paths a pod's processes need even under a volume mounted over a parent (e.g. /tmp)
        self.keep = keep_paths([state_dir.parent])
        self.runners: dict[str, PodRunner] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def unreachable(self, node: str) -> bool:
        """Whether ``node`` is played as cut off from the apiserver (a file, so a test can flip it)."""
        return bool(node) and (self.state_dir / UNREACHABLE_NODES / node).exists()

    def forget(self, runner: PodRunner) -> None:
        with self._lock:
            if self.runners.get(runner.uid) is runner:
                del self.runners[runner.uid]
        self.net.remove_pod_ip(runner.ip)
        self.ips.give_back(runner.ip)

    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        if not pod["spec"].get("nodeName") or not images.is_agent_pod(pod):
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            runner = self.runners.get(uid)
            if event_type == "DELETED":
                if runner:
                    runner.vanish()
                return
            if runner is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    return
                if pod["metadata"].get("deletionTimestamp"):
                    # Never started here (e.g. agent restart): just finish the deletion.
                    with contextlib.suppress(KubeError):
                        self.api.delete(
                            f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                        )
                    return
                runner = PodRunner(self, pod)
                self.runners[uid] = runner
                runner.start()
            else:
                runner.update(pod)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods") or {}
                for pod in listing.get("items", []):
                    self.handle("ADDED", pod)
                rv = listing["metadata"]["resourceVersion"]
                while not self._stopping.is_set():
                    for ev in self.api.watch("/api/v1/pods", rv, timeout_s=300):
                        if ev["type"] == "ERROR":
                            raise KubeError(
                                ev["object"].get("code", 500), ev["object"], "WATCH", "/api/v1/pods"
                            )
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            self.handle(ev["type"], ev["object"])
                        if self._stopping.is_set():
                            break
            except (KubeError, urllib3.exceptions.HTTPError, OSError) as exc:
                if self._stopping.is_set():
                    break
                log.warning("watch restarted: %s", exc)
                time.sleep(0.5)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            runners = list(self.runners.values())
        for r in runners:
            r.vanish()
        for r in runners:
            r.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localcluster agent")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--pod-network", type=int, required=True, help="index of the cluster's PodNetwork")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    agent = NodeAgent(args.kubeconfig, args.state_dir, PodNetwork(args.pod_network))

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping pods", signum)
        agent.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
