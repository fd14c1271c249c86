"""kstatus's conditions (Reconciling, Stalled) as a spec: kstatus (sigs.k8s.io/cli-utils, Flux's health
checks) reads only those, Ready and observedGeneration of a custom resource, so they must say what our
Progressing and Degraded say. (The kstatus library itself judges recorded statuses in
tests/unit/chart/test_kstatus.py.)"""

from __future__ import annotations

from md_canary import World, canary_md
from modeldeploy.analysis import ERROR_RATE

AT_REST = ("False", "RolloutComplete")
NOT_STALLED = ("False", "AsExpected")


def kstatus_view(w: World) -> dict[str, tuple[str, str]]:
    return {t: (w.cond(t)["status"], w.cond(t)["reason"]) for t in ("Reconciling", "Stalled")}


def test_at_rest_neither_reconciling_nor_stalled():
    w = World()
    w.deploy_first()
    assert w.status["phase"] == "Healthy"
    assert kstatus_view(w) == {"Reconciling": AT_REST, "Stalled": NOT_STALLED}


def test_a_canary_mid_rollout_is_reconciling_although_ready():
    w = World()
    w.deploy_first()
    w.new_version("2")
    w.reconcile()
    assert w.status["phase"] == "Progressing" and w.cond("Ready")["status"] == "True"
    assert kstatus_view(w)["Reconciling"] == ("True", "CanaryProgressing")
    assert w.cond("Reconciling")["message"] == w.cond("Progressing")["message"]
    assert kstatus_view(w)["Stalled"] == NOT_STALLED


def test_a_paused_rollout_is_reconciling_with_the_pause_as_reason():
    w = World(canary_md(paused=True))
    w.deploy_first()
    w.new_version("2")
    w.reconcile()
    assert w.status["phase"] == "Paused"
    assert kstatus_view(w)["Reconciling"] == ("True", "CanaryPaused")


def test_a_rolled_back_revision_is_stalled_until_the_spec_changes():
    w = World()
    w.deploy_first()
    bad = w.new_version("2")
    w.prom.values[bad] = {ERROR_RATE: 0.2}
    w.reconcile()
    w.run_for(10)
    assert w.status["phase"] == "Degraded"
    assert kstatus_view(w) == {"Reconciling": AT_REST, "Stalled": ("True", "RolledBack")}
    assert w.cond("Stalled")["message"] == w.cond("Degraded")["message"]
    w.new_version("3")
    w.reconcile()
    assert kstatus_view(w) == {"Reconciling": ("True", "CanaryProgressing"), "Stalled": NOT_STALLED}


def test_the_derived_conditions_post_no_events_of_their_own():
    w = World()
    w.deploy_first()
    bad = w.new_version("2")
    w.prom.values[bad] = {ERROR_RATE: 0.2}
    w.reconcile()
    w.run_for(10)
    told = [e["message"] for e in w.fake.events]
    assert any(m.startswith("Degraded=True") for m in told)
    assert not [m for m in told if m.startswith(("Reconciling=", "Stalled="))]
