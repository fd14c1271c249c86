"""``make bench-operator``: the operator at scale on the local cluster, against a plain-client baseline.

ModelDeployments whose pods kwok simulates (a non-agent image, so no real server processes). One run
measures, each phase on a fresh cluster:

1. **baseline**: a plain client (the ``kubernetes`` Python client, 4 threads) creates, per
   ModelDeployment, the very objects the operator would (its Deployment, the two Services, the PDB, built
   by ``modeldeploy.builders``; without the owner reference, as there is no owner): the time until all
   are created and until every Deployment has its pod Ready;
2. **operator, N ModelDeployments** (default 300), created by the same client (4 threads): the time
   from the first create until every ModelDeployment has its Deployment and until every one reports
   ``Ready=True``; then steady state: an idle window, and a forced reconcile of each (an annotation,
   nothing to change), over which the operator's own metrics give LIST requests per reconcile
   (``modeldeploy_reads_total{verb="list"}`` / ``modeldeploy_reconciles_total``) and the audit log its
   writes per reconcile; the operator's RSS;
3. **operator, a large point** (default 1000): time to all Ready and the operator process's RSS, peak
   (the kernel's high-water mark, ``VmHWM``) and at rest (after everything is Ready and quiet).

The ratio operator all-Ready / baseline all-Ready is the figure of issue 10 (target <= 1.5). Results go to
``bench/results/operator.json`` and ``operator.md``. Nothing here is asserted; it is a measurement.

The local cluster gives each cluster a /24 of Service ClusterIPs (253 Services); N ModelDeployments need
2N, so this bench gives its clusters a /20 of their own (``172.16.0.0/12`` cut by pod-network index).
"""

from __future__ import annotations

import argparse
import copy
import ipaddress
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from localcluster import podnet
from localcluster.audit import writes_by_agents
from localcluster.cluster import Cluster, binaries_dir, down, up
from localcluster.kubeapi import KubeAPI
from localcluster.operator_process import OperatorProcess
from localcluster.promtext import sample_sum
from localcluster.state import REPO_ROOT
from modeldeploy import builders
from modeldeploy.api import ModelDeployment
from prometheus_client.parser import text_string_to_metric_families

from bench.provenance import provenance

RESULTS = REPO_ROOT / "bench" / "results" / "operator.json"
RESULTS_MD = REPO_ROOT / "bench" / "results" / "operator.md"
OPERATOR_UAS = ("modeldeploy-operator", "kopf/")
OUR_RESOURCES = {"deployments", "services", "poddisruptionbudgets", "pods", "modeldeployments"}
NAMESPACE = "default"
BASELINE_THREADS = 4
TARGET_RATIO = 1.5
_BENCH_SERVICES = ipaddress.ip_network("172.16.0.0/12")


def _bench_service_cidr(self: podnet.PodNetwork) -> str:
    """A /20 (4094 ClusterIPs) per pod-network index, instead of the local cluster's /24."""
    return str(list(_BENCH_SERVICES.subnets(new_prefix=20))[self.index])


podnet.PodNetwork.service_cidr = property(_bench_service_cidr)  # type: ignore[assignment,method-assign]


def md(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": name, "version": "1", "uri": "noop://bench", "format": "noop"},
            "image": "registry.invalid/simulated-server:1",  # not an agent image: kwok simulates the pod
            "replicas": 1,
            "resources": {"gpu": 0, "cpu": "50m", "memory": "128Mi"},  # 1000 fit on the 2 x 32 CPUs
        },
    }


def names(count: int) -> list[str]:
    return [f"bench-{i:04d}" for i in range(count)]


def children(name: str) -> list[dict[str, Any]]:
    """What the operator creates for a fresh ModelDeployment ``name``, from its own builders: the
    revision's Deployment, the model Service, the revision Service, the PDB (no owner reference)."""
    raw = md(name)
    raw["metadata"] = {"name": name, "namespace": NAMESPACE, "uid": "00000000-0000-0000-0000-000000000000"}
    m = ModelDeployment.from_api(raw)
    rev = builders.spec_revision(m.spec)
    objs = [
        builders.build_deployment(m, m.spec, rev, m.spec.replicas or 1),
        builders.build_model_service(m),
        builders.build_revision_service(m, rev),
        builders.build_pdb(m),
    ]
    for o in objs:
        o["metadata"].pop("ownerReferences", None)
    return objs


