"""gatewayAPI mode through the real Gateway (Traefik) of the local cluster: the canary header reaches the
canary whatever the weight, at every step, and leaves with it; an HTTPRoute edited or deleted behind the
operator's back is repaired at once (the operator watches its routes). Figures are printed (and go to
$GATEWAY_E2E_REPORT when set), never asserted."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from localcluster.testing import Kube, wait_for

from .canary_support import (
    LoadGenerator,
    binomial_p_value,
    gateway_routing,
    md_status,
    noop_md,
)

NAME = "echo"
GOOD = "noop://?delay_ms=2"
HEADER = {"name": "x-modeldeploy-canary", "value": "always"}
ROUTE = "/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/httproutes/" + NAME
SETTLE_S = 3.0  # a route change reaches the gateway (watch, Traefik's configuration) within this
ALPHA = 1e-4
REPORT: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def report() -> Any:
    yield REPORT
    text = json.dumps(REPORT, indent=2, sort_keys=True, default=str)
    sys.stderr.write(f"\n--- gateway e2e figures ---\n{text}\n")
    if os.environ.get("GATEWAY_E2E_REPORT"):
        Path(os.environ["GATEWAY_E2E_REPORT"]).write_text(text)


def deploy(kube: Kube, ns: str, version: str, uri: str, **rollout: Any) -> None:
    routing = gateway_routing(ns, NAME, canaryHeader=HEADER)
    kube.apply(noop_md(NAME, version, uri, trafficRouting=routing, interval="1h", **rollout), ns)


def status_until(kube: Kube, ns: str, pred: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    return wait_for(
        lambda: (st := md_status(kube, ns, NAME)) and pred(st) and st,
        timeout=timeout,
        interval=0.2,
        what=what,
    )


def command(kube: Kube, ns: str, **cmd: Any) -> None:
    kube.kubectl(
        "annotate", "--overwrite", "-n", ns, f"md/{NAME}", f"modeldeploy.io/command={json.dumps(cmd)}"
    )


def last_outcome(st: dict[str, Any], revision: str) -> str | None:
    return next((h["outcome"] for h in reversed(st.get("history", [])) if h["revision"] == revision), None)


def window(plain: LoadGenerator, tagged: LoadGenerator, seconds: float) -> tuple[float, float]:
    """Let both load generators run ``seconds`` after the route settled; the window's bounds."""
    t0 = time.monotonic() + SETTLE_S
    time.sleep(SETTLE_S + seconds)
    return t0, time.monotonic()


def within(load: LoadGenerator, t0: float, t1: float) -> list[Any]:
    return [r for r in load.snapshot(t0) if r.t < t1]


def test_the_canary_header_reaches_the_canary_at_every_step_and_leaves_with_it(
    kube: Kube, operator: Any, namespace: str
) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD)
    st = status_until(kube, ns, lambda st: st.get("phase") == "Healthy", "v1 healthy")
    v1 = st["stableRevision"]
    plain = LoadGenerator(kube, ns, NAME, mode="gatewayAPI", workers=2, max_seconds=200)
    tagged = LoadGenerator(kube, ns, NAME, mode="gatewayAPI", workers=1, max_seconds=200, headers={
        HEADER["name"]: HEADER["value"]})  # fmt: skip
    rows = []
    with plain.wait_serving(), tagged.wait_serving():
        time.sleep(1.0)
        t0, t1 = window(plain, tagged, 2.0)
        rows.append(("before the canary", t0, t1, None))
        deploy(kube, ns, "2", GOOD + "&rev=2")
        st = status_until(
            kube,
            ns,
            lambda st: (
                st.get("canaryRevision") and st.get("stepStartedAt") and st.get("achievedCanaryWeight")
            ),
            "v2 in traffic at step 0",
        )
        v2 = st["canaryRevision"]
        for step, weight in ((0, 25), (1, 50)):
            st = status_until(kube, ns, lambda st, s=step: st.get("step") == s, f"step {step}")
            assert st["achievedCanaryWeight"] == weight, st
            t0, t1 = window(plain, tagged, 5.0)
            rows.append((f"step {step}", t0, t1, weight))
            if step == 0:
                command(kube, ns, action="promote", revision=v2, step=0, full=False)
        command(kube, ns, action="abort", revision=v2)
        st = status_until(kube, ns, lambda st: last_outcome(st, v2) == "Aborted", "v2 aborted")
        t0, t1 = window(plain, tagged, 3.0)
        rows.append(("after the abort", t0, t1, None))
        # a third revision, promoted at once: the header rule goes with the canary
        deploy(kube, ns, "3", GOOD + "&rev=3")
        st = status_until(kube, ns, lambda st: st.get("canaryRevision") not in (None, v2), "v3 canary")
        v3 = st["canaryRevision"]
        status_until(kube, ns, lambda st: st.get("stepStartedAt") and st.get("achievedCanaryWeight"), "v3 in")
        command(kube, ns, action="promote", revision=v3, step=0, full=True)
        st = status_until(kube, ns, lambda st: last_outcome(st, v3) == "Promoted", "v3 promoted")
        t0, t1 = window(plain, tagged, 3.0)
        rows.append(("after the promotion", t0, t1, None))
    figures = {}
    for label, t0, t1, weight in rows:
        p_recs, t_recs = within(plain, t0, t1), within(tagged, t0, t1)
        k = sum(1 for r in p_recs if r.revision == v2)
        figures[label] = {
            "plain": _count(p_recs),
            "with_header": _count(t_recs),
            "requested_weight": weight,
            "p_value": binomial_p_value(k, len(p_recs), weight / 100) if weight else None,
        }
    REPORT["canary_header"] = {"revisions": {"v1": v1, "v2": v2, "v3": v3}, "windows": figures}
    print(REPORT["canary_header"])
    assert set(plain.by_kind()) == {"ok"} and set(tagged.by_kind()) == {"ok"}, (
        plain.by_kind(),
        tagged.by_kind(),
    )
    f = figures
    assert set(f["before the canary"]["with_header"]) == {v1}, f  # no canary: the stable answers
    for step in ("step 0", "step 1"):
        assert set(f[step]["with_header"]) == {v2} and f[step]["with_header"][v2] >= 20, f[step]
        assert set(f[step]["plain"]) == {v1, v2} and f[step]["p_value"] >= ALPHA, f[step]
    assert set(f["after the abort"]["with_header"]) == {v1}, f["after the abort"]  # the rule left with v2
    assert set(f["after the promotion"]["with_header"]) == {v3}, f["after the promotion"]
    route = kube.get(ROUTE.format(ns=ns)) or {}
    assert len(route["spec"]["rules"]) == 1, route["spec"]  # promoted: no header rule any more
    assert [(r["name"], r["weight"]) for r in route["spec"]["rules"][0]["backendRefs"]] == [
        (f"{NAME}-{v3}", 100)
    ]


