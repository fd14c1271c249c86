"""``make bench-operator``: the operator at scale on the local cluster.

Creates N ModelDeployments (default 300) whose pods kwok simulates (a non-agent image, so no real
server processes), and measures, in one run:

* the time from the first create until every ModelDeployment has its Deployment and until every one
  reports ``Ready=True``;
* writes at steady state: the operator's writes to our objects (from the apiserver's audit log) and
  its reconciles (its own metric), over an idle window after everything is Ready and after touching
  every ModelDeployment's metadata (a reconcile each, nothing to change): writes per reconcile;
* the operator's resident memory at the end.

Results go to ``bench/results/operator.json``. Nothing here is asserted; it is a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from localcluster.audit import writes_by_agents
from localcluster.cluster import binaries_dir, down, up
from localcluster.kubeapi import KubeAPI
from localcluster.promtext import sample_sum
from localcluster.state import REPO_ROOT

RESULTS = REPO_ROOT / "bench" / "results" / "operator.json"
OPERATOR_UAS = ("modeldeploy-operator", "kopf/")
OUR_RESOURCES = {"deployments", "services", "poddisruptionbudgets", "pods", "modeldeployments"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def md(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1", "uri": "noop://bench", "format": "noop"},
            "image": "registry.invalid/simulated-server:1",  # not an agent image: kwok simulates the pod
            "replicas": 1,
            "resources": {"gpu": 0, "cpu": "100m", "memory": "128Mi"},
        },
    }


def operator_writes(audit_log: Path, since: float) -> int:
    events = writes_by_agents(audit_log, OPERATOR_UAS, OUR_RESOURCES)
    return sum(
        1 for ev in events if _epoch(ev.get("requestReceivedTimestamp") or "1970-01-01T00:00:00Z") >= since
    )


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.operator")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--idle-window", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still clean up the cluster

    state = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    cluster = up(state / "cluster")
    kubectl = str(binaries_dir() / "kubectl")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    op: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [kubectl, "apply", "--server-side", "-f", str(REPO_ROOT / "crds")],
            env=env,
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                kubectl,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/modeldeployments.modeldeploy.io",
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        metrics_port = free_port()
        op_env = {
            **env,
            "MODELDEPLOY_STANDALONE": "1",
            "MODELDEPLOY_BIND_HOST": "127.0.0.1",
            "MODELDEPLOY_METRICS_PORT": str(metrics_port),
            "MODELDEPLOY_HEALTH_PORT": str(free_port()),
            "MODELDEPLOY_PROMETHEUS_URL": cluster.prometheus_url,
        }
        log = open(state / "operator.log", "wb")  # noqa: SIM115
        op = subprocess.Popen(
            [sys.executable, "-m", "modeldeploy"], env=op_env, stdout=log, stderr=subprocess.STDOUT
        )
        api = KubeAPI(cluster.kubeconfig)
        base = "/apis/modeldeploy.io/v1alpha1/namespaces/default/modeldeployments"

        t0 = time.monotonic()
        docs = "\n---\n".join(json.dumps(md(f"bench-{i:04d}")) for i in range(args.count))
        subprocess.run(
            [kubectl, "apply", "-f", "-"], input=docs.encode(), env=env, check=True, capture_output=True
        )
        t_created = time.monotonic() - t0
        print(f"created {args.count} ModelDeployments in {t_created:.1f}s", flush=True)

        t_deployments = t_ready = None
        while time.monotonic() - t0 < args.timeout:
            deps = (api.get("/apis/apps/v1/namespaces/default/deployments") or {}).get("items", [])
            names = {d["metadata"]["labels"].get("modeldeploy.io/name") for d in deps}
            if t_deployments is None and len(names) >= args.count:
                t_deployments = time.monotonic() - t0
                print(f"all Deployments exist after {t_deployments:.1f}s", flush=True)
            items = (api.get(base) or {}).get("items", [])
            ready = sum(
                any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (m.get("status") or {}).get("conditions") or []
                )
                for m in items
            )
            if ready >= args.count:
                t_ready = time.monotonic() - t0
                print(f"all Ready after {t_ready:.1f}s", flush=True)
                break
            time.sleep(2)
        if t_ready is None:
            print(f"not all Ready within {args.timeout:.0f}s", flush=True)

        # Steady state: what does the operator write while nothing changes?
        time.sleep(5)
        before = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        window_start = time.time()
        time.sleep(args.idle_window)
        after = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        time.sleep(2.5)  # the audit log is written in batches
        writes = operator_writes(state / "cluster" / "logs" / "audit.log", window_start)
        reconciles = sample_sum(after, "modeldeploy_reconciles_total") - sample_sum(
            before, "modeldeploy_reconciles_total"
        )
        # Forced no-op reconciles: touch every ModelDeployment's metadata (no spec change); each one is
        # reconciled, and a level-based operator should write nothing back.
        before = after
        touch_start = time.time()
        subprocess.run(
            [kubectl, "annotate", "md", "--all", "--overwrite", f"bench/touch={int(touch_start)}"],
            env=env,
            check=True,
            capture_output=True,
        )
        forced = 0.0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(2)
            now_text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
            forced = sample_sum(now_text, "modeldeploy_reconciles_total") - sample_sum(
                before, "modeldeploy_reconciles_total"
            )
            if forced >= args.count:
                break
        time.sleep(4)
        forced_writes = operator_writes(state / "cluster" / "logs" / "audit.log", touch_start)
        rss = psutil.Process(op.pid).memory_info().rss

        result = {
            "modeldeployments": args.count,
            "create_seconds": round(t_created, 1),
            "all_deployments_seconds": None if t_deployments is None else round(t_deployments, 1),
            "all_ready_seconds": None if t_ready is None else round(t_ready, 1),
            "idle_window_seconds": args.idle_window,
            "idle_reconciles": reconciles,
            "idle_writes": writes,
            "forced_noop_reconciles": forced,
            "forced_noop_writes": forced_writes,
            "writes_per_reconcile": round(forced_writes / forced, 4) if forced else None,
            "operator_rss_mib": round(rss / 2**20, 1),
            "machine": f"{os.cpu_count()} cores",
        }
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"written to {RESULTS}")
        return 0
    finally:
        if op is not None:
            op.terminate()
            try:
                op.wait(timeout=30)
            except subprocess.TimeoutExpired:
                op.kill()
        down(state / "cluster")


if __name__ == "__main__":
    raise SystemExit(main())
