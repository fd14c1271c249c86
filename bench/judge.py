"""``make bench-judge``: how often the statistical judge (``analysis.judge``) fails a revision identical to
the stable (its false-positive rate) and how often it fails one 30 % slower (its power), on the local
cluster, written to ``bench/results/judge.json`` with the commit and the machine's load.

For each scenario the bench brings a noop revision up (20 ms per batch), starts a second one next to it
(identical, or 26 ms per batch) with ``rollout.paused: true`` at the 50 % step -- equal pods, equal
traffic, nothing judged by the operator -- drives both through kube-proxy with the e2e load generator for
``windows`` x 24 s, then asks Prometheus for both revisions' samples over that time with the judge's own
queries (``modeldeploy.analysis.judge_queries``: the mean latency of each 2 s) and judges each 24 s
window with ``modeldeploy.judge_stats.compare`` exactly as the operator does (maxIncrease 0.2,
confidence 0.98, minSamples 8): non-overlapping windows (independent verdicts), and every window shifted
by one sample (more verdicts, correlated neighbours).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from localcluster.cluster import binaries_dir, down, up
from localcluster.operator_process import OperatorProcess
from localcluster.state import REPO_ROOT
from localcluster.testing import Kube, wait_for
from modeldeploy.analysis import judge_queries
from modeldeploy.api import AnalysisSpec
from modeldeploy.judge_stats import compare

from bench.provenance import commit

sys.path.insert(0, str(REPO_ROOT))
from tests.e2e.canary_support import LoadGenerator, md_status, noop_md

RESULTS = REPO_ROOT / "bench" / "results" / "judge.json"
STABLE, SLOWER = "noop://?delay_ms=20", "noop://?delay_ms=26"
JUDGE = {"sampleInterval": "2s", "minSamples": 8, "maxIncrease": 0.2, "confidence": 0.98}
WINDOW_S, STEP_S = 24, 2


def log(msg: str) -> None:
    print(f"[bench-judge {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def manifest(version: str, uri: str, paused: bool) -> dict[str, Any]:
    return noop_md(
        "judged",
        version,
        uri,
        steps=[50, 100],
        interval=f"{WINDOW_S}s",
        paused=paused,
        analysis={"judge": JUDGE, "maxP99LatencyMs": 250},
    )


def series(prom: str, promql: str, start: float, end: float) -> list[float]:
    r = httpx.get(
        f"{prom}/api/v1/query_range",
        params={"query": promql, "start": start, "end": end, "step": STEP_S},
        timeout=30,
    )
    r.raise_for_status()
    result = r.json()["data"]["result"]
    assert len(result) <= 1, result
    return [float(v) for _, v in result[0]["values"]] if result else []


def verdicts(canary: list[float], stable: list[float], shift: int) -> list[dict[str, Any]]:
    """The judge's verdict on each window of ``WINDOW_S`` (every ``shift`` samples)."""
    per = WINDOW_S // STEP_S
    out = []
    for i in range(0, min(len(canary), len(stable)) - per + 1, shift):
        c = compare(
            canary[i : i + per],
            stable[i : i + per],
            confidence=JUDGE["confidence"],
            max_increase=JUDGE["maxIncrease"],
            min_samples=JUDGE["minSamples"],
            relative=True,
        )
        out.append({"verdict": c.verdict, "effect": c.effect, "p": c.p_value})
    return out


def scenario(kube: Kube, name: str, uri: str, windows: int) -> dict[str, Any]:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    kube.api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    wait_for(lambda: kube.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=30)
    kube.apply(manifest("1", STABLE, False), ns)
    wait_for(lambda: md_status(kube, ns, "judged").get("phase") == "Healthy", timeout=150, what="v1")
    v1 = md_status(kube, ns, "judged")["stableRevision"]
    kube.apply(manifest("2", uri, True), ns)
    st = wait_for(
        lambda: (s := md_status(kube, ns, "judged")).get("achievedCanaryWeight") == 50 and s,
        timeout=150,
        what="v2 at 50 %, paused",
    )
    v2 = st["canaryRevision"]
    load = LoadGenerator(kube, ns, "judged", workers=2, pause=0.03, max_seconds=windows * WINDOW_S + 60)
    load.wait_serving().start()
    start = time.time()
    log(f"{name}: {v1} vs {v2} under load for {windows} x {WINDOW_S}s")
    time.sleep(windows * WINDOW_S + STEP_S)
    end = time.time()
    load.stop()
    spec = AnalysisSpec.model_validate({"judge": JUDGE})
    q = judge_queries(spec, namespace=ns, name="judged", revision=v2, stable=v1, interval=f"{WINDOW_S}s")[0]
    assert q.judge is not None
    canary = series(kube.cluster.prometheus_url, q.promql, start + STEP_S, end)
    stable = series(kube.cluster.prometheus_url, q.judge.baseline, start + STEP_S, end)
    apart, shifted = verdicts(canary, stable, WINDOW_S // STEP_S), verdicts(canary, stable, 1)
    kube.api.delete(f"/api/v1/namespaces/{ns}")

    def share(vs: list[dict[str, Any]], verdict: str) -> str:
        return f"{sum(v['verdict'] == verdict for v in vs)}/{len(vs)}"

    return {
        "canary_uri": uri,
        "requests_by_kind": dict(load.by_kind()),
        "samples": {"canary": len(canary), "stable": len(stable)},
        "non_overlapping": {k: share(apart, k) for k in ("Pass", "Fail", "Inconclusive")},
        "shifted_by_one_sample": {k: share(shifted, k) for k in ("Pass", "Fail", "Inconclusive")},
        "effects": [round(v["effect"], 4) for v in apart if v["effect"] is not None],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--windows", type=int, default=20, help="24 s windows per scenario (identical)")
    args = ap.parse_args()
    load_before = [round(x, 2) for x in os.getloadavg()]
    state = Path(tempfile.mkdtemp(prefix="bench-judge-"))
    cluster = up(state, keda=False)
    op = None
    try:
        kube = Kube(cluster, binaries_dir() / "kubectl")
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
        op = OperatorProcess(cluster, state / "operator.log").wait_live()
        result = {
            "commit": commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "machine": {"cpus": os.cpu_count(), "load_before": load_before},
            "judge": JUDGE,
            "window_s": WINDOW_S,
            "identical": scenario(kube, "identical", STABLE + "&rev=2", args.windows),
            "slower_30pct": scenario(kube, "slower", SLOWER, max(5, args.windows // 2)),
        }
        result["machine"]["load_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        if op is not None:
            op.stop()
        down(state)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    log(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