def _count(recs: list[Any]) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for r in recs:
        out[r.revision] = out.get(r.revision, 0) + 1
    return out


def test_an_edited_or_deleted_httproute_is_repaired(kube: Kube, operator: Any, namespace: str) -> None:
    ns = namespace
    deploy(kube, ns, "1", GOOD)
    st = status_until(kube, ns, lambda st: st.get("phase") == "Healthy", "v1 healthy")
    v1 = st["stableRevision"]
    path = ROUTE.format(ns=ns)

    def weights() -> list[tuple[str, int]]:
        r = kube.get(path) or {"spec": {"rules": [{"backendRefs": []}]}}
        return [(b["name"], b["weight"]) for b in r["spec"]["rules"][-1]["backendRefs"]]

    want = [(f"{NAME}-{v1}", 100)]
    wait_for(lambda: weights() == want, what="the route")
    with LoadGenerator(kube, ns, NAME, mode="gatewayAPI", workers=2, max_seconds=120).wait_serving() as load:
        time.sleep(2)
        # edited behind the operator's back (another field manager): the weight set to 0
        patch = json.dumps([{"op": "replace", "path": "/spec/rules/0/backendRefs/0/weight", "value": 0}])
        edited = time.monotonic()
        kube.kubectl("patch", "httproute", NAME, "-n", ns, "--type=json", "-p", patch)
        wait_for(lambda: weights() == want, timeout=15, interval=0.05, what="the edited route repaired")
        edit_repaired = time.monotonic() - edited
        uid = (kube.get(path) or {})["metadata"]["uid"]
        deleted = time.monotonic()
        kube.api.delete(path)
        wait_for(
            lambda: (r := kube.get(path)) is not None and r["metadata"]["uid"] != uid and weights() == want,
            timeout=15,
            interval=0.05,
            what="the deleted route recreated",
        )
        delete_repaired = time.monotonic() - deleted
        back = time.monotonic() + SETTLE_S
        time.sleep(SETTLE_S + 3)
    after = load.snapshot(back)
    REPORT["route_repair"] = {
        "edited_route_repaired_after_s": round(edit_repaired, 2),
        "deleted_route_recreated_after_s": round(delete_repaired, 2),
        "requests_by_kind": dict(load.by_kind()),
        "failed_while_broken": sum(1 for r in load.snapshot(edited) if r.t < back and r.kind != "ok"),
        "requests_after_repair": len(after),
    }
    print(REPORT["route_repair"])
    # at rest nothing else wakes the operator within seconds (no rollout timer): the watch did it
    assert edit_repaired < 10 and delete_repaired < 10, REPORT["route_repair"]
    assert after and all(r.kind == "ok" and r.revision == v1 for r in after), after[:5]
    events = (kube.get(f"/api/v1/namespaces/{ns}/events") or {}).get("items", [])
    msgs = [e["message"] for e in events if e.get("involvedObject", {}).get("name") == NAME]
    assert any(m.startswith("updated HTTPRoute") for m in msgs) and any(
        m == f"created HTTPRoute {NAME}" for m in msgs
    )
