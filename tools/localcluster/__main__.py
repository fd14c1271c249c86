"""``python -m localcluster up|down|status|demo|agent`` — the local Kubernetes cluster."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .state import state_dir_from_env


def _cmd_up(state_dir: Path) -> int:
    from .cluster import ClusterError, up

    start = time.monotonic()
    try:
        cluster = up(state_dir)
    except ClusterError as exc:
        print(f"localcluster: start failed: {exc}", file=sys.stderr)
        return 1
    print(f"cluster ready in {time.monotonic() - start:.1f}s")
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "agent":
        from .agent import main as agent_main

        return agent_main(argv[1:])
    p = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    p.add_argument("command", choices=["up", "down", "status", "demo"])
    p.add_argument("--state-dir", type=Path, default=None, help="default: $LOCALCLUSTER_DIR or .localcluster")
    args = p.parse_args(argv)
    state_dir = (args.state_dir or state_dir_from_env()).resolve()
    return {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status, "demo": _cmd_demo}[args.command](
        state_dir
    )


if __name__ == "__main__":
    raise SystemExit(main())
