"""A verdict you can trust when things break (issue 23), as a spec: a revision that answers 4xx fails,
a query that errors never passes and pauses the rollout after ``errorLimit`` windows, the stable revision
is rebuilt from status when its Deployment is gone, and a reconcile never waits for a measurement.
The reconciler against the in-memory apiserver, a fake clock and a fake Prometheus (md_canary.py)."""

from __future__ import annotations

import json

from md_canary import World, canary_md
from modeldeploy import builders as b
from modeldeploy.analysis import CLIENT_ERRORS, REQUESTS
from modeldeploy.rollout_types import COMMAND_ANNOTATION


def command(w: World, **cmd) -> None:
    w.annotate(COMMAND_ANNOTATION, json.dumps(cmd))


def deployment(w: World, revision: str) -> dict | None:
    return w.fake.obj("Deployment", f"minilm-{revision}")


def outcomes(w: World) -> list[tuple[str, str]]:
    return [(h["revision"], h["outcome"]) for h in w.status["history"]]


# ---------------------------------------------------------------------------------------------- 4xx


def test_a_revision_that_answers_404_to_every_client_is_rolled_back_not_promoted():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    # every request to the new revision is a 404 (a renamed model); the stable's share is 0
    w.prom.values[new] = {CLIENT_ERRORS: 1.0}
    w.reconcile()
    w.run_for(10)
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st
    assert outcomes(w)[-1] == (new, "RolledBack")
    m = st["history"][-1]["measurement"]
    assert m["metric"] == CLIENT_ERRORS and m["value"] == 1.0 and m["threshold"] == 0.05
    assert w.pods_in_traffic(new) == 0 and w.pods_in_traffic(old) == 2


def test_a_client_error_share_like_the_stables_passes():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {CLIENT_ERRORS: 0.01}  # 1 point above the stable's 4xx share
    w.reconcile()
    w.run_for(40)
    assert w.status["stableRevision"] == new and outcomes(w)[-1] == (new, "Promoted")


# ---------------------------------------------------------------------------------------------- errors


def test_prometheus_down_holds_every_window_then_pauses_never_passes():
    w = World(canary_md(analysis={"onNoData": "pass", "errorLimit": 3}))
    w.deploy_first()
    new = w.new_version("2")
    w.prom.down = True
    w.reconcile()
    w.run_for(25)
    st = w.status
    # onNoData: pass does not apply to errors: held at step 0
    assert st["canaryRevision"] == new and st["step"] == 0 and st["phase"] == "Progressing"
    assert st["analysis"]["consecutiveErrors"] == 2
    w.run_for(10)
    st = w.status
    assert st["phase"] == "Paused" and st["step"] == 0
    assert w.cond("Progressing")["reason"] == "AnalysisPaused"
    assert "ConnectionError: refused" in w.cond("Progressing")["message"]
    paused = [
        e for e in w.fake.events if e["reason"] == "AnalysisPaused" and e["message"].startswith("revision")
    ]
    assert len(paused) == 1 and "sum(increase(modelserver_requests_total" in paused[0]["message"]
    # Prometheus is back: nothing is judged until a human resumes
    w.prom.down = False
    asked = len(w.prom.queries)
    w.run_for(60)
    assert w.status["step"] == 0 and len(w.prom.queries) == asked
    command(w, action="resume", revision=new)
    w.reconcile()
    # judged at once (its window is long over), and passed
    assert w.status["analysis"].get("pausedReason") is None and w.status["phase"] == "Progressing"
    assert w.status["step"] == 1
    assert [e["reason"] for e in w.fake.events].count("AnalysisResumed") == 1


def test_one_erroring_query_holds_the_window_whatever_the_others_say():
    w = World(canary_md(analysis={"onNoData": "pass"}))
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    real = w.prom.measure

    def p99_errors(queries):
        return [
            s if s.query.metric != "p99-latency-ms" else s.__class__(s.query, None, error="shape: 2 series")
            for s in real(queries)
        ]

    w.prom.measure = p99_errors  # type: ignore[method-assign]
    w.run_for(30)
    assert w.status["canaryRevision"] == new and w.status["step"] == 0
    errors = [m for m in w.status["analysis"]["measurements"] if m["verdict"] == "Error"]
    assert errors and errors[-1]["error"] == "shape: 2 series"


# ---------------------------------------------------------------------------------------------- off the path


def test_a_reconcile_never_waits_for_a_measurement_it_judges_the_finished_one_later():
    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.measurements.pending = True  # the measurement runs (Prometheus slow): the reconcile goes on
    w.run_for(30)
    st = w.status
    assert st["canaryRevision"] == new and st["step"] == 0 and w.prom.windows(new) == 0
    assert w.measurements.requests  # it was asked for, not waited on
    w.measurements.pending = False
    w.run_for(1)
    assert w.status["step"] == 1 and w.prom.windows(new) == 1


