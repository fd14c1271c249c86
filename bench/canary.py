"""``make bench-canary``: the rollout promises, measured. Runs the e2e canary scenarios that carry them
(the erroring and the slow revision rolled back, the failback during bakeTime) ``--runs`` times on the
local cluster, each run one pytest session with ``$CANARY_E2E_REPORT``, and writes
``bench/results/canary.json``:

* ``rollback_intervals``: analysis windows judged for the bad canary, from its first bad window to the
  rollback decision (AnalysisFailed + AnalysisHold events; a passed window fails the e2e test), and the
  same in wall time (from the canary's pods entering traffic to the decision, in intervals);
* ``failback_seconds``: from the failback decision (its history time, second precision) to the last
  answer the clients got from the failed revision;
* the failed-request share of each rollout, and the requests by outcome.

Median and max over the runs. Timings live here, not in the tests (shared, noisy machines).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from localcluster.state import REPO_ROOT

from bench.provenance import provenance

RESULTS = REPO_ROOT / "bench" / "results" / "canary.json"
SCENARIOS = "erroring or slow or fails_back"


def log(msg: str) -> None:
    print(f"[bench-canary {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_once(i: int, workdir: Path) -> dict[str, Any]:
    report = workdir / f"run{i}.json"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "tests/e2e/test_canary.py",
        "-k",
        SCENARIOS,
    ]
    started = time.monotonic()
    res = subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        env={**os.environ, "CANARY_E2E_REPORT": str(report)},
        text=True,
        capture_output=True,
    )
    took = time.monotonic() - started
    whole = workdir / f"run{i}.log"
    whole.write_text(res.stdout + "\n--- stderr ---\n" + res.stderr)
    tail = "\n".join(res.stdout.splitlines()[-3:])
    log(f"run {i}: pytest exit {res.returncode} in {took:.0f}s: {tail}")
    if res.returncode != 0 or not report.exists():
        failures = "\n".join(ln for ln in res.stdout.splitlines() if ln.startswith(("E ", "FAILED")))
        raise SystemExit(f"run {i} failed (exit {res.returncode}; whole output in {whole}):\n{failures}")
    return dict(json.loads(report.read_text()))


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "max": round(max(xs), 3), "n": len(xs)}


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    windows: list[float] = []
    in_intervals: list[float] = []
    failback: list[float] = []
    per_rollout: list[dict[str, Any]] = []
    for run in runs:
        for key in ("scenario_rollback_error-rate", "scenario_rollback_p99-latency-ms"):
            r = run[key]
            ev = r["analysis_events"]
            windows.append(ev["AnalysisFailed"] + ev["AnalysisHold"])
            in_intervals.append(r["rollback_after_canary_in_traffic_intervals"])
            per_rollout.append(
                {
                    "scenario": key.removeprefix("scenario_"),
                    "failed_share": r["failed_share_whole_rollout"],
                    "requests_by_kind": r["requests_by_kind"],
                }
            )
        fb = run["scenario4_failback"]
        failback.append(fb["decision_to_only_previous_s(history time, -0/+1s)"])
        per_rollout.append(
            {
                "scenario": "failback",
                "failed_share": fb["failed_share_after_promotion"],
                "requests_by_kind": fb["requests_by_kind"],
            }
        )
    return {
        "rollback_intervals": {
            "windows_judged": summary(windows),
            "canary_in_traffic_to_decision_in_intervals": summary(in_intervals),
        },
        "failback_seconds": summary(failback),
        "rollouts": per_rollout,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.canary")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="bench-canary-"))
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = [run_once(i, workdir) for i in range(1, args.runs + 1)]
    doc = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        **provenance(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_before": load_before,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "scenarios": SCENARIOS,
        "interval_s": 6,
        "failure_limit": 1,
        **aggregate(runs),
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    log(f"wrote {RESULTS}: rollback {doc['rollback_intervals']}, failback {doc['failback_seconds']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
