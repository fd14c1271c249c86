"""Two commits of the server side by side: the same closed loop against each, alternating, on the same
machine in one run (``python -m bench.serving_ab BASE NEW [--workload short|long] [--clients 16]
[--seconds 12] [--rounds 2] [--server-args "..."]``). Each commit's ``serving_image`` is checked out into a
temporary git worktree and put first on the server's ``PYTHONPATH``; the client, the texts and the model
are this tree's. Reports items/s, p50/p99 and the server's own mean items per batch (its metrics) per
round, and the NEW/BASE ratio of the medians. Results: bench/results/serving_ab.{json,md} (appended per
workload, so one file holds a short and a long comparison)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from localcluster.promtext import sample_sum

from bench.serving import HOST, RESULTS, ROOT, Proc, log, make_workloads, modelserver_args
from bench.serving_load import closed_loop
from bench.serving_mosec import requests_for


@contextlib.contextmanager
def worktree(rev: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="bench-ab-"))
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(d), rev], cwd=ROOT, check=True)
    try:
        yield d
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(d)], cwd=ROOT, check=False)


def one_round(src: Path, args: list[str], texts: list[str], clients: int, seconds: float) -> dict[str, Any]:
    os.environ["PYTHONPATH"] = str(src / "serving_image")
    server = Proc(modelserver_args(2, *args), "ab", Path(tempfile.mkdtemp(prefix="bench-ab-log-")))
    try:
        server.wait_ready()
        reqs = requests_for(texts, "modelserver")
        asyncio.run(closed_loop(HOST, server.port, reqs, clients, 2.0, 3.0))  # warm: the cost model learns
        before = httpx.get(f"http://{HOST}:{server.port}/metrics", timeout=10).text
        r = asyncio.run(closed_loop(HOST, server.port, reqs, clients, 1.0, seconds))
        after = httpx.get(f"http://{HOST}:{server.port}/metrics", timeout=10).text
    finally:
        server.stop()
        os.environ.pop("PYTHONPATH", None)
    batches = sample_sum(after, "modelserver_batch_size_count") - sample_sum(
        before, "modelserver_batch_size_count"
    )
    items = sample_sum(after, "modelserver_batch_size_sum") - sample_sum(before, "modelserver_batch_size_sum")
    return {
        "items_per_s": round(r.items_per_s, 1),
        "p50_ms": round(r.pct(50) * 1000, 1),
        "p99_ms": round(r.pct(99) * 1000, 1),
        "items_per_batch": round(items / max(batches, 1.0), 2),
        "failed": dict(r.reasons),
    }


def rev_name(rev: str) -> str:
    out = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or rev


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--workload", choices=("short", "long"), default="short")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--server-args", default="", help="extra modelserver arguments for both, one string")
    a = ap.parse_args()
    a.server_args = a.server_args.split()
    texts = make_workloads()[a.workload]
    revs = {"base": rev_name(a.base), "new": rev_name(a.new)}
    doc: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_before": [round(x, 2) for x in os.getloadavg()],
        "revs": revs,
        "workload": a.workload,
        "clients": a.clients,
        "seconds": a.seconds,
        "server_args": a.server_args,
        "rounds": {"base": [], "new": []},
    }
    with worktree(a.base) as base_dir, worktree(a.new) as new_dir:
        trees = {"base": base_dir, "new": new_dir}
        for i in range(a.rounds):
            for side in ("base", "new") if i % 2 == 0 else ("new", "base"):
                r = one_round(trees[side], a.server_args, texts, a.clients, a.seconds)
                log(f"{side} {revs[side]} round {i + 1}: {r}")
                doc["rounds"][side].append(r)
    doc["load_after"] = [round(x, 2) for x in os.getloadavg()]
    med = {s: statistics.median(r["items_per_s"] for r in doc["rounds"][s]) for s in ("base", "new")}
    doc["ratio_new_over_base"] = round(med["new"] / med["base"], 3) if med["base"] else None
    path = RESULTS / "serving_ab.json"
    runs = json.loads(path.read_text()) if path.is_file() else []
    runs = [r for r in runs if r.get("workload") != a.workload] + [doc]
    path.write_text(json.dumps(runs, indent=2) + "\n")
    (RESULTS / "serving_ab.md").write_text(markdown(runs))
    log(f"{a.workload}: new/base {doc['ratio_new_over_base']}")
    return 0


def markdown(runs: list[dict[str, Any]]) -> str:
    lines = [
        "# Two commits side by side (`python -m bench.serving_ab`)",
        "",
        "The same closed loop against each commit's server, alternating rounds, one run per workload; "
        "torch 2 threads. items/s (p50 / p99 ms, items per batch) per round.",
        "",
        "| workload | base | new | server args | base rounds | new rounds | new/base (medians) "
        "| load before/after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in runs:
        cells = {
            s: "; ".join(
                f"{r['items_per_s']} ({r['p50_ms']} / {r['p99_ms']}, {r['items_per_batch']})"
                for r in d["rounds"][s]
            )
            for s in ("base", "new")
        }
        lines.append(
            f"| {d['workload']}, {d['clients']} clients, {d['seconds']:.0f} s | {d['revs']['base']} | "
            f"{d['revs']['new']} | {' '.join(d['server_args']) or '(defaults)'} | {cells['base']} | "
            f"{cells['new']} | **{d['ratio_new_over_base']}** | {d['load_before']} / {d['load_after']} |"
        )
    lines.append("")
    lines.append(f"Started {runs[-1]['started']} (the last run). Failed requests, if any, are in the JSON.")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
