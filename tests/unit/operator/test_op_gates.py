"""Gates (spec.rollout.gates, Flagger's confirm-rollout / confirm-promotion) as a spec: the rollout waits
at beforeFirstStep with the canary's pods warm and out of traffic, and at beforePromotion after the last
step passed; a closed gate never fails anything; status says who is waited for. The reconciler against the
in-memory apiserver, a fake clock, a fake Prometheus and fake gate answers (md_canary.py)."""

from __future__ import annotations

import json

import pytest
from md_canary import World, canary_md
from modeldeploy.api import ModelDeployment
from modeldeploy.rollout_types import COMMAND_ANNOTATION, GateAnswer

URL = "https://gates.example.com:8443/confirm?token=t0ps3cret"
HOST = "https://gates.example.com:8443"
CLOSED = GateAnswer(False, "HTTP 403")
OPEN = GateAnswer(True, "HTTP 200")


class FakeGates:
    """Answers each gate from ``answers[gate]`` (default: closed, HTTP 403); records every ask."""

    def __init__(self) -> None:
        self.answers: dict[str, GateAnswer | None] = {}
        self.asked: list[tuple[str, str, str, float]] = []  # (revision, gate, url, timeout)

    def ask(self, namespace, name, revision, gate, url, timeout):
        self.asked.append((revision, gate, url, timeout))
        return self.answers.get(gate, CLOSED)

    def count(self, gate: str) -> int:
        return sum(1 for a in self.asked if a[1] == gate)


def world(**gates) -> tuple[World, FakeGates]:
    w = World(canary_md(gates={k: {"url": URL, "timeout": "2s"} for k in gates}, progressDeadline="30s"))
    fake = FakeGates()
    w.rec.gates = fake
    return w, fake


def test_the_api_takes_gates_and_refuses_a_long_timeout_or_credentials():
    body = canary_md(
        gates={"beforeFirstStep": {"url": URL}, "beforePromotion": {"url": URL, "timeout": "30s"}}
    )
    g = ModelDeployment.from_api(body).spec.rollout.gates
    assert g is not None and g.before_first_step is not None and g.before_first_step.timeout == "5s"
    for bad in (
        {"url": URL, "timeout": "31s"},
        {"url": "https://user:pw@gates.example.com/x"},
        {"url": "ftp://x"},
    ):
        with pytest.raises(ValueError):
            ModelDeployment.from_api(canary_md(gates={"beforeFirstStep": bad}))


def test_a_stored_gate_url_the_crd_now_refuses_is_an_invalid_spec_and_never_raises():
    """An object admitted before the CRD's URL rule: its canary's reconcile reports the field (Degraded,
    InvalidSpec, a Warning event) and returns; it used to raise from the gate's status (the URL's origin)
    on every reconcile, with Python's parse error as the only trace."""
    w, fake = world(beforeFirstStep=True)
    w.deploy_first()
    w.new_version("2")
    w.raw["spec"]["rollout"]["gates"]["beforeFirstStep"]["url"] = "http://[::1/x"  # as stored
    w.reconcile(rounds=2)
    degraded = w.cond("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")
    assert "spec.rollout.gates.beforeFirstStep.url" in degraded["message"], degraded
    assert "Invalid IPv6 URL" in degraded["message"]
    assert "InvalidSpec" in w.event_reasons() and fake.asked == []


def test_before_first_step_holds_the_canary_warm_and_out_of_traffic_until_the_gate_opens():
    w, fake = world(beforeFirstStep=True)
    old = w.deploy_first()
    assert fake.asked == []  # the first revision has no canary: no gate
    new = w.new_version("2")
    w.reconcile()
    w.run_for(60)  # past interval and progressDeadline (30s): never judged, never aborted
    st = w.status
    assert (st["canaryRevision"], st["step"], st["canaryWeight"]) == (new, 0, 0)
    assert st["phase"] == "Progressing" and st["stableRevision"] == old
    # the canary's pod is up, warm, its readiness gate False; the stable keeps every pod in traffic
    assert list(w.gated(new).values()) == ["False"]
    assert w.pods_in_traffic(new) == 0 and w.pods_in_traffic(old) == 2
    assert w.prom.windows(new) == 0 and "stepStartedAt" not in st
    gate = st["gate"]
    assert (gate["gate"], gate["revision"], gate["host"], gate["message"]) == (
        "beforeFirstStep",
        new,
        HOST,
        "HTTP 403",
    )
    assert "openedAt" not in gate and gate["waitingSince"]
    c = w.cond("Progressing")
    assert c["reason"] == "WaitingForGate"
    assert "beforeFirstStep" in c["message"] and HOST in c["message"] and "HTTP 403" in c["message"]
    assert "t0ps3cret" not in json.dumps(st)  # the URL's path and query never reach status
    assert fake.asked[-1] == (new, "beforeFirstStep", URL, 2.0)
    assert w.event_reasons().count("GateWaiting") == 1
    assert not {"GateOpened", "Aborted", "RolledBack"} & set(w.event_reasons())

    fake.answers["beforeFirstStep"] = OPEN
    w.run_for(2)
    st = w.status
    assert (st["step"], st["canaryWeight"], w.pods_in_traffic(new)) == (0, 25, 1)
    assert st["gate"]["openedAt"] and w.cond("Progressing")["reason"] == "CanaryProgressing"
    assert "GateOpened" in w.event_reasons()
    asks = fake.count("beforeFirstStep")
    w.run_for(60)
    assert w.status["stableRevision"] == new  # promoted through every step (no beforePromotion)
    assert fake.count("beforeFirstStep") == asks  # an open gate is not asked again
    assert "gate" not in w.status


