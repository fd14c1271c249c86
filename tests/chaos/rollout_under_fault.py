"""One rollout under a fault, for the chaos scenarios: v1 of the noop server stable (2 replicas), a good
v2 canaried (steps 25/50/100, 6 s interval) while clients send through kube-proxy; the fault is played
half an interval into v2's first step. Asserted: no client request failed, v2 promoted with exactly one
``Promoted`` entry (v1 exactly one ``Deployed``), a passed window for every step (none skipped). Times
are measured and reported, never asserted."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from e2e.canary_support import LoadGenerator, events, md_status, noop_md
from localcluster.testing import Kube, wait_for

NAME = "echo"
GOOD = "noop://?delay_ms=2"
INTERVAL_S = 6.0


def status(kube: Kube, ns: str) -> dict[str, Any]:
    try:
        return md_status(kube, ns, NAME)
    except Exception:  # the apiserver is down: no status to read now (the wait goes on)
        return {}


def stable_on(kube: Kube, ns: str, version: str) -> str:
    def ok() -> str | None:
        st = status(kube, ns)
        revs = {r["revision"]: r for r in st.get("revisions", [])}
        stable = st.get("stableRevision")
        healthy = st.get("phase") == "Healthy" and not st.get("canaryRevision")
        return str(stable) if healthy and revs.get(stable, {}).get("modelVersion") == version else None

    return wait_for(ok, timeout=120, interval=0.2, what=f"healthy on version {version}")


def dump(kube: Kube, ns: str) -> None:
    """What the pods and the Service's endpoints look like (printed when the rollout did not move)."""
    for p in kube.pods(ns):
        conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
        where = f"{p['spec'].get('nodeName')} ({p['status'].get('podIP')})"
        print(f"pod {p['metadata']['name']} on {where}: {conds}")
    print(f"ready endpoints of {NAME}: {kube.endpoint_ips(ns, NAME)}")
    st = status(kube, ns)
    print(f"step {st.get('step')} started {st.get('stepStartedAt')} waiting {st.get('stepWaitingSince')}")
    print(f"status: {json.dumps(st.get('analysis'), default=str)[:2000]}")


def decisions(st: dict[str, Any], revision: str) -> list[str]:
    return [h["outcome"] for h in st.get("history", []) if h["revision"] == revision]


def md(version: str, uri: str, node: str | None) -> dict[str, Any]:
    body = noop_md(NAME, version, uri, replicas=2)
    if node:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def play(
    kube: Kube,
    ns: str,
    fault: Callable[[], None],
    report: dict[str, Any],
    scenario: str,
    nodes: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """v1 stable, v2 (good) canaried under load; ``fault`` is played once v2's first step has started.
    ``nodes``: the node each revision's pods are pinned to (None: any). What clients saw and where the
    rollout ended go to ``report[scenario]`` and are returned."""
    kube.apply(md("1", GOOD, nodes[0]), ns)
    v1 = stable_on(kube, ns, "1")
    load = LoadGenerator(kube, ns, NAME, max_seconds=300).wait_serving().start()
    try:
        started = time.monotonic()
        kube.apply(md("2", GOOD + "&rev=2", nodes[1]), ns)
        v2 = wait_for(lambda: (r := status(kube, ns).get("revision")) != v1 and r, timeout=30, what="v2")
        wait_for(
            lambda: status(kube, ns).get("stepStartedAt") and status(kube, ns).get("canaryRevision") == v2,
            timeout=60,
            what="v2's first step in traffic",
        )
        time.sleep(INTERVAL_S / 2)  # mid-step: the first window is due in about half an interval
        step_before = status(kube, ns).get("step")
        t_fault = time.monotonic()
        fault()
        healed = time.monotonic()

        def moving() -> dict[str, Any] | None:
            st = status(kube, ns)
            return st if st and (st.get("step") != step_before or "stepStartedAt" not in st) else None

        try:
            moved = wait_for(moving, timeout=120, interval=0.2, what="the rollout moving after the fault")
        except Exception:
            dump(kube, ns)
            raise
        resumed = time.monotonic()
        st = wait_for(
            lambda: (s := status(kube, ns)) and "Promoted" in decisions(s, v2) and s,
            timeout=180,
            interval=0.2,
            what="v2 promoted",
        )
        done = time.monotonic()
        time.sleep(2)
    finally:
        load.stop()
    rollout = load.snapshot(started)
    failed = [r for r in rollout if r.kind != "ok"]
    out = {
        "fault_s": round(healed - t_fault, 1),
        "resumed_after_fault_end_s": round(resumed - healed, 1),
        "resumed_after_fault_end_intervals": round((resumed - healed) / INTERVAL_S, 2),
        "promoted_after_fault_end_s": round(done - healed, 1),
        "requests": len(rollout),
        "failed_by_kind": {k: v for k, v in load.by_kind(started).items() if k != "ok"},
        "outcome": decisions(st, v2)[-1],
        "step_seen_after_fault": moved.get("step"),
    }
    report[scenario] = out
    print(f"{scenario}: {out}")
    assert not failed, f"{len(failed)} failed requests, e.g. {failed[:3]}"
    assert decisions(st, v2) == ["Promoted"] and decisions(st, v1) == ["Deployed"]
    assert st["stableRevision"] == v2
    passed = [e for e in events(kube, ns, NAME) if e["reason"] == "AnalysisPassed" and v2 in e["message"]]
    assert len(passed) >= 3  # one passed window per step: none skipped
    return out
