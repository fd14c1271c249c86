"""``make bench-chaos``: the fault-injection scenarios (tests/chaos/ and the verdict regressions in
tests/e2e/test_verdict.py) run once on the local cluster; what clients saw, how soon the rollout moved
after the fault ended, and the final outcome of each go to bench/results/chaos.json, with the commit and
the machine's load. The assertions are the tests'; this only collects their figures.

    python -m bench.chaos
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.provenance import commit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "chaos.json"
SUITES = ["tests/chaos", "tests/e2e/test_verdict.py"]


def main() -> int:
    report = Path(tempfile.mkdtemp(prefix="bench-chaos-")) / "chaos.json"
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.monotonic()
    env = {**os.environ, "CHAOS_REPORT": str(report)}
    rc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *SUITES], cwd=ROOT, env=env
    ).returncode
    doc = {
        "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "commit": commit(),
        "machine": {
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
        },
        "wall_s": round(time.monotonic() - started, 1),
        "tests_passed": rc == 0,
        "scenarios": json.loads(report.read_text()) if report.exists() else {},
    }
    RESULTS.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"wrote {RESULTS} (tests {'passed' if rc == 0 else 'FAILED'})")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
