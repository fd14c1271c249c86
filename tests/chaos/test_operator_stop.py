"""SIGTERM while Prometheus hangs (issue 23, section 2): the operator, as a process of its own, has
canaries whose measurements hang on a Prometheus that accepts and drips a byte every 2 s; SIGTERM must stop
the whole process within the grace period the chart gives it (``terminationGracePeriodSeconds`` 30), not
when the queries end. On b226cdd the operator had not exited 30 s after SIGTERM (issue 23's finding).

This module starts its own operator (no other is running: the chaos suite's is module-scoped) and stops
it itself. The time to exit is printed and written to $CHAOS_REPORT when set (make bench-chaos).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.canary_support import md_status, noop_md
from e2e.fake_prometheus import DrippingPrometheus
from localcluster.operator_process import OperatorProcess
from localcluster.testing import Kube, wait_for

GOOD = "noop://?delay_ms=2"
#: the chart's terminationGracePeriodSeconds (charts/modeldeploy/values.yaml): after it, SIGKILL
GRACE_S = 30


@pytest.fixture
def own_operator(
    kube: Kube, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(kube.cluster, tmp_path_factory.mktemp("stopped-operator") / "operator.log")
    try:
        yield op.wait_live()
    finally:
        if op.proc.poll() is None:
            op.proc.kill()
            op.proc.wait(10)
        sys.stderr.write(f"\n--- operator log (tail) ---\n{op.log_tail()}\n")


def test_sigterm_stops_the_operator_within_its_grace_period_while_prometheus_hangs(
    kube: Kube,
    own_operator: OperatorProcess,
    namespace: str,
    dripping: DrippingPrometheus,
    report: dict[str, Any],
) -> None:
    ns = namespace
    names = [f"hang{i}" for i in range(3)]
    for version, uri in (("1", GOOD), ("2", GOOD + "&rev=2")):
        for n in names:  # replicas 0: the canaries cost the machine nothing but their verdicts
            kube.apply(noop_md(n, version, uri, replicas=0, analysis={"prometheusURL": dripping.url}), ns)
        for n in names:
            key = "stepStartedAt" if version == "2" else "stableRevision"
            wait_for(lambda n=n, key=key: md_status(kube, ns, n).get(key), timeout=60, what=f"{n}: {key}")
    wait_for(lambda: dripping.accepted >= 3, timeout=30, what="queries hanging on the dripping Prometheus")
    time.sleep(2)  # the queries are well inside their 10 s deadline
    t0 = time.monotonic()
    own_operator.proc.send_signal(signal.SIGTERM)
    try:
        code = own_operator.proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the operator was still running {GRACE_S} s after SIGTERM (its queries hang)")
    exited = time.monotonic() - t0
    report["sigterm_while_prometheus_hangs"] = {
        "queries_hanging": dripping.accepted,
        "exited_after_sigterm_s": round(exited, 2),
        "exit_code": code,
        "grace_period_s": GRACE_S,
    }
    print(f"SIGTERM with {dripping.accepted} queries hanging: exited after {exited:.2f}s with {code}")
    assert code == 0, f"the operator exited with {code} on SIGTERM"
