"""``python -m localcluster up [--node containerd]|down|status|demo|agent|device-plugin-stop|start``
-- the local Kubernetes cluster (``--node containerd``: a real node, docs/local-cluster.md "The real node";
``device-plugin-stop``/``device-plugin-start``: its fake GPUs go away and come back)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .state import state_dir_from_env


def _cmd_up(state_dir: Path, node: str = "process") -> int:
    from .cluster import ClusterError, up

    start = time.monotonic()
    try:
        cluster = up(state_dir, node=node)
    except ClusterError as exc:
        print(f"localcluster: start failed: {exc}", file=sys.stderr)
        return 1
    print(f"cluster ready in {time.monotonic() - start:.1f}s (pods run by: {cluster.node})")
    print(f"kubeconfig: {cluster.kubeconfig}")
    print(f"prometheus: {cluster.prometheus_url}")
    print(f"service ClusterIPs: {cluster.service_cidr} (kube-proxy answers there, from this host too)")
    print(f"gateway: {cluster.gateway_url} (Traefik; Gateway gateway-system/public-gateway)")
    print(f"object store: {cluster.s3_url} (versitygw; credentials in {state_dir / 's3-credentials.json'})")
    print(f"use it with: kubectl --kubeconfig {cluster.kubeconfig} get nodes")
    return 0


def _cmd_down(state_dir: Path) -> int:
    from .cluster import down

    down(state_dir)
    print(f"localcluster stopped; removed {state_dir}")
    return 0


def _cmd_status(state_dir: Path) -> int:
    from .cluster import running_cluster

    cluster = running_cluster(state_dir)
    if cluster is None:
        print("no local cluster running")
        return 1
    print(f"kubeconfig: {cluster.kubeconfig}\nprometheus: {cluster.prometheus_url}")
    print(f"gateway: {cluster.gateway_url}")
    print(f"object store: {cluster.s3_url}")
    return 0


def _cmd_demo(state_dir: Path) -> int:
    from .demo import run

    return run(state_dir)


def _cmd_device_plugin(state_dir: Path, action: str) -> int:
    from .realnode import start_device_plugin, stop_device_plugin

    (stop_device_plugin if action == "stop" else start_device_plugin)(state_dir)
    print(f"device plugin: {action}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "agent":
        from .agent import main as agent_main

        return agent_main(argv[1:])
    p = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    p.add_argument(
        "command", choices=["up", "down", "status", "demo", "device-plugin-stop", "device-plugin-start"]
    )
    p.add_argument(
        "--node",
        choices=["process", "containerd"],
        default="process",
        help="up: who runs pods: the process agent (default) or a real node (kubelet + containerd)",
    )
    p.add_argument("--state-dir", type=Path, default=None, help="default: $LOCALCLUSTER_DIR or .localcluster")
    args = p.parse_args(argv)
    state_dir = (args.state_dir or state_dir_from_env()).resolve()
    if args.command == "up":
        return _cmd_up(state_dir, args.node)
    if args.command.startswith("device-plugin-"):
        return _cmd_device_plugin(state_dir, args.command.removeprefix("device-plugin-"))
    return {"down": _cmd_down, "status": _cmd_status, "demo": _cmd_demo}[args.command](state_dir)


if __name__ == "__main__":
    raise SystemExit(main())
