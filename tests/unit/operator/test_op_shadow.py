"""The shadow stage as a spec: a new revision first answers copies of the stable's requests, out of
traffic, and is judged by the agreement of its answers before any user sees it -- the reconciler against
the in-memory apiserver, a fake clock and a fake Prometheus (md_canary.py). No sleeps, no network."""

from __future__ import annotations

import json
from typing import Any

import pytest
from md_canary import World, canary_md
from modeldeploy import builders as b
from modeldeploy.analysis import AGREEMENT, P99, SAMPLES, SHADOW_ERROR_RATE
from modeldeploy.api import CompareSpec, ShadowSpec
from modeldeploy.plan import shadow_annotations
from modeldeploy.rollout_types import COMMAND_ANNOTATION, Mirror, shadow_replicas
from modeldeploy.status import pod_facts

SHADOW = {"duration": "10s", "sampleRate": 0.2, "minSamples": 200, "minAgreement": 0.99}


def shadow_world(**rollout) -> World:
    shadow = {**SHADOW, **rollout.pop("shadow", {})}
    return World(canary_md(shadow=shadow, **rollout))


def annotations(w: World, revision: str) -> list[str | None]:
    return [(p["metadata"].get("annotations") or {}).get(b.ANNOTATION_SHADOW) for p in w.pods(revision)]


def shadow_windows(w: World, revision: str) -> list[str]:
    """The promql of every judged shadow window's sample count (one per window)."""
    return [
        q for r, m, q in w.prom.queries if r == revision and m == SAMPLES and "[" in q and "count" not in q
    ]


class Watch:
    """Runs the world, remembering the most pods of ``revision`` ever in traffic and the phases seen."""

    def __init__(self, w: World, revision: str) -> None:
        self.w, self.revision = w, revision
        self.max_in_traffic = 0
        self.phases: list[str] = []

    def run_for(self, seconds: int) -> None:
        for _ in range(seconds):
            self.w.run_for(1)
            self.max_in_traffic = max(self.max_in_traffic, self.w.pods_in_traffic(self.revision))
            phase = self.w.status.get("phase")
            if not self.phases or self.phases[-1] != phase:
                self.phases.append(phase)


def test_a_revision_that_agrees_shadows_out_of_traffic_then_goes_through_the_steps():
    w = shadow_world()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    st = w.status
    assert st["phase"] == "Shadowing" and st["canaryRevision"] == new and st["shadow"]["revision"] == new
    assert w.cond("Progressing")["reason"] == "Shadowing"
    # one warm shadow pod (2 replicas x 0.2, rounded up), out of traffic; both stable pods serve
    assert len(w.pods(new)) == 1 and w.pods_in_traffic(new) == 0 and w.pods_in_traffic(old) == 2
    # the stable pods copy to the shadow's revision Service, which publishes its not-ready pods
    svc = w.fake.obj("Service", f"minilm-{new}")
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert "publishNotReadyAddresses" not in w.fake.obj("Service", f"minilm-{old}")["spec"]
    # by the Service's DNS name, in the ModelDeployment's namespace: the URL the servers build themselves
    targets = {json.loads(a)["url"] for a in annotations(w, old)}
    assert targets == {f"http://minilm-{new}.default.svc.cluster.local:8080"}
    doc = json.loads(annotations(w, old)[0])
    assert (doc["revision"], doc["sampleRate"], doc["timeoutMs"]) == (new, 0.2, 5000.0)
    assert doc["compare"] == {
        "method": "auto", "minCosine": 0.99, "rtol": 0.001, "atol": 1e-05, "minTokenAgreement": 0.9,
    }  # fmt: skip
    assert annotations(w, new) == [None]
    assert st["shadow"]["startedAt"] and st["shadow"]["copyingPods"] == 2

    watch = Watch(w, new)
    watch.run_for(9)
    assert w.status["phase"] == "Shadowing" and shadow_windows(w, new) == []
    assert w.status["shadow"]["agreement"] == 1.0 and w.status["shadow"]["samples"] == 100
    watch.run_for(2)
    assert len(shadow_windows(w, new)) == 1 and "[10s]" in shadow_windows(w, new)[0]
    assert "ShadowPassed" in w.event_reasons()
    st = w.status
    assert "shadow" not in st and st["step"] == 0 and st["phase"] == "Progressing"
    assert annotations(w, old) == [None, None]  # no minAgreement: copying stops with the stage
    assert not w.fake.obj("Service", f"minilm-{new}")["spec"].get("publishNotReadyAddresses")
    watch.run_for(40)
    assert w.status["stableRevision"] == new
    assert [h["outcome"] for h in w.status["history"]] == ["Deployed", "Promoted"]
    assert watch.phases[0] == "Shadowing" and "Progressing" in watch.phases


