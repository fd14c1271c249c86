"""Progressive delivery end to end on the local cluster: the operator, real server processes (the noop
model with knobs: good, erroring, slow, failing on a marker text), the real Prometheus scraping them
every second, and a bounded load generator sending like a client does (tests/e2e/canary_support.py): to
the model Service's ClusterIP (kube-proxy) in replicas mode, through the Gateway (Traefik, the HTTPRoute
the operator writes) in gatewayAPI mode. Which revision answered is the answer's own header.

Short intervals (6 s) and steps [25, 50, 100] keep the file to a few minutes. Times are measured and
printed (and written to $CANARY_E2E_REPORT when set), never asserted. What clients saw is asserted: no
4xx, no refused connection and no gateway error, failures only from a bad revision (its own 5xx), the
split each step's clients saw against the achieved weight (exact binomial test), and after a rollback or
failback decision (plus SETTLE_S for endpoints and routes to propagate) every request answered 200 by
the stable revision.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from localcluster.testing import Kube, wait_for

from .canary_support import (
    LoadGenerator,
    binomial_p_value,
    events,
    gateway_routing,
    md_status,
    noop_md,
    pids,
)

NAME = "echo"
GOOD = "noop://?delay_ms=2"
REPORT: dict[str, Any] = {}
#: after a rollback/failback decision is in status, the time for readiness gates, EndpointSlices,
#: kube-proxy's rules and the gateway's configuration to follow; docs/operator.md states it
SETTLE_S = 3.0
#: a step's split is rejected below this p-value (exact two-sided binomial test, one test per step)
SPLIT_ALPHA = 1e-4


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    yield REPORT
    text = json.dumps(REPORT, indent=2, sort_keys=True, default=str)
    sys.stderr.write(f"\n--- canary e2e figures ---\n{text}\n")
    if os.environ.get("CANARY_E2E_REPORT"):
        Path(os.environ["CANARY_E2E_REPORT"]).write_text(text)


def deploy(kube: Kube, ns: str, version: str, uri: str, **rollout: Any) -> None:
    kube.apply(noop_md(NAME, version, uri, **rollout), ns)


def healthy_on(kube: Kube, ns: str, version: str) -> str:
    def ok() -> str | None:
        st = md_status(kube, ns, NAME)
        revs = {r["revision"]: r for r in st.get("revisions", [])}
        stable = st.get("stableRevision")
        if (
            st.get("phase") == "Healthy"
            and not st.get("canaryRevision")
            and stable in revs
            and revs[stable].get("modelVersion") == version
        ):
            return str(stable)
        return None

    return wait_for(ok, timeout=90, interval=0.2, what=f"{NAME} healthy on version {version}")


def revision_of(kube: Kube, ns: str) -> str:
    return wait_for(lambda: md_status(kube, ns, NAME).get("revision"), timeout=30, what="status.revision")


def new_revision(kube: Kube, ns: str, old_rev: str) -> str:
    return wait_for(
        lambda: (r := md_status(kube, ns, NAME).get("revision")) != old_rev and r,
        timeout=30,
        what="the new revision in status",
    )


class Watcher:
    """Polls the status; keeps the distinct (step, weight, achieved) states and when they were seen."""

    def __init__(self, kube: Kube, ns: str) -> None:
        self.kube, self.ns = kube, ns
        self.seen: list[tuple[float, Any, Any, Any]] = []

    def until(self, pred: Any, timeout: float, what: str) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            st = md_status(self.kube, self.ns, NAME)
            key = (st.get("step"), st.get("canaryWeight"), st.get("achievedCanaryWeight"))
            if not self.seen or self.seen[-1][1:] != key:
                self.seen.append((time.monotonic(), *key))
            return st if pred(st) else None

        return wait_for(check, timeout=timeout, interval=0.1, what=what)

    def steps(self) -> list[tuple[Any, Any, Any]]:
        return [s[1:] for s in self.seen if s[1] is not None]


def last_history(st: dict[str, Any], revision: str) -> dict[str, Any] | None:
    return next((h for h in reversed(st.get("history", [])) if h["revision"] == revision), None)


def outcome_is(revision: str, outcome: str) -> Any:
    return lambda st: (h := last_history(st, revision)) is not None and h["outcome"] == outcome


def judged_windows(kube: Kube, ns: str, revision: str) -> dict[str, int]:
    """Analysis events about ``revision``: one per judged window (AnalysisPassed / AnalysisFailed) or
    held one (AnalysisHold, no data)."""
    reasons = ("AnalysisPassed", "AnalysisFailed", "AnalysisHold")
    out = dict.fromkeys(reasons, 0)
    for e in events(kube, ns, NAME):
        if e["reason"] in reasons and e["message"].startswith(f"revision {revision} "):
            out[e["reason"]] += int(e.get("count") or 1)
    return out


def only_stable_after(load: LoadGenerator, since: float, revision: str, version: str) -> int:
    """Let the load run ``SETTLE_S`` plus 3 s past ``since``; assert every attempt after the settling
    window was answered 200 by ``revision`` (pod label) with ``version`` (answer body). Returns the count."""
    settled = since + SETTLE_S
    wait_for(
        lambda: len(load.snapshot(settled + 3.0)) > 0 or None,
        timeout=30,
        what="load after the settling window",
    )
    recs = load.snapshot(settled)
    wrong = load.answered_only_by(revision, version, settled)
    assert recs and not wrong, (
        f"{len(wrong)} of {len(recs)} after settling not 200 from {revision}: {wrong[:5]}"
    )
    return len(recs)


# The achieved weight counts the pods whose in-traffic gate the operator set; the Service follows through
# the EndpointSlice controller and kube-proxy. Under a loaded CI run that took 1.5 s once (at 100 %, 6 % of
# the requests in the 1 s-grace window still reached the old pods), so the clients' share is read from 2 s on.
DATA_PLANE_LAG_S = 2.0


def split_seen(load: LoadGenerator, w: Watcher, canary: str) -> list[dict[str, Any]]:
    """Per canary state seen in status (step, requested, achieved): the canary share the clients saw from
    ``DATA_PLANE_LAG_S`` after the state appeared until 0.5 s before the next one, against the achieved
    weight, with the exact binomial test's p-value. ``tested``: the state lasted long enough (3.5 s) to be
    tested."""
    out = []
    ends = [s[0] for s in w.seen[1:]] + [time.monotonic()]
    for (t0, step, requested, achieved), t1 in zip(w.seen, ends, strict=True):
        if step is None:
            continue
        recs = [r for r in load.snapshot(t0 + DATA_PLANE_LAG_S) if r.t < t1 - 0.5 and r.code == 200]
        k = sum(1 for r in recs if r.revision == canary)
        p = (achieved if achieved is not None else requested) / 100
        out.append(
            {
                "step": step,
                "requested": requested,
                "achieved": achieved,
                "seconds": round(t1 - t0, 1),
                "tested": t1 - t0 >= 3.5,
                "requests": len(recs),
                "canary_share": round(k / len(recs), 3) if recs else None,
                "p_value": binomial_p_value(k, len(recs), p),
            }
        )
    return out


def can_tell(row: dict[str, Any]) -> bool:
    """Whether a step's requests are enough for the split test to refuse a split that is all one way:
    none on the canary (unless the weight is 0) and none on the stable (unless it is 100 %)."""
    n, p = row["requests"], (row["achieved"] if row["achieved"] is not None else row["requested"]) / 100
    none_on_canary = p == 0 or binomial_p_value(0, n, p) < SPLIT_ALPHA
    all_on_canary = p == 1 or binomial_p_value(n, n, p) < SPLIT_ALPHA
    return n > 0 and none_on_canary and all_on_canary


def wall_to_mono(ts: str) -> float:
    t = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    return t - (time.time() - time.monotonic())


# ---------------------------------------------------------------------------------------------- 1


@pytest.mark.parametrize("mode", ["replicas", "gatewayAPI"])
def test_good_revision_is_promoted_through_every_step(
    kube: Kube, operator: Any, namespace: str, mode: str
) -> None:
    ns = namespace
    routing = gateway_routing(ns, NAME) if mode == "gatewayAPI" else {"mode": mode}
    replicas = 2 if mode == "replicas" else 1
    deploy(kube, ns, "1", GOOD, replicas=replicas, trafficRouting=routing)
    v1 = healthy_on(kube, ns, "1")
    load = LoadGenerator(kube, ns, NAME, mode=mode).wait_serving().start()
    try:
        deploy(kube, ns, "2", GOOD + "&rev=2", replicas=replicas, trafficRouting=routing)
        v2 = new_revision(kube, ns, v1)
        w = Watcher(kube, ns)
        started = time.monotonic()
        st = w.until(outcome_is(v2, "Promoted"), timeout=120, what="v2 promoted")
        took = time.monotonic() - started
        time.sleep(1.5)
    finally:
        load.stop()
    steps = w.steps()
    split = split_seen(load, w, v2)
    print(
        f"{mode}: states seen {steps}; promoted after {took:.1f}s; load {load.by_revision()}; split {split}"
    )
    REPORT[f"scenario1_{mode}"] = {
        "states_seen(step,requested,achieved)": steps,
        "promoted_after_s": round(took, 1),
        "requests_by_revision": {str(k): v for k, v in load.by_revision().items()},
        "requests_by_kind": dict(load.by_kind()),
        "split_seen_by_clients": split,
    }
    failed = [(round(r.t - started, 2), r.code, r.revision) for r in load.snapshot() if r.kind != "ok"]
    assert set(load.by_kind()) == {"ok"}, (load.by_kind(), failed[:20], w.seen)
    tested = [row for row in split if row["tested"]]
    assert {row["step"] for row in tested} == {0, 1, 2}, split  # every step held long enough to test
    for row in tested:
        # enough traffic that the test could refuse a wrong split: all requests on one side is refused
        assert can_tell(row), row
        assert row["p_value"] >= SPLIT_ALPHA, row
    assert list(dict.fromkeys(s[:2] for s in steps)) == [(0, 25), (1, 50), (2, 100)]
    if mode == "replicas":
        assert {s[2] for s in steps if s[0] == 0} >= {33}  # 1 canary pod next to 2 stable pods
    else:
        # exact route weights; 0 until a canary pod is Ready (never weight on a backend without endpoints)
        assert list(dict.fromkeys(s[2] for s in steps)) in ([25, 50, 100], [0, 25, 50, 100])
    assert st["stableRevision"] == v2 and st["previousRevision"] == v1 and not st.get("canaryRevision")
    assert [h["outcome"] for h in st["history"]][-1] == "Promoted"
    seen = load.by_revision()
    assert seen[v1] > 0 and seen[v2] > 0

    # the previous revision is warm: one pod, running, out of traffic (the status written with the
    # promotion still counts the pods as they were observed before their gates flipped)
    def warm() -> bool:
        prev = {r["revision"]: r for r in md_status(kube, ns, NAME)["revisions"]}[v1]
        return prev["role"] == "previous" and prev["inTrafficReplicas"] == 0 and prev["readyReplicas"] == 1

    wait_for(warm, timeout=30, what="one warm pod of the previous revision, out of traffic")
    reasons = [e["reason"] for e in events(kube, ns, NAME)]
    assert {"CanaryStarted", "AnalysisPassed", "StepAdvanced", "Promoted"} <= set(reasons)
    passed = next(e for e in events(kube, ns, NAME) if e["reason"] == "AnalysisPassed")
    assert "modelserver_requests_total" in passed["message"]  # the query and the value are in the event
    if mode == "gatewayAPI":
        route = kube.get(f"/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/{NAME}")
        assert route is not None
        refs = route["spec"]["rules"][0]["backendRefs"]
        assert [(r["name"], r["weight"]) for r in refs] == [(f"{NAME}-{v2}", 100)]


# ---------------------------------------------------------------------------------------------- 2, 3


@pytest.mark.parametrize(
    ("bad_uri", "metric"),
    [("noop://?delay_ms=2&fail_rate=0.2", "error-rate"), ("noop://?delay_ms=400", "p99-latency-ms")],
    ids=["erroring", "slow"],
)
def test_bad_revision_is_rolled_back(
    kube: Kube, operator: Any, namespace: str, bad_uri: str, metric: str
) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD)
    v1 = healthy_on(kube, ns, "1")
    load = LoadGenerator(kube, ns, NAME).wait_serving().start()
    try:
        rollout_start = time.monotonic()
        deploy(kube, ns, "2", bad_uri)
        v2 = new_revision(kube, ns, v1)
        w = Watcher(kube, ns)
        w.until(
            lambda st: st.get("stepStartedAt") is not None and st.get("canaryRevision") == v2,
            60,
            "in traffic",
        )
        in_traffic = time.monotonic()
        st = w.until(outcome_is(v2, "RolledBack"), timeout=90, what="v2 rolled back")
        decided = time.monotonic()
        after = only_stable_after(load, decided, v1, "1")
        last_v2 = load.last_seen(v2)
    finally:
        load.stop()
    interval = 6.0
    h = last_history(st, v2)
    assert h is not None
    fields = {
        "rollback_after_canary_in_traffic_s": round(decided - in_traffic, 1),
        "rollback_after_canary_in_traffic_intervals": round((decided - in_traffic) / interval, 2),
        "failed_share_whole_rollout": round(load.failed_share(rollout_start), 4),
        "requests": len(load.snapshot(rollout_start)),
        "requests_by_revision": dict(load.by_revision(rollout_start)),
        "requests_by_kind": dict(load.by_kind(rollout_start)),
        "last_bad_response_after_decision_s": None if last_v2 is None else round(last_v2 - decided, 2),
        "requests_after_settling_all_200_from_stable": after,
        "analysis_events": judged_windows(kube, ns, v2),
        "measurement": h.get("measurement"),
    }
    REPORT[f"scenario_rollback_{metric}"] = fields
    print(f"{metric}: {fields}")
    # clients: only the bad revision failed anyone, and only by its own fault (5xx); nothing else
    failures = [r for r in load.snapshot(rollout_start) if r.kind != "ok"]
    assert all(r.kind == "http_5xx" and r.revision == v2 for r in failures), failures[:5]
    if metric == "p99-latency-ms":
        assert not failures  # slow, not failing
    m = h["measurement"]
    assert m["metric"] == metric and m["value"] > m["threshold"] and m["query"]
    assert st["stableRevision"] == v1 and not st.get("canaryRevision")
    assert st["phase"] == "Degraded"
    deg = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert deg["status"] == "True" and deg["reason"] == "RolledBack"
    # rolled back at the first judged window: one failed window, none passed (held windows had no data)
    assert fields["analysis_events"]["AnalysisFailed"] == 1, fields["analysis_events"]
    assert fields["analysis_events"]["AnalysisPassed"] == 0, fields["analysis_events"]
    evs = events(kube, ns, NAME)
    assert not [e for e in evs if e["reason"] == "StepAdvanced" and v2 in e["message"]]
    rb = [e for e in evs if e["reason"] == "RolledBack" and e["message"].startswith("revision")]
    assert len(rb) == 1 and rb[0]["type"] == "Warning" and "query:" in rb[0]["message"]
    wait_for(lambda: not kube.pods(ns, f"modeldeploy.io/revision={v2}"), timeout=60, what="v2 pods gone")
    assert md_status(kube, ns, NAME)["stableRevision"] == v1


# ---------------------------------------------------------------------------------------------- 4


@pytest.mark.parametrize("mode", ["replicas", "gatewayAPI"])
def test_bad_during_bake_fails_back_to_the_warm_previous(
    kube: Kube, operator: Any, namespace: str, mode: str
) -> None:
    """Through kube-proxy (the model Service) and through the Gateway (Traefik, the HTTPRoute): in both, the
    failed revision keeps answering until the warm pod can be reached -- through the Gateway, until its
    endpoint is ready in its Service's EndpointSlices -- so clients meet its 5xx for a moment, never a
    refused connection or a gateway's 503."""
    ns = namespace
    routing = {"trafficRouting": gateway_routing(ns, NAME)} if mode == "gatewayAPI" else {}
    deploy(kube, ns, "1", GOOD, **routing)
    v1 = healthy_on(kube, ns, "1")
    load = LoadGenerator(kube, ns, NAME, mode=mode).wait_serving().start()
    try:
        # v2 is fine until a request carries the marker text: good during the canary, bad in the bake
        deploy(kube, ns, "2", GOOD + "&fail_text=POISON", **routing)
        v2 = new_revision(kube, ns, v1)
        w = Watcher(kube, ns)
        w.until(outcome_is(v2, "Promoted"), timeout=120, what="v2 promoted")
        warm_before = wait_for(
            lambda: (p := pids(kube, ns, NAME, v1)) and all(c for c, _ in p.values()) and p,
            timeout=30,
            what="the warm pod of v1",
        )
        promoted_at = time.monotonic()
        load.poison_share = 0.3
        st = w.until(outcome_is(v2, "FailedBack"), timeout=90, what="v2 failed back")
        observed = time.monotonic()
        h = last_history(st, v2)
        assert h is not None
        decision = wall_to_mono(h["time"])  # second precision: the decision is within [decision, +1s)
        after = only_stable_after(load, observed, v1, "1")
        last_v2 = load.last_seen(v2) or observed
    finally:
        load.stop()
    warm_after = pids(kube, ns, NAME, v1)
    fields = {
        "failback_after_promotion_s": round(observed - promoted_at, 1),
        "decision_to_only_previous_s(history time, -0/+1s)": round(last_v2 - decision, 2),
        "status_observed_to_only_previous_s": round(last_v2 - observed, 2),
        "warm_pods_before": warm_before,
        "warm_pods_after": warm_after,
        "measurement": h.get("measurement"),
        "failed_share_after_promotion": round(load.failed_share(promoted_at), 4),
        "requests_by_kind": dict(load.by_kind()),
        "requests_after_settling_all_200_from_previous": after,
    }
    REPORT["scenario4_failback" + ("" if mode == "replicas" else f"_{mode}")] = fields
    print(f"failback: {fields}")
    # the only failures anyone saw are v2's answers to the marker text (5xx)
    failures = [r for r in load.snapshot() if r.kind != "ok"]
    assert failures and all(r.kind == "http_5xx" and r.revision == v2 for r in failures), failures[:5]
    assert st["stableRevision"] == v1 and h["measurement"]["metric"] == "error-rate"
    # the warm pod went into traffic as it was: same process, no restart
    for pod, (cid, restarts) in warm_before.items():
        assert warm_after.get(pod) == (cid, restarts), pod
    deg = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert deg["reason"] == "FailedBack"