def test_the_query_timeout_and_prometheus_url_reach_the_measurement():
    w = World(canary_md(analysis={"queryTimeout": "3s", "prometheusURL": "https://prom.example:9090"}))
    w.deploy_first()
    w.new_version("2")
    w.reconcile()
    w.run_for(10)
    assert set(w.measurements.requests) == {("https://prom.example:9090", 3.0)}


# ---------------------------------------------------------------------------------------------- stable


def test_status_records_the_stable_spec_it_can_be_rebuilt_from():
    w = World()
    old = w.deploy_first()
    ann = deployment(w, old)["metadata"]["annotations"][b.ANNOTATION_REVISION_SPEC]  # type: ignore[index]
    assert json.loads(w.status["stableSpec"]) == json.loads(ann)


def test_the_stable_deployment_deleted_after_a_rollback_is_recreated_and_the_failed_revision_stays_out():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {CLIENT_ERRORS: 1.0}
    w.reconcile()
    w.run_for(10)
    assert outcomes(w)[-1] == (new, "RolledBack")
    before = outcomes(w)
    w.fake.objects.pop(("Deployment", "default", f"minilm-{old}"))  # by hand, or a GitOps prune
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == old and deployment(w, old) is not None
    assert w.cond("Degraded")["reason"] in ("RolledBack", "StableRecreated")
    assert [e for e in w.fake.events if e["reason"] == "StableRecreated"]
    w.run_for(30)
    assert w.pods_in_traffic(old) == 2 and w.pods_in_traffic(new) == 0
    assert outcomes(w) == before  # nothing promoted, nothing recorded twice


def test_the_stable_deployment_deleted_mid_canary_is_recreated_and_the_canary_goes_on():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.fake.objects.pop(("Deployment", "default", f"minilm-{old}"))
    w.rec.reconcile("default", "minilm")
    st = w.status
    assert (st["stableRevision"], st["canaryRevision"], st["step"]) == (old, new, 0)
    assert w.cond("Degraded")["reason"] == "StableRecreated" and deployment(w, old) is not None
    w.controllers()
    w.run_for(5)
    assert w.cond("Degraded")["status"] == "False" and w.pods_in_traffic(old) >= 1
    w.run_for(40)
    assert outcomes(w)[-1] == (new, "Promoted")


def test_an_unreadable_stable_annotation_is_not_a_missing_stable():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    deployment(w, old)["metadata"]["annotations"][b.ANNOTATION_REVISION_SPEC] = "{not json"  # type: ignore[index]
    w.reconcile()
    st = w.status
    assert (st["stableRevision"], st["canaryRevision"]) == (old, new)
    assert (new, "Promoted") not in outcomes(w)


def test_without_a_recorded_spec_a_rolled_back_revision_is_never_promoted_into_the_gap():
    w = World()
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {CLIENT_ERRORS: 1.0}
    w.reconcile()
    w.run_for(10)
    w.raw["status"].pop("stableSpec")  # a status written before stableSpec existed
    w.fake.objects.pop(("Deployment", "default", f"minilm-{old}"))
    w.reconcile()
    w.run_for(10)
    st = w.status
    assert st["stableRevision"] == old and w.pods_in_traffic(new) == 0
    assert w.cond("Degraded")["reason"] == "StableMissing"
    assert "promote --full" in w.cond("Degraded")["message"]
    assert (new, "Promoted") not in outcomes(w)
    # the explicit command puts it in anyway
    command(w, action="promote", revision=new, full=True)
    w.reconcile()
    w.run_for(2)
    assert w.status["stableRevision"] == new and outcomes(w)[-1] == (new, "Promoted")
    assert w.pods_in_traffic(new) == 2


def test_without_a_recorded_spec_a_healthy_current_revision_is_deployed_and_says_so():
    w = World()
    old = w.deploy_first()
    w.raw["status"].pop("stableSpec")
    new = w.new_version("2")
    w.fake.objects.pop(("Deployment", "default", f"minilm-{old}"))
    w.reconcile()
    h = w.status["history"][-1]
    assert (h["revision"], h["outcome"], h["kind"]) == (new, "Deployed", "Deployed")
    assert "no spec to rebuild it from" in h["reason"]
    w.run_for(60)
    assert w.prom.windows(new) == 0 and w.status["stableRevision"] == new
    assert REQUESTS  # the volume check exists; nothing was judged (no canary)