def test_a_fast_200_and_wrong_revision_is_rolled_back_before_any_user_sees_it():
    w = shadow_world()
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {AGREEMENT: 0.42}
    w.reconcile()
    watch = Watch(w, new)
    watch.run_for(40)
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st and "shadow" not in st
    assert watch.max_in_traffic == 0  # never a user request
    assert st["phase"] == "Degraded" and w.cond("Degraded")["reason"] == "RolledBack"
    h = st["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "RolledBack")
    assert "shadow stage failed" in h["reason"] and "agreement" in h["reason"]
    m = h["measurement"]
    assert (m["metric"], m["value"], m["threshold"]) == (AGREEMENT, 0.42, 0.99)
    assert annotations(w, old) == [None, None]
    assert len(shadow_windows(w, new)) == 1


def test_a_shadow_that_errors_or_is_slow_is_judged_by_the_error_and_latency_rules():
    for values, metric in (({SHADOW_ERROR_RATE: 0.3}, SHADOW_ERROR_RATE), ({P99: 5000.0}, P99)):
        w = shadow_world()
        old = w.deploy_first()
        new = w.new_version("2")
        w.prom.values[new] = values
        w.reconcile()
        w.run_for(35)
        h = w.status["history"][-1]
        assert (h["revision"], h["outcome"], h["measurement"]["metric"]) == (new, "RolledBack", metric)
        assert w.status["stableRevision"] == old


def test_the_clock_starts_only_when_every_stable_server_copies_and_never_waits_forever():
    w = shadow_world(progressDeadline="60s")
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {"copying": 1.0}  # one of the two stable servers has not seen the annotation yet
    w.reconcile()
    w.run_for(20)
    st = w.status
    assert st["phase"] == "Shadowing" and "startedAt" not in st["shadow"] and st["shadow"]["copyingPods"] == 1
    assert "1 do" in w.cond("Progressing")["message"]
    w.prom.values[new] = {"copying": 2.0}
    w.run_for(1)
    assert w.status["shadow"]["startedAt"] and "ShadowCopying" in w.event_reasons()

    w = shadow_world(progressDeadline="60s")
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {"copying": 0.0}
    w.reconcile()
    w.run_for(65)
    h = w.status["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "Aborted")
    assert "shadow stage" in h["reason"] and "0/2 stable servers copying" in h["reason"]


def test_too_few_compared_requests_is_no_data_and_on_no_data_decides():
    w = shadow_world(analysis={"onNoData": "fail"})
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {SAMPLES: 50.0}
    w.reconcile()
    w.run_for(35)
    h = w.status["history"][-1]
    assert (h["outcome"], h["measurement"]["metric"]) == ("RolledBack", SAMPLES)
    assert "minSamples 200" in h["reason"]

    w = shadow_world(analysis={"onNoData": "hold", "noDataTimeout": "5m"})
    w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {SAMPLES: 50.0}
    w.reconcile()
    w.run_for(60)
    assert w.status["phase"] == "Shadowing"  # held: judged again every interval
    assert len(shadow_windows(w, new)) >= 3
    w.prom.values[new] = {}
    w.run_for(11)
    assert "ShadowPassed" in w.event_reasons()


def test_interval_shorter_than_duration_judges_interim_windows_with_a_scaled_sample_minimum():
    w = shadow_world(shadow={"duration": "30s"}, interval="10s")
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(31)
    windows = shadow_windows(w, new)
    assert [q.rsplit("[", 1)[1] for q in windows] == ["10s]))", "10s]))", "30s]))"]
    thresholds = [m["threshold"] for m in w.status["analysis"]["measurements"] if m["metric"] == SAMPLES]
    assert thresholds[-3:] == pytest.approx([200 / 3, 200 / 3, 200])


def test_an_interim_window_that_fails_rolls_back_at_once():
    w = shadow_world(shadow={"duration": "60s"}, interval="10s")
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {AGREEMENT: 0.5}
    w.reconcile()
    w.run_for(11)
    assert w.status["stableRevision"] == old and w.status["history"][-1]["outcome"] == "RolledBack"


def test_operator_restart_during_the_shadow_stage_resumes_with_one_decision():
    w = shadow_world()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(5)
    started = w.status["shadow"]["startedAt"]
    w.rec = w.new_operator()
    w.run_for(1)
    assert w.status["shadow"]["startedAt"] == started  # the clock is not restarted
    w.run_for(20)
    assert len(shadow_windows(w, new)) == 1
    assert w.event_reasons().count("ShadowPassed") == 1


def test_promote_skips_the_shadow_stage_and_a_stale_skip_changes_nothing():
    w = shadow_world()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.annotate(COMMAND_ANNOTATION, json.dumps({"action": "promote", "revision": new, "stage": "shadow"}))
    w.reconcile()
    st = w.status
    assert "shadow" not in st and st["step"] == 0 and "ShadowSkipped" in w.event_reasons()
    assert COMMAND_ANNOTATION not in (w.raw["metadata"].get("annotations") or {})
    w.run_for(3)
    w.annotate(COMMAND_ANNOTATION, json.dumps({"action": "promote", "revision": new, "stage": "shadow"}))
    w.reconcile()
    assert w.status["step"] == 0  # replayed after the stage ended: not a step promotion


def test_the_first_revision_has_nothing_to_shadow():
    w = shadow_world()
    rev = w.deploy_first()
    assert w.status["stableRevision"] == rev and "shadow" not in w.status and w.pods_in_traffic(rev) == 2


def test_min_agreement_keeps_comparing_during_the_steps_and_the_bake():
    w = shadow_world(analysis={"minAgreement": 0.98, "agreementSampleRate": 0.1})
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(12)
    assert w.status["step"] == 0 and "shadow" not in w.status
    doc = json.loads(annotations(w, old)[0])
    assert (doc["revision"], doc["sampleRate"]) == (new, 0.1)
    w.run_for(10)
    judged = [q for r, m, q in w.prom.queries if r == new and m == AGREEMENT and "shadow_revision" in q]
    assert any(f'shadow_revision="{new}"' in q for q in judged)
    w.prom.values[new] = {AGREEMENT: 0.9}
    w.run_for(10)
    h = w.status["history"][-1]
    assert (h["outcome"], h["measurement"]["metric"]) == ("RolledBack", AGREEMENT)


def test_min_agreement_during_bake_compares_the_new_stable_with_the_warm_previous():
    w = World(canary_md(analysis={"minAgreement": 0.98}, bakeTime="60s"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    for _ in range(60):
        w.run_for(1)
        if w.status.get("stableRevision") == new:
            break
    assert w.status["stableRevision"] == new and w.status["previousRevision"] == old
    w.reconcile()
    assert {json.loads(a)["revision"] for a in annotations(w, new)} == {old}
    assert w.fake.obj("Service", f"minilm-{old}")["spec"]["publishNotReadyAddresses"] is True
    w.prom.values[new] = {AGREEMENT: 0.5}
    w.run_for(11)
    h = w.status["history"][-1]
    assert (h["revision"], h["outcome"], h["measurement"]["metric"]) == (new, "FailedBack", AGREEMENT)


# ---------------------------------------------------------------------------------------------- pure


def test_shadow_replicas_cover_the_sampled_share():
    spec = ShadowSpec(duration="1m", sample_rate=0.2)
    assert [shadow_replicas(n, spec) for n in (1, 2, 5, 6, 10)] == [1, 1, 1, 2, 2]
    assert shadow_replicas(10, ShadowSpec(duration="1m", sample_rate=1.0)) == 10
    assert shadow_replicas(10, ShadowSpec(duration="1m", replicas=3)) == 3


def test_shadow_annotations_go_to_the_source_pods_only_and_are_removed_elsewhere():
    def pod(name: str, rev: str, ann: str | None = None, terminating: bool = False) -> dict:
        meta = {"name": name, "labels": {b.LABEL_REVISION: rev}, "annotations": {}}
        if ann:
            meta["annotations"][b.ANNOTATION_SHADOW] = ann
        if terminating:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {"metadata": meta, "status": {}}

    mirror = Mirror("a", "b", 0.2, 5000.0, CompareSpec())
    want = mirror.to_annotation("http://10.96.0.5:8080")
    facts = [
        pod_facts(p)
        for p in (
            pod("a1", "a"),
            pod("a2", "a", want),
            pod("b1", "b", "stale"),
            pod("a3", "a", terminating=True),
        )
    ]
    assert shadow_annotations(facts, mirror, "http://10.96.0.5:8080") == [("a1", want), ("b1", None)]
    assert shadow_annotations(facts, None, None) == [("a2", None), ("b1", None)]
    assert shadow_annotations(facts, mirror, None) == [("a2", None), ("b1", None)]  # no Service IP yet


def test_kubectl_modeldeploy_shows_the_live_agreement_and_promote_skips_the_stage():
    from modeldeploy import cli

    w = shadow_world()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(3)
    text = cli.render_status(w.raw, now=w.clock.now)
    assert "phase Shadowing" in text
    assert "shadow: agreement 1.0000 over 100 compared requests (minAgreement 0.99, minSamples 200)" in text
    assert cli.command_for("promote", w.raw) == {"action": "promote", "revision": new, "stage": "shadow"}
    assert cli.command_for("promote", w.raw, full=True)["full"] is True
    w.annotate(COMMAND_ANNOTATION, json.dumps(cli.command_for("promote", w.raw)))
    w.reconcile()
    assert "shadow" not in w.status and "shadow:" not in cli.render_status(w.raw, now=w.clock.now)


def test_a_shadow_whose_copies_all_fail_is_judged_failed_not_no_data():
    w = shadow_world(analysis={"onNoData": "hold", "noDataTimeout": "5m"})
    old = w.deploy_first()
    new = w.new_version("2")
    w.prom.values[new] = {SAMPLES: 0.0, AGREEMENT: None, SHADOW_ERROR_RATE: 1.0}
    w.reconcile()
    w.run_for(12)
    h = w.status["history"][-1]
    assert (h["revision"], h["outcome"], h["measurement"]["metric"]) == (new, "RolledBack", SHADOW_ERROR_RATE)
    assert w.status["stableRevision"] == old


def test_shadow_queries_read_the_stable_servers_copy_counts_of_that_revision():
    from modeldeploy.analysis import SHADOW_DROPPED, build_shadow_queries
    from modeldeploy.api import AnalysisSpec

    qs = {
        q.metric: q
        for q in build_shadow_queries(
            ShadowSpec(duration="5m", min_samples=200, min_agreement=0.99),
            AnalysisSpec(max_error_rate=0.02, max_p99_latency_ms=300),
            namespace="ns",
            name="m",
            revision="r2",
            interval="5m",
        )
    }
    assert set(qs) == {SAMPLES, AGREEMENT, SHADOW_ERROR_RATE, P99, SHADOW_DROPPED}
    for q in (qs[SAMPLES], qs[AGREEMENT], qs[SHADOW_ERROR_RATE]):
        assert 'shadow_revision="r2"' in q.promql and "[300s]" in q.promql
    assert 'result=~"agree|disagree"' in qs[SAMPLES].promql and qs[SAMPLES].threshold == 200
    assert qs[AGREEMENT].promql.startswith('sum(increase(modelserver_shadow_requests_total{namespace="ns",')
    assert (qs[AGREEMENT].kind, qs[AGREEMENT].threshold) == ("min", 0.99)
    assert (
        'result=~"error|timeout"' in qs[SHADOW_ERROR_RATE].promql and qs[SHADOW_ERROR_RATE].threshold == 0.02
    )
    assert 'modeldeploy_io_revision="r2"' in qs[P99].promql and qs[P99].threshold == 300
    assert qs[SHADOW_DROPPED].threshold is None and qs[SHADOW_DROPPED].optional


def generation_world(**shadow: Any) -> World:
    body = canary_md(shadow={**SHADOW, "compare": {"method": "tokenAgreement"}, **shadow})
    body["spec"]["model"]["task"] = "generation"
    body["spec"]["rollout"]["analysis"] = {"maxTTFTP99Ms": 400}
    return World(body)


def test_a_generative_revision_that_writes_otherwise_is_rolled_back_in_the_shadow_stage():
    w = generation_world()
    old = w.deploy_first()
    model = {"name": "tiny-llama", "version": "2", "uri": "file:///models/llama", "task": "generation"}
    new = w.edit(model=model)
    w.prom.values[new] = {AGREEMENT: 0.1}
    w.reconcile()
    watch = Watch(w, new)
    watch.run_for(4)
    # the stable servers are told to compare by tokens
    told = [json.loads(a) for a in annotations(w, old) if a]
    assert told and all(t["compare"]["method"] == "tokenAgreement" for t in told), told
    watch.run_for(36)
    st = w.status
    assert st["stableRevision"] == old and watch.max_in_traffic == 0
    h = st["history"][-1]
    assert (h["revision"], h["outcome"], h["measurement"]["metric"]) == (new, "RolledBack", AGREEMENT)
    assert "agreement" in h["reason"] and h["measurement"]["value"] == 0.1


def test_the_stable_generation_servers_are_told_to_compare_tokens_with_the_threshold():
    mirror = Mirror("r1", "r2", 0.2, 5000.0, CompareSpec(method="tokenAgreement", min_token_agreement=0.8))
    doc = json.loads(mirror.to_annotation("http://m-r2.ns.svc.cluster.local:8080"))
    assert doc["compare"]["method"] == "tokenAgreement" and doc["compare"]["minTokenAgreement"] == 0.8


def test_a_generative_shadow_is_judged_by_first_token_latency_not_request_latency():
    from modeldeploy.analysis import TTFT, build_shadow_queries
    from modeldeploy.api import AnalysisSpec

    spec = ShadowSpec(duration="5m")
    analysis = AnalysisSpec(max_ttft_p99_ms=400)
    kw: dict[str, Any] = {"namespace": "ns", "name": "m", "revision": "r2", "interval": "5m"}
    gen = {q.metric: q for q in build_shadow_queries(spec, analysis, generation=True, **kw)}
    assert P99 not in gen and gen[TTFT].threshold == 400
    assert "modelserver_generation_time_to_first_token_seconds_bucket" in gen[TTFT].promql
    assert P99 in {q.metric for q in build_shadow_queries(spec, analysis, **kw)}


@pytest.mark.parametrize(
    ("task", "method", "message"),
    [
        ("generation", "cosine", "cosine compares tensors; for task generation use exact or tokenAgreement"),
        ("generation", "allclose", "allclose compares tensors"),
        ("embedding", "tokenAgreement", "tokenAgreement only for spec.model.task generation"),
    ],
)
def test_a_comparison_the_tasks_server_cannot_make_is_refused_naming_the_field(task, method, message):
    from modeldeploy.api import ModelDeployment
    from pydantic import ValidationError

    body = canary_md(shadow={**SHADOW, "compare": {"method": method}})
    body["spec"]["model"]["task"] = task
    with pytest.raises(ValidationError, match=f"spec.rollout.shadow.compare.method: {message}"):
        ModelDeployment.from_api(body)
    body["spec"]["rollout"]["shadow"]["compare"]["method"] = "auto"
    assert ModelDeployment.from_api(body).spec.rollout.shadow is not None  # auto is the task's own method