# ------------------------------------------------------------------------------------------- helpers


def _epoch(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def operator_writes(audit_log: Path, since: float) -> int:
    events = writes_by_agents(audit_log, OPERATOR_UAS, OUR_RESOURCES)
    return sum(
        1 for ev in events if _epoch(ev.get("requestReceivedTimestamp") or "1970-01-01T00:00:00Z") >= since
    )


def reads_by(text: str) -> dict[str, float]:
    """``modeldeploy_reads_total`` as ``{"verb kind": value}``."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "modeldeploy_reads_total":
                key = f"{s.labels.get('verb')} {s.labels.get('kind')}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items()) if v - before.get(k, 0.0)}


def _ready_condition(m: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (m.get("status") or {}).get("conditions") or []
    )


def _wait(
    label: str, t0: float, timeout: float, poll: Callable[[], bool], interval: float = 2.0
) -> float | None:
    while time.monotonic() - t0 < timeout:
        if poll():
            took = time.monotonic() - t0
            print(f"  {label} after {took:.1f}s", flush=True)
            return took
        time.sleep(interval)
    print(f"  {label}: not within {timeout:.0f}s", flush=True)
    return None


def _r(x: float | None, nd: int = 1) -> float | None:
    return None if x is None else round(x, nd)


@contextmanager
def fresh_cluster(state: Path, name: str) -> Iterator[tuple[Cluster, dict[str, str]]]:
    t = time.monotonic()
    cluster = up(state / name, keda=False)  # no KEDA: nothing here scales
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    print(f"[{name}] cluster up in {time.monotonic() - t:.1f}s (Services {cluster.service_cidr})", flush=True)
    try:
        yield cluster, env
    finally:
        down(state / name)


def kubectl(env: dict[str, str], *args: str, input: bytes | None = None) -> None:
    subprocess.run(
        [str(binaries_dir() / "kubectl"), *args], input=input, env=env, check=True, capture_output=True
    )


# ------------------------------------------------------------------------------------------- baseline


def create_all(kubeconfig: Path, groups: list[list[dict[str, Any]]]) -> None:
    """Create every object, one group (a ModelDeployment's objects) at a time per thread, with the
    ``kubernetes`` client from ``BASELINE_THREADS`` threads (one API client each)."""
    from kubernetes import client, config

    local = threading.local()

    def create(objs: list[dict[str, Any]]) -> None:
        if not hasattr(local, "apis"):
            c = config.new_client_from_config(config_file=str(kubeconfig))
            local.apis = (
                client.AppsV1Api(c),
                client.CoreV1Api(c),
                client.PolicyV1Api(c),
                client.CustomObjectsApi(c),
            )
        apps, core, policy, custom = local.apis
        for o in objs:
            kind = o["kind"]
            if kind == "Deployment":
                apps.create_namespaced_deployment(NAMESPACE, o)
            elif kind == "Service":
                core.create_namespaced_service(NAMESPACE, o)
            elif kind == "PodDisruptionBudget":
                policy.create_namespaced_pod_disruption_budget(NAMESPACE, o)
            else:
                group, version = o["apiVersion"].split("/")
                custom.create_namespaced_custom_object(group, version, NAMESPACE, "modeldeployments", o)

    with ThreadPoolExecutor(BASELINE_THREADS) as pool:
        list(pool.map(create, groups))


def baseline(state: Path, count: int, timeout: float, tag: str = "") -> dict[str, Any]:
    with fresh_cluster(state, f"baseline{tag}") as (cluster, _env):
        api = KubeAPI(cluster.kubeconfig)
        bodies = [children(n) for n in names(count)]
        t0 = time.monotonic()
        create_all(cluster.kubeconfig, bodies)
        t_created = time.monotonic() - t0
        print(f"  created {4 * count} objects in {t_created:.1f}s", flush=True)

        def all_ready() -> bool:
            deps = (api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments") or {}).get("items", [])
            return sum((d.get("status") or {}).get("readyReplicas", 0) >= 1 for d in deps) >= count

        t_ready = _wait("all Deployments Ready", t0, timeout, all_ready)
        return {
            "threads": BASELINE_THREADS,
            "objects": 4 * count,
            "all_created_seconds": _r(t_created),
            "all_ready_seconds": _r(t_ready),
        }


# ------------------------------------------------------------------------------------------- operator


class Operator:
    """The operator as a process of its own (standalone), its metrics, its memory."""

    def __init__(self, cluster: Cluster, env: dict[str, str], log: Path) -> None:
        self._op = OperatorProcess(cluster, log, base_env=env)
        self.proc = self._op.proc
        self.ps = psutil.Process(self.proc.pid)

    def metrics(self) -> str:
        return self._op.metrics()

    def reconciles(self) -> float:
        return sample_sum(self.metrics(), "modeldeploy_reconciles_total")

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def peak_rss_mib(self) -> float:
        """The kernel's high-water mark of the process's resident set (``VmHWM``)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return self.rss_mib()

    def stop(self) -> None:
        self._op.stop()


def install_crds(env: dict[str, str]) -> None:
    kubectl(env, "apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
    kubectl(
        env, "wait", "--for=condition=Established", "--timeout=60s", "crd/modeldeployments.modeldeploy.io"
    )


def create_and_wait(
    op: Operator, cluster: Cluster, env: dict[str, str], count: int, timeout: float
) -> dict[str, Any]:
    api = KubeAPI(cluster.kubeconfig)
    base = f"/apis/modeldeploy.io/v1alpha1/namespaces/{NAMESPACE}/modeldeployments"
    t0 = time.monotonic()
    create_all(cluster.kubeconfig, [[md(n)] for n in names(count)])  # the baseline's client
    t_created = time.monotonic() - t0
    print(f"  created {count} ModelDeployments in {t_created:.1f}s", flush=True)
    t_deployments: list[float] = []

    def all_ready() -> bool:
        if not t_deployments:
            deps = (api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments") or {}).get("items", [])
            if len({d["metadata"]["labels"].get("modeldeploy.io/name") for d in deps}) >= count:
                t_deployments.append(time.monotonic() - t0)
                print(f"  all Deployments exist after {t_deployments[0]:.1f}s", flush=True)
        items = (api.get(base) or {}).get("items", [])
        return sum(_ready_condition(m) for m in items) >= count

    t_ready = _wait("all Ready", t0, timeout, all_ready)
    return {
        "modeldeployments": count,
        "create_seconds": _r(t_created),
        "all_deployments_seconds": _r(t_deployments[0]) if t_deployments else None,
        "all_ready_seconds": _r(t_ready),
    }


def same_children(cluster: Cluster, name: str) -> bool:
    """Whether the baseline's objects are the operator's (spec, labels, annotations) for ``name``."""
    api = KubeAPI(cluster.kubeconfig)
    paths = {
        "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{n}",
        "Service": "/api/v1/namespaces/{ns}/services/{n}",
        "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{n}",
    }
    for want in children(name):
        live = api.get(paths[want["kind"]].format(ns=NAMESPACE, n=want["metadata"]["name"])) or {}
        live_meta = live.get("metadata") or {}
        for key in ("labels", "annotations"):
            for k, v in want["metadata"].get(key, {}).items():
                if k != builders.ANNOTATION_APPLIED and live_meta.get(key, {}).get(k) != v:
                    print(f"  differs: {want['kind']} {key} {k}", flush=True)
                    return False
        spec = copy.deepcopy(want["spec"])
        if not _subset(spec, live.get("spec") or {}):
            print(f"  differs: {want['kind']} spec", flush=True)
            return False
    return True


def _subset(want: Any, live: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(live, dict) and all(_subset(v, live.get(k)) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(want) == len(live) and all(map(_subset, want, live))
    return bool(want == live)


def operator_point(state: Path, count: int, timeout: float, idle_window: float) -> dict[str, Any]:
    with fresh_cluster(state, "operator") as (cluster, env):
        install_crds(env)
        op = Operator(cluster, env, state / "operator.log")
        try:
            res = create_and_wait(op, cluster, env, count, timeout)
            res["baseline_objects_identical"] = same_children(cluster, names(count)[0])
            time.sleep(5)
            # idle: nothing changes; what does the operator do?
            before = op.metrics()
            window_start = time.time()
            time.sleep(idle_window)
            after = op.metrics()
            time.sleep(2.5)  # the audit log is written in batches
            audit = state / "operator" / "logs" / "audit.log"
            res["idle_window_seconds"] = idle_window
            res["idle_reconciles"] = sample_sum(after, "modeldeploy_reconciles_total") - sample_sum(
                before, "modeldeploy_reconciles_total"
            )
            res["idle_writes"] = operator_writes(audit, window_start)
            res["idle_reads"] = _delta(reads_by(after), reads_by(before))
            # forced no-op reconciles: touch every ModelDeployment's metadata (no spec change); each one
            # is reconciled; from the watch cache, with no LIST and no write
            before = after
            touch_start = time.time()
            kubectl(env, "annotate", "md", "--all", "--overwrite", f"bench/touch={int(touch_start)}")
            base = sample_sum(before, "modeldeploy_reconciles_total")
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and op.reconciles() - base < count:
                time.sleep(2)
            time.sleep(4)
            after = op.metrics()
            forced = sample_sum(after, "modeldeploy_reconciles_total") - base
            reads = _delta(reads_by(after), reads_by(before))
            lists = sum(v for k, v in reads.items() if k.startswith("list "))
            forced_writes = operator_writes(audit, touch_start)
            res.update(
                {
                    "forced_noop_reconciles": forced,
                    "forced_noop_reads": reads,
                    "forced_noop_lists": lists,
                    "lists_per_reconcile": round(lists / forced, 4) if forced else None,
                    "forced_noop_writes": forced_writes,
                    "writes_per_reconcile": round(forced_writes / forced, 4) if forced else None,
                    "reads_whole_run": reads_by(after),
                    "operator_rss_mib": round(op.rss_mib(), 1),
                    "operator_peak_rss_mib": round(op.peak_rss_mib(), 1),
                }
            )
            return res
        finally:
            op.stop()


def operator_ready_only(state: Path, count: int, timeout: float, tag: str) -> dict[str, Any]:
    """Another operator round, to all Ready only (for the pairs with the baseline)."""
    with fresh_cluster(state, f"operator-{tag}") as (cluster, env):
        install_crds(env)
        op = Operator(cluster, env, state / f"operator-{tag}.log")
        try:
            return create_and_wait(op, cluster, env, count, timeout)
        finally:
            op.stop()


def large_point(state: Path, count: int, timeout: float, settle: float) -> dict[str, Any]:
    with fresh_cluster(state, "large") as (cluster, env):
        install_crds(env)
        op = Operator(cluster, env, state / "operator-large.log")
        try:
            time.sleep(3)
            res = {"operator_rss_start_mib": round(op.rss_mib(), 1)}
            res.update(create_and_wait(op, cluster, env, count, timeout))
            time.sleep(settle)
            res["rest_after_seconds"] = settle
            res["operator_rss_rest_mib"] = round(op.rss_mib(), 1)
            res["operator_rss_peak_mib"] = round(op.peak_rss_mib(), 1)
            res["reads_whole_run"] = reads_by(op.metrics())
            return res
        finally:
            op.stop()


# ------------------------------------------------------------------------------------------- report


def markdown(r: dict[str, Any]) -> str:
    b, o, big = r["baseline"], r["operator"], r.get("large")
    lines = [
        "# Operator at scale vs a plain client",
        "",
        f"{r['when']}, commit {r.get('commit')}; {r['machine']}; load average before {r['load_before']}, "
        "after "
        f"{r.get('load_after')} (a shared machine). Command: `{r['command']}`"
        f" ({r['wall_seconds']:.0f} s in all). Pods simulated by kwok; each phase on a fresh local cluster.",
        "",
        f"| {o['modeldeployments']} ModelDeployments (first pair) | created | all Deployments | all Ready |",
        "|---|---|---|---|",
        f"| plain client (`kubernetes`, {b['threads']} threads, {b['objects']} objects) "
        f"| {b['all_created_seconds']} s | {b['all_created_seconds']} s | **{b['all_ready_seconds']} s** |",
        f"| operator | {o['create_seconds']} s (ModelDeployments) | {o['all_deployments_seconds']} s "
        f"| **{o['all_ready_seconds']} s** |",
        "",
    ]
    ratio = r.get("ratio_all_ready")
    if ratio is not None:
        verdict = "met" if ratio <= TARGET_RATIO else "not met"
        pairs = "; ".join(
            f"{x['baseline']} s / {x['operator']} s = {x['ratio']}x" for x in r["pairs_all_ready_seconds"]
        )
        lines.append(
            f"Operator all-Ready / baseline all-Ready, median of {len(r['pairs_all_ready_seconds'])} "
            f"back-to-back pairs (baseline / operator: {pairs}): **{ratio:.2f}x** "
            f"(target <= {TARGET_RATIO}x: {verdict}). Both sides are created by the same client "
            "(`kubernetes`, 4 threads): 4 objects per ModelDeployment directly, or the ModelDeployment. "
            "Baseline objects identical to the operator's (spec, labels, annotations): "
            f"{o.get('baseline_objects_identical')}."
        )
    lines += [
        "",
        f"Steady state, {o['modeldeployments']} ModelDeployments: idle {o['idle_window_seconds']:.0f} s: "
        f"{o['idle_reconciles']:.0f} reconciles, {o['idle_writes']} writes, "
        f"reads {o['idle_reads'] or 'none'}. "
        f"Every ModelDeployment annotated once: {o['forced_noop_reconciles']:.0f} reconciles, "
        f"**{o['forced_noop_lists']:.0f} LIST requests ({o['lists_per_reconcile']} per reconcile)**, "
        f"{o['forced_noop_writes']} writes ({o['writes_per_reconcile']} per reconcile); "
        f"reads in that window: {o['forced_noop_reads'] or 'none'} (`modeldeploy_reads_total`). "
        f"Operator RSS {o['operator_rss_mib']} MiB (peak {o['operator_peak_rss_mib']} MiB).",
    ]
    if big:
        lines += [
            "",
            f"{big['modeldeployments']} ModelDeployments (operator): created in {big['create_seconds']} s, "
            f"all Deployments after {big['all_deployments_seconds']} s, **all Ready after "
            f"{big['all_ready_seconds']} s**; operator RSS {big['operator_rss_start_mib']} MiB at start, "
            f"**peak {big['operator_rss_peak_mib']} MiB** (VmHWM), **{big['operator_rss_rest_mib']} MiB at "
            f"rest** ({big['rest_after_seconds']:.0f} s after all Ready).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.operator")
    p.add_argument("--count", type=int, default=300)
    p.add_argument("--large", type=int, default=1000, help="the large point's ModelDeployments (0: skip)")
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--rounds", type=int, default=2, help="baseline/operator pairs at --count (all Ready)")
    p.add_argument("--idle-window", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=20.0, help="seconds after all Ready for 'RSS at rest'")
    p.add_argument("--timeout", type=float, default=600.0, help="per phase, to all Ready")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still clean up the clusters

    started = time.monotonic()
    result: dict[str, Any] = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        **provenance(),
        "machine": f"{os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "command": " ".join(["python -m bench.operator", *(sys.argv[1:] if argv is None else argv)]),
    }
    state = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    if not args.no_baseline:
        print(f"baseline: plain client, {args.count} x 4 objects", flush=True)
        result["baseline"] = baseline(state, args.count, args.timeout)
    print(f"operator: {args.count} ModelDeployments", flush=True)
    result["operator"] = operator_point(state, args.count, args.timeout, args.idle_window)
    if not args.no_baseline:
        pairs = [(result["baseline"]["all_ready_seconds"], result["operator"]["all_ready_seconds"])]
        for r in range(2, args.rounds + 1):  # more pairs, back to back: the machine is shared
            print(f"round {r}: baseline, then operator, {args.count}", flush=True)
            b = baseline(state, args.count, args.timeout, tag=f"-{r}")
            o = operator_ready_only(state, args.count, args.timeout, tag=str(r))
            pairs.append((b["all_ready_seconds"], o["all_ready_seconds"]))
        result["pairs_all_ready_seconds"] = [
            {"baseline": b_s, "operator": o_s, "ratio": round(o_s / b_s, 2) if b_s and o_s else None}
            for b_s, o_s in pairs
        ]
        ratios = [x["ratio"] for x in result["pairs_all_ready_seconds"] if x["ratio"] is not None]
        result["ratio_all_ready"] = round(statistics.median(ratios), 2) if ratios else None
        result["target_ratio"] = TARGET_RATIO
    if args.large:
        print(f"operator: {args.large} ModelDeployments", flush=True)
        result["large"] = large_point(state, args.large, args.timeout, args.settle)
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    if "baseline" in result:
        RESULTS_MD.write_text(markdown(result))
    print(json.dumps(result, indent=2))
    print(f"written to {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