def test_an_unanswered_gate_waits_asking_and_the_wait_event_comes_with_the_first_answer():
    w, fake = world(beforeFirstStep=True)
    w.deploy_first()
    new = w.new_version("2")
    fake.answers["beforeFirstStep"] = None
    w.reconcile()
    w.run_for(5)
    assert w.status["gate"]["message"] == "asking" and w.pods_in_traffic(new) == 0
    assert "GateWaiting" not in w.event_reasons()
    fake.answers["beforeFirstStep"] = GateAnswer(False, "no answer within 2s")
    w.run_for(2)
    assert "no answer within 2s" in w.cond("Progressing")["message"]
    assert w.event_reasons().count("GateWaiting") == 1


def test_before_promotion_waits_after_the_last_step_and_keeps_judging():
    w, fake = world(beforePromotion=True)
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(40)
    st = w.status
    assert fake.count("beforeFirstStep") == 0
    assert st["stableRevision"] == old and (st["canaryRevision"], st["step"], st["canaryWeight"]) == (
        new,
        2,
        100,
    )
    assert st["gate"]["gate"] == "beforePromotion" and st["gate"]["message"] == "HTTP 403"
    assert w.cond("Progressing")["reason"] == "WaitingForGate" and st["phase"] == "Progressing"
    assert w.pods_in_traffic(new) == 2
    windows = w.prom.windows(new)
    w.run_for(30)
    assert w.status["stableRevision"] == old
    assert w.prom.windows(new) >= windows + 2  # the last step's windows go on being judged
    assert w.event_reasons().count("GateWaiting") == 1

    fake.answers["beforePromotion"] = OPEN
    w.run_for(3)
    st = w.status
    assert st["stableRevision"] == new and "gate" not in st
    promoted = st["history"][-1]
    assert promoted["outcome"] == "Promoted" and "beforePromotion" in promoted["reason"]
    assert "GateOpened" in w.event_reasons()


def test_a_failed_window_while_waiting_for_promotion_rolls_back():
    w, _fake = world(beforePromotion=True)
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(40)
    assert w.status["gate"]["gate"] == "beforePromotion"
    w.prom.values[new] = {"error-rate": 0.5}
    w.run_for(40)
    st = w.status
    assert st["history"][-1]["outcome"] == "RolledBack" and "gate" not in st


@pytest.mark.parametrize("gate", ["beforeFirstStep", "beforePromotion"])
def test_a_closed_gate_never_fails_anything_and_commands_still_work(gate):
    w, _fake = world(**{gate: True})
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(120)
    st = w.status
    assert st["stableRevision"] == old and st["canaryRevision"] == new and st["gate"]["gate"] == gate
    assert [h["outcome"] for h in st["history"]] == ["Deployed"]
    w.annotate(COMMAND_ANNOTATION, json.dumps({"action": "promote", "revision": new, "full": True}))
    w.run_for(2)
    assert w.status["stableRevision"] == new

    w2, _ = world(**{gate: True})
    w2.deploy_first()
    new2 = w2.new_version("2")
    w2.reconcile()
    w2.run_for(60)
    w2.annotate(COMMAND_ANNOTATION, json.dumps({"action": "abort", "revision": new2}))
    w2.run_for(2)
    assert w2.status["history"][-1]["outcome"] == "Aborted" and "gate" not in w2.status


def test_a_restarted_operator_resumes_the_wait_and_never_asks_an_open_gate_again():
    w, fake = world(beforeFirstStep=True)
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(10)
    since = w.status["gate"]["waitingSince"]
    w.rec = w.new_operator()
    w.rec.gates = fake
    w.run_for(5)
    assert w.status["gate"]["waitingSince"] == since and w.pods_in_traffic(new) == 0
    fake.answers["beforeFirstStep"] = OPEN
    w.run_for(2)
    assert w.pods_in_traffic(new) == 1
    fake.answers["beforeFirstStep"] = CLOSED  # closed again: too late, the gate was passed
    w.rec = w.new_operator()
    w.rec.gates = fake
    w.run_for(3)
    assert w.pods_in_traffic(new) == 1 and w.status["gate"]["openedAt"]


def test_without_an_asker_a_gate_is_never_open():
    w, _fake = world(beforeFirstStep=True)
    w.rec.gates = None
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(20)
    assert w.pods_in_traffic(new) == 0 and "no gate asker" in w.status["gate"]["message"]


def test_kubectl_modeldeploy_status_says_which_gate_is_waited_for():
    from datetime import UTC, datetime

    from modeldeploy import cli

    now = datetime(2026, 12, 4, 12, 0, 30, tzinfo=UTC)
    md = {
        "metadata": {"name": "m", "namespace": "ns", "generation": 2},
        "spec": {"model": {"name": "echo", "version": "2"}},
        "status": {
            "observedGeneration": 2,
            "gate": {
                "gate": "beforePromotion",
                "revision": "5d7f",
                "host": "https://confirm.example",
                "waitingSince": "2026-12-04T12:00:00Z",
                "message": "HTTP 403",
            },
        },
    }
    text = cli.render_status(md, now=now)
    assert "gate beforePromotion (https://confirm.example) of revision 5d7f: waiting for 200" in text
    assert "since 30s; last answer: HTTP 403" in text
    md["status"]["gate"]["openedAt"] = "2026-12-04T12:00:20Z"
    assert "5d7f: open since 10s" in cli.render_status(md, now=now)