# ---------------------------------------------------------------------------------------------- 7


def plugin(kube: Kube, *args: str) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).parent / "kubectl-modeldeploy"
    return subprocess.run(
        [str(exe), *args], env=kube.env, text=True, capture_output=True, timeout=60, check=False
    )


def test_plugin_commands(kube: Kube, operator: Any, namespace: str) -> None:
    ns = namespace
    slow = {"interval": "1h"}  # nothing moves on its own: every step is the plugin's doing
    deploy(kube, ns, "1", GOOD, **slow)
    v1 = healthy_on(kube, ns, "1")
    deploy(kube, ns, "2", GOOD + "&rev=2", **slow)
    v2 = new_revision(kube, ns, v1)
    w = Watcher(kube, ns)
    w.until(lambda st: st.get("canaryRevision") == v2 and st.get("stepStartedAt"), 60, "canary in traffic")

    assert plugin(kube, "pause", NAME, "-n", ns).returncode == 0
    w.until(lambda st: st.get("phase") == "Paused", 30, "paused")
    r = plugin(kube, "promote", NAME, "-n", ns)
    assert r.returncode == 0, r.stderr
    w.until(lambda st: st.get("step") == 1, 30, "step 1 by hand")
    assert plugin(kube, "resume", NAME, "-n", ns).returncode == 0
    w.until(lambda st: st.get("phase") == "Progressing", 30, "resumed")
    assert plugin(kube, "promote", NAME, "--full", "-n", ns).returncode == 0
    w.until(outcome_is(v2, "Promoted"), 60, "promoted by hand")
    w.until(lambda st: st.get("previousRevision") == v1, 30, "v1 warm")
    assert plugin(kube, "rollback", NAME, "-n", ns).returncode == 0
    st = w.until(outcome_is(v2, "FailedBack"), 60, "rolled back by hand")
    assert st["stableRevision"] == v1
    deploy(kube, ns, "3", GOOD + "&rev=3", **slow)
    v3 = new_revision(kube, ns, st["revision"])
    w.until(lambda st: st.get("canaryRevision") == v3, 60, "v3 canary")
    assert plugin(kube, "abort", NAME, "-n", ns).returncode == 0
    st = w.until(outcome_is(v3, "Aborted"), 60, "v3 aborted")
    assert st["stableRevision"] == v1
    assert plugin(kube, "promote", NAME, "-n", ns).returncode == 1  # nothing to promote now
    out = plugin(kube, "status", NAME, "-n", ns).stdout
    assert "Aborted" in out and "FailedBack" in out and v1 in out
    # as a kubectl plugin (found on PATH)
    env = {**kube.env, "PATH": f"{Path(sys.executable).parent}:{kube.env.get('PATH', '')}"}
    r2 = subprocess.run(
        [str(kube.kubectl_bin), "modeldeploy", "status", NAME, "-n", ns],
        env=env,
        text=True,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert r2.returncode == 0 and "Aborted" in r2.stdout, r2.stderr
    ann = (kube.get(f"/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments/{NAME}") or {})[
        "metadata"
    ]
    assert "modeldeploy.io/command" not in (ann.get("annotations") or {})


# ---------------------------------------------------------------------------------------------- 5


def test_no_traffic_holds_then_fails_and_an_unreachable_prometheus_never_promotes(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD, analysis={"noDataTimeout": "10s"})
    v1 = healthy_on(kube, ns, "1")
    # no load at all: every window is "no data"; held, then failed after noDataTimeout
    deploy(kube, ns, "2", GOOD + "&rev=2", analysis={"noDataTimeout": "10s"})
    v2 = new_revision(kube, ns, v1)
    w = Watcher(kube, ns)
    w.until(lambda st: st.get("stepStartedAt") and st.get("canaryRevision") == v2, 60, "v2 in traffic")
    held = time.monotonic()
    st = w.until(outcome_is(v2, "RolledBack"), timeout=60, what="v2 failed for lack of data")
    h = last_history(st, v2)
    assert h is not None and "noDataTimeout" in h["reason"]
    assert all(s[0] == 0 for s in w.steps())  # held at the first step, never advanced
    holds = [e for e in events(kube, ns, NAME) if e["reason"] == "AnalysisHold"]
    assert holds and all(v2 in e["message"] for e in holds)
    REPORT["scenario5_no_traffic"] = {
        "failed_after_s": round(time.monotonic() - held, 1),
        "reason": h["reason"],
    }

    # Prometheus unreachable (a closed port): held at step 0 under load, never promoted
    unreachable = {"prometheusURL": "http://127.0.0.1:9", "noDataTimeout": "1h"}
    deploy(kube, ns, "3", GOOD + "&rev=3", analysis=unreachable)
    v3 = new_revision(kube, ns, st["revision"])
    load = LoadGenerator(kube, ns, NAME).wait_serving().start()
    try:
        st = w.until(
            lambda st: (
                st.get("canaryRevision") == v3
                and len(
                    [m for m in (st.get("analysis") or {}).get("measurements", []) if m["revision"] == v3]
                )
                >= 6
            ),
            timeout=60,
            what="two judged windows of v3",
        )
    finally:
        load.stop()
    ms = [m for m in st["analysis"]["measurements"] if m["revision"] == v3]
    assert {m["verdict"] for m in ms} == {"Error"}
    assert st["step"] == 0 and st["stableRevision"] == v1 and load.by_revision()[v3] > 0
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    REPORT["scenario5_prometheus_unreachable"] = {"windows_held": len(ms) // 3, "step": st["step"]}


# ---------------------------------------------------------------------------------------------- 8


def test_a_canary_that_cannot_get_gpus_is_reported_then_aborted(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD, progressDeadline="15s")
    v1 = healthy_on(kube, ns, "1")
    md = noop_md(NAME, "2", GOOD + "&rev=2", progressDeadline="15s")
    md["spec"]["resources"]["gpu"] = 16  # the GPU node has 8
    md["spec"]["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
    kube.apply(md, ns)
    v2 = new_revision(kube, ns, v1)
    w = Watcher(kube, ns)
    st = w.until(
        lambda st: any(
            c["type"] == "Degraded" and c["reason"] == "PodsUnschedulable" for c in st.get("conditions", [])
        ),
        timeout=60,
        what="unschedulable canary reported",
    )
    assert st["canaryRevision"] == v2 and not st.get("stepStartedAt")
    reported = time.monotonic()
    st = w.until(outcome_is(v2, "Aborted"), timeout=60, what="the canary aborted after progressDeadline")
    h = last_history(st, v2)
    assert h is not None and "progressDeadline" in h["reason"] and "nvidia.com/gpu" in h["reason"]
    assert "Unschedulable" in [e["reason"] for e in events(kube, ns, NAME)]
    assert st["stableRevision"] == v1
    wait_for(lambda: not kube.pods(ns, f"modeldeploy.io/revision={v2}"), timeout=60, what="v2 pods gone")
    REPORT["scenario8_unschedulable"] = {"aborted_after_report_s": round(time.monotonic() - reported, 1)}


# ---------------------------------------------------------------------------------------------- 6


def committed_windows(st: dict[str, Any], rev: str) -> list[tuple[str, str]]:
    """The error-rate windows committed to status up to the revision's decision: (time, verdict), second
    precision; a window with too few requests is "NoData" whatever its other checks say."""
    decided = last_history(st, rev)
    assert decided is not None
    ms = [
        m
        for m in (st.get("analysis") or {}).get("measurements", [])
        if m["revision"] == rev and m["time"] <= decided["time"]
    ]
    enough = {m["time"] for m in ms if m["metric"] == "requests" and m["verdict"] == "Pass"}
    return sorted(
        (m["time"], m["verdict"] if m["time"] in enough else "NoData")
        for m in ms
        if m["metric"] == "error-rate"
    )


@pytest.mark.parametrize("bad", [False, True], ids=["promote", "rollback"])
def test_operator_killed_mid_rollout_resumes(
    kube: Kube, operator: Any, namespace: str, tmp_path: Path, bad: bool
) -> None:
    """The session operator is frozen (SIGSTOP) and a second one runs the rollout; it is SIGKILLed every
    few seconds and restarted: no step judged twice or skipped, one promotion or one rollback."""
    import signal

    from .canary_support import start_operator

    if operator is None:
        pytest.skip("the operator under test is the chart's (E2E_OPERATOR_RELEASE): it cannot be frozen here")
    ns = namespace
    deploy(kube, ns, "1", GOOD)
    v1 = healthy_on(kube, ns, "1")
    os.kill(operator.pid, signal.SIGSTOP)
    procs: list[Any] = []
    load = LoadGenerator(kube, ns, NAME).wait_serving()
    kills = 0
    try:
        procs.append(start_operator(kube, tmp_path / "op.log"))
        load.start()
        uri = "noop://?delay_ms=2&fail_rate=0.2&rev=k" if bad else GOOD + "&rev=k"
        deploy(kube, ns, "2", uri, analysis={"failureLimit": 2})
        v2 = new_revision(kube, ns, v1)
        w = Watcher(kube, ns)
        want = "RolledBack" if bad else "Promoted"
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            try:
                st = w.until(outcome_is(v2, want), timeout=3.3 + kills % 3, what="")
                break
            except AssertionError:
                procs[-1].send_signal(signal.SIGKILL)
                procs[-1].wait()
                kills += 1
                time.sleep(0.5)
                procs.append(start_operator(kube, tmp_path / "op.log"))
        else:
            raise AssertionError(f"v2 not {want} after {kills} kills")
        time.sleep(3)  # a last reconcile of the final operator must not decide again
        st = md_status(kube, ns, NAME)
    finally:
        load.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        os.kill(operator.pid, signal.SIGCONT)
    outcomes = [h["outcome"] for h in st["history"] if h["revision"] == v2]
    windows = committed_windows(st, v2)
    times = [datetime.fromisoformat(t.replace("Z", "+00:00")) for t, _ in windows]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    REPORT[f"scenario6_{'rollback' if bad else 'promote'}"] = {
        "kills": kills,
        "states_seen": w.steps(),
        "windows_judged(time,error-rate verdict)": windows,
        "history": outcomes,
        "requests_by_kind": dict(load.by_kind()),
    }
    print(REPORT[f"scenario6_{'rollback' if bad else 'promote'}"])
    # operator restarts never touch the data path: only the erroring canary ever fails a client
    failures = [r for r in load.snapshot() if r.kind != "ok"]
    assert all(r.kind == "http_5xx" and r.revision == v2 for r in failures), failures[:5]
    if not bad:
        assert not failures
    assert kills >= 2
    assert outcomes == [want]  # exactly one decision, no duplicate rollback or promotion
    assert all(g >= 5 for g in gaps), gaps  # no window judged twice (interval 6s, times truncated to 1s)
    verdicts = [v for _, v in windows]
    if not bad:
        assert list(dict.fromkeys(s[0] for s in w.steps())) == [0, 1, 2]
        # one passing window per step: none repeated, none skipped. A window with fewer requests than
        # minRequests (the canary's first seconds of traffic on a loaded machine: CI saw one) is no data,
        # judges nothing and holds the step, so it may come before a pass, never after the last one.
        judged = [v for v in verdicts if v != "NoData"]
        assert judged == ["Pass"] * 3, verdicts
        assert verdicts[-1] == "Pass", verdicts
    else:
        assert verdicts.count("Fail") == 2 and verdicts[-1] == "Fail"  # failureLimit 2, then one rollback
