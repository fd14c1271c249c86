"""Issue 26's tail goals, modelserver next to mosec 0.9.8 and TorchServe 0.12.0 (short texts, MiniLM, max
batch 16, 10 ms, torch 2 threads), bounded in time (about 4 minutes):

(a) burst recovery: Poisson arrivals at ``rate`` for 40 s on a fresh server, then 15 s of saturation (64
    closed-loop clients), then the same Poisson arrivals for 40 s; p50/p99 after / fresh (target <= 1.2x).
(b) p99 at the same absolute rate, modelserver / mosec (fresh servers).

``rate`` is 70 % of a rate the server sustains; ``python -m bench.serving_tail RATE``. Results:
bench/results/serving_tail.md / .json.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving import HOST, RESULTS, ROOT, Proc, log, make_workloads, modelserver_args
from bench.serving_load import closed_loop, open_loop
from bench.serving_mosec import MAX_BATCH, THREADS, WAIT_MS, mosec_server, requests_for, summary
from bench.serving_torchserve import requests_for_torchserve, torchserve_server

PHASE_S = 40.0
BURST_S = 15.0
BURST_CLIENTS = 64


WINDOW_S = 5.0


def windows(timeline: list[tuple[float, float, int]]) -> list[dict[str, Any]]:
    """Per ``WINDOW_S`` of scheduled arrivals: answered, p50/p99 of the 200s (ms), and the rest: whether a
    phase is behind from its start, all through, or only at moments."""
    out = []
    for w in range(int(PHASE_S / WINDOW_S)):
        part = [(lat, st) for at, lat, st in timeline if w * WINDOW_S <= at < (w + 1) * WINDOW_S]
        ok = [lat for lat, st in part if st == 200]
        out.append(
            {
                "from_s": w * WINDOW_S,
                "ok": len(ok),
                "p50_ms": round(float(np.percentile(ok, 50)) * 1000, 1) if ok else None,
                "p99_ms": round(float(np.percentile(ok, 99)) * 1000, 1) if ok else None,
                "failed": len(part) - len(ok),
            }
        )
    return out


def poisson(port: int, reqs: list[tuple[bytes, int]], rate: float) -> dict[str, Any]:
    r = asyncio.run(open_loop(HOST, port, reqs, rate, PHASE_S, warmup_s=2.0, seed=26))
    return {"rate": round(rate, 1), **summary(r, PHASE_S), "windows": windows(r.timeline)}


def run(rate: float) -> dict[str, Any]:
    texts = make_workloads()["short"]
    log_dir = Path(tempfile.mkdtemp(prefix="bench-serving-tail-"))
    out: dict[str, Any] = {}
    args = modelserver_args(THREADS, "--max-batch-size", str(MAX_BATCH), "--max-queue-delay-ms", str(WAIT_MS))
    ms = Proc(args, "modelserver-tail", log_dir)
    try:
        ms.wait_ready()
        reqs = requests_for(texts, "modelserver")
        out["modelserver fresh"] = poisson(ms.port, reqs, rate)
        burst = asyncio.run(closed_loop(HOST, ms.port, reqs, BURST_CLIENTS, 0.0, BURST_S))
        out["modelserver burst"] = summary(burst, BURST_S)
        out["modelserver after burst"] = poisson(ms.port, reqs, rate)
    finally:
        ms.stop()
    with mosec_server(log_dir) as (port, _):
        out["mosec fresh"] = poisson(port, requests_for(texts, "mosec"), rate)
    with torchserve_server(log_dir) as (port, _):
        out["torchserve fresh"] = poisson(port, requests_for_torchserve(texts), rate)
    return out


def main(rate: float) -> int:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    doc: dict[str, Any] = {
        "commit": commit.stdout.strip(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "rate": rate,
    }
    doc["phases"] = run(rate)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    p = doc["phases"]
    fresh, after, mosec = p["modelserver fresh"], p["modelserver after burst"], p["mosec fresh"]
    doc["ratios"] = {
        "(a) p50 after burst / fresh": round(after["p50_ms"] / fresh["p50_ms"], 3),
        "(a) p99 after burst / fresh": round(after["p99_ms"] / fresh["p99_ms"], 3),
        "(b) p99 modelserver / mosec": round(fresh["p99_ms"] / mosec["p99_ms"], 3),
        "(b) p50 modelserver / mosec": round(fresh["p50_ms"] / mosec["p50_ms"], 3),
        "(b) p99 modelserver / torchserve": round(fresh["p99_ms"] / p["torchserve fresh"]["p99_ms"], 3),
    }
    (RESULTS / "serving_tail.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        "# Tail goals (issue 26): burst recovery, and p99 vs mosec 0.9.8 and TorchServe 0.12.0 "
        "at the same rate",
        "",
        f"Commit {doc['commit']}, started {doc['started']}, load average before {doc['load_before']}, after "
        f"{doc['load_after']}. Short texts, MiniLM, max batch 16, 10 ms, torch 2 threads; Poisson "
        f"{rate}/s for {PHASE_S:.0f} s per phase (latency from the scheduled arrival); burst: "
        f"{BURST_CLIENTS} closed-loop clients for {BURST_S:.0f} s.",
        "",
        "| phase | ok items/s | p50 ms | p99 ms | refused/failed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in p.items():
        lines.append(f"| {name} | {r['items_per_s']} | {r['p50_ms']} | {r['p99_ms']} | {r['errors']} |")
    lines += ["", "Ratios: " + ", ".join(f"{k} {v}" for k, v in doc["ratios"].items()), ""]
    lines += ["Refusals by the server's error (numbers as N):", ""]
    lines += [f"- {name}: {r.get('reasons') or 'none'}" for name, r in p.items()]
    lines += ["", f"Per {WINDOW_S:.0f} s of the Poisson phases (ok, p50 / p99 ms of the 200s, failed):", ""]
    for name, r in p.items():
        if "windows" in r:
            cells = [f"{w['ok']}, {w['p50_ms']} / {w['p99_ms']}, {w['failed']}" for w in r["windows"]]
            lines.append(f"- {name}: " + " | ".join(cells))
    lines.append("")
    (RESULTS / "serving_tail.md").write_text("\n".join(lines))
    log(json.dumps(doc["ratios"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1])))
