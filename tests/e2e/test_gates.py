"""Gates end to end (issue 27; Flagger's confirm-rollout / confirm-promotion): the operator, real noop
servers, the real Prometheus, and gates served by this process on 127.0.0.1 that the operator asks.

* beforeFirstStep answering 403 holds the rollout before any traffic moves: status names the gate, its
  host and its answer; the canary's pod is warm and out of traffic; clients see only the stable, every
  request 200. Switched to 200, the rollout goes on and is promoted.
* beforePromotion answering 403 holds the rollout at the last step (100 %, not promoted) while it is
  closed; switched to 200, it is promoted.
* A gate that hangs holds its own rollout (closed: no answer in time) and nothing else: a ModelDeployment
  next to it, without a gate, is promoted in its usual time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.receiver import receivers
from localcluster.testing import Kube, wait_for
from modeldeploy.gates import unreachable

from .canary_support import LoadGenerator, events, md_status, noop_md, wait_for_event

GOOD = "noop://?delay_ms=2"
#: how long a closed gate is watched holding its rollout: longer than an interval (6 s), so an unheld
#: rollout would have judged a window and moved on
HELD_S = 12.0


@pytest.fixture
def gates() -> Iterator[Any]:
    with receivers() as start:
        yield lambda status=403, hang=False: start(status, hang, "/confirm")


def healthy_v1(kube: Kube, ns: str, name: str, **rollout: Any) -> str:
    kube.apply(noop_md(name, "1", GOOD, **rollout), ns)
    wait_for(
        lambda: md_status(kube, ns, name).get("phase") == "Healthy", timeout=120, what=f"{name} v1 healthy"
    )
    return md_status(kube, ns, name)["stableRevision"]


def progressing(st: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in st.get("conditions", []) if c["type"] == "Progressing"), {})


def promoted(kube: Kube, ns: str, name: str, v1: str) -> bool:
    st = md_status(kube, ns, name)
    return st.get("stableRevision") not in (None, v1) and not st.get("canaryRevision")


def waiting_at(kube: Kube, ns: str, name: str, gate: str, answer: str) -> dict[str, Any] | None:
    st = md_status(kube, ns, name)
    g = st.get("gate") or {}
    ok = g.get("gate") == gate and not g.get("openedAt") and g.get("message") == answer
    return st if ok and progressing(st).get("reason") == "WaitingForGate" else None


def test_before_first_step_holds_all_traffic_on_the_stable_until_the_gate_opens(
    kube: Kube, operator: Any, namespace: str, gates: Any
) -> None:
    ns, name, gate = namespace, "gated", gates(403)
    gated = {"beforeFirstStep": {"url": gate.url, "timeout": "2s"}}
    v1 = healthy_v1(kube, ns, name, gates=gated)
    assert gate.documents() == []  # the first revision has no canary to gate
    load = LoadGenerator(kube, ns, name).wait_serving().start()
    try:
        kube.apply(noop_md(name, "2", GOOD + "&rev=2", gates=gated), ns)
        since = time.monotonic()
        st = wait_for(
            lambda: waiting_at(kube, ns, name, "beforeFirstStep", "HTTP 403"),
            timeout=60,
            what="waiting at the gate",
        )
        v2 = st["canaryRevision"]
        msg = progressing(st)["message"]
        assert "beforeFirstStep" in msg and gate.url.rsplit("/", 1)[0] in msg and "HTTP 403" in msg, msg
        assert st["phase"] == "Progressing"
        # the canary's pod comes up warm, out of traffic
        wait_for(
            lambda: any(
                r["revision"] == v2 and r.get("readyReplicas", 0) >= 1
                for r in md_status(kube, ns, name).get("revisions", [])
            ),
            timeout=60,
            what="the canary's pod warm",
        )
        time.sleep(HELD_S)
        st = md_status(kube, ns, name)
        assert (st["canaryRevision"], st.get("step"), st.get("canaryWeight")) == (v2, 0, 0), st
        assert "stepStartedAt" not in st and st["stableRevision"] == v1
        assert all(r.get("inTrafficReplicas", 0) == 0 for r in st["revisions"] if r["revision"] == v2)
        assert waiting_at(kube, ns, name, "beforeFirstStep", "HTTP 403") is not None
        held = load.snapshot(since)
        assert held and {r.revision for r in held} == {v1} and {r.code for r in held} == {200}
        asks = [g for g in gate.documents() if g["revision"] == v2]
        assert len(asks) >= 3 and asks[0] == {
            "namespace": ns,
            "name": name,
            "revision": v2,
            "gate": "beforeFirstStep",
        }
        wait_for_event(kube, ns, name, "GateWaiting")

        gate.status = 200
        opened = time.monotonic()
        wait_for(lambda: (md_status(kube, ns, name).get("canaryWeight") or 0) > 0, timeout=30, what="step 0")
        print(f"beforeFirstStep: in traffic {time.monotonic() - opened:.1f}s after the gate opened")
        wait_for(lambda: promoted(kube, ns, name, v1), timeout=120, interval=0.2, what="v2 promoted")
    finally:
        load.stop()
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    wait_for_event(kube, ns, name, "GateOpened")


def test_before_promotion_holds_the_last_step_until_the_gate_opens(
    kube: Kube, operator: Any, namespace: str, gates: Any
) -> None:
    ns, name, gate = namespace, "confirmed", gates(403)
    gated = {"beforePromotion": {"url": gate.url, "timeout": "2s"}}
    v1 = healthy_v1(kube, ns, name, gates=gated)
    load = LoadGenerator(kube, ns, name).wait_serving().start()
    try:
        kube.apply(noop_md(name, "2", GOOD + "&rev=2", gates=gated), ns)
        st = wait_for(
            lambda: waiting_at(kube, ns, name, "beforePromotion", "HTTP 403"),
            timeout=90,
            what="waiting to promote",
        )
        assert (st.get("step"), st.get("canaryWeight")) == (2, 100), st
        time.sleep(HELD_S)
        st = md_status(kube, ns, name)
        assert st["stableRevision"] == v1 and st["canaryRevision"] and st["phase"] == "Progressing", st
        assert waiting_at(kube, ns, name, "beforePromotion", "HTTP 403") is not None
        assert not any(g["gate"] == "beforeFirstStep" for g in gate.documents())
        gate.status = 200
        opened = time.monotonic()
        wait_for(lambda: promoted(kube, ns, name, v1), timeout=30, interval=0.2, what="v2 promoted")
        print(f"beforePromotion: promoted {time.monotonic() - opened:.1f}s after the gate opened")
    finally:
        load.stop()
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    last = md_status(kube, ns, name)["history"][-1]
    assert last["outcome"] == "Promoted" and "beforePromotion" in last["reason"], last


def test_a_hanging_gate_holds_its_rollout_and_nothing_else(
    kube: Kube, operator: Any, namespace: str, gates: Any
) -> None:
    ns, hanging = namespace, gates(hang=True)
    gated = {"beforeFirstStep": {"url": hanging.url, "timeout": "10s"}}
    v1_held = healthy_v1(kube, ns, "held", gates=gated)
    v1_free = healthy_v1(kube, ns, "free")
    load = LoadGenerator(kube, ns, "free").wait_serving().start()  # its windows need requests to judge
    try:
        kube.apply(noop_md("held", "2", GOOD + "&rev=2", gates=gated), ns)
        applied = time.monotonic()
        kube.apply(noop_md("free", "2", GOOD + "&rev=2"), ns)
        wait_for(lambda: promoted(kube, ns, "free", v1_free), timeout=120, interval=0.2, what="free promoted")
        took = time.monotonic() - applied
    finally:
        load.stop()
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    print(f"next to a hanging gate: promoted after {took:.1f}s")
    assert took < 60, took  # three 6 s steps and their pods, nowhere near stuck behind 10 s asks
    st = wait_for(
        lambda: waiting_at(kube, ns, "held", "beforeFirstStep", unreachable(10)),
        timeout=30,
        what="held: no answer",
    )
    assert st["stableRevision"] == v1_held and st.get("canaryWeight") == 0
    assert hanging.got  # it was really asked
    assert not [e for e in events(kube, ns, "held") if e["reason"] in ("Aborted", "RolledBack")]
