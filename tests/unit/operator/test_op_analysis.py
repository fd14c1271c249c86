"""The pure parts of progressive delivery: queries, verdicts, the no-data policy, replica splits,
readiness-gate choices and HTTPRoute weights."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from md_cases import BASE_MD
from modeldeploy.analysis import (
    CLIENT_ERRORS,
    ERROR_RATE,
    P99,
    RATIO,
    REQUESTS,
    TPOT,
    TTFT,
    Sample,
    advance,
    build_queries,
    judge,
    render,
    window,
)
from modeldeploy.api import AnalysisSpec, ModelDeployment
from modeldeploy.rollout_types import Target
from modeldeploy.routing import backend_weights, build_httproute
from modeldeploy.status import PodFacts
from modeldeploy.traffic_split import pod_gates, replica_split

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def qs(spec: AnalysisSpec | None = None, stable: str | None = "s1"):
    return build_queries(
        spec or AnalysisSpec(), namespace="ns", name="m", revision="c1", stable=stable, interval="10s"
    )


def samples(spec: AnalysisSpec | None = None, **values):
    base = {REQUESTS: 100.0, ERROR_RATE: 0.0, P99: 50.0, RATIO: 1.0, CLIENT_ERRORS: 0.0}
    base.update({k.replace("_", "-"): v for k, v in values.items()})
    return [Sample(q, base.get(q.metric)) for q in qs(spec)]


def test_queries_select_the_revision_and_window():
    q = {x.metric: x for x in qs()}
    assert set(q) == {REQUESTS, ERROR_RATE, P99, CLIENT_ERRORS}  # no ratio unless asked for
    sel = 'namespace="ns",modeldeploy_io_name="m",modeldeploy_io_revision="c1"'
    assert q[REQUESTS].promql == f"sum(increase(modelserver_requests_total{{{sel}}}[10s]))"
    # the server's own failures: 5xx and admission control's 413/429
    assert 'code=~"5..|413|429"' in q[ERROR_RATE].promql and "or vector(0)" in q[ERROR_RATE].promql
    assert "histogram_quantile(0.99" in q[P99].promql and "* 1000" in q[P99].promql
    ratio = {x.metric: x for x in qs(AnalysisSpec(max_latency_ratio_to_stable=2))}[RATIO]
    assert 'modeldeploy_io_revision="s1"' in ratio.promql and ratio.optional
    assert RATIO not in {x.metric for x in qs(AnalysisSpec(max_latency_ratio_to_stable=2), stable=None)}


def test_window_and_template_rendering():
    assert window("1m") == "60s" and window("1s") == "2s" and window("1500ms") == "2s"
    t = 'x{ns="{{namespace}}",n="{{ name }}",r="{{revision}}"}[{{interval}}]'
    assert render(t, namespace="a", name="b", revision="c", interval="9s") == 'x{ns="a",n="b",r="c"}[9s]'


@pytest.mark.parametrize(
    ("values", "verdict", "failing"),
    [
        ({}, "Pass", None),
        ({"error_rate": 0.2}, "Fail", ERROR_RATE),
        ({"p99_latency_ms": 5000.0}, "Fail", P99),
        ({"requests": 5.0}, "NoData", REQUESTS),
        ({"requests": 5.0, "error_rate": 1.0}, "NoData", REQUESTS),  # too few requests to judge at all
        ({"requests": None}, "NoData", REQUESTS),
        ({"p99_latency_ms": None}, "NoData", P99),
    ],
)
def test_judge(values, verdict, failing):
    j = judge(samples(**values), T0)
    assert j.verdict == verdict
    assert (j.failing.metric if j.failing else None) == failing


def test_client_errors_are_judged_against_the_stables_share_in_the_same_window():
    q = {x.metric: x for x in qs()}[CLIENT_ERRORS]
    assert q.threshold == 0.05 and q.kind == "max"
    # the canary's 4xx share minus the stable's; 413 and 429 are the server's own, not the client's
    assert q.promql.count('code=~"4..",code!~"413|429"') == 2
    assert 'modeldeploy_io_revision="c1"' in q.promql and 'modeldeploy_io_revision="s1"' in q.promql
    # a revision that answers 404 to every client fails the window
    j = judge(samples(client_error_rate_increase=1.0), T0)
    assert j.verdict == "Fail" and j.failing is not None and j.failing.metric == CLIENT_ERRORS
    assert judge(samples(client_error_rate_increase=0.05), T0).verdict == "Pass"


def test_the_client_error_check_needs_a_stable_and_is_turned_off_at_1():
    assert CLIENT_ERRORS not in {x.metric for x in qs(stable=None)}
    assert CLIENT_ERRORS not in {x.metric for x in qs(AnalysisSpec(max_client_error_rate_increase=1))}
    assert CLIENT_ERRORS in {x.metric for x in qs(AnalysisSpec(max_client_error_rate_increase=0))}


def test_a_query_error_is_an_error_not_no_data_and_never_a_pass():
    bad = [
        Sample(q, None, error="refused: connection refused") if q.metric == P99 else s
        for q, s in zip(qs(), samples(), strict=True)
    ]
    j = judge(bad, T0)
    assert j.verdict == "Error" and j.failing is not None and j.failing.metric == P99
    assert j.failing.error == "refused: connection refused"
    for policy in ("pass", "hold", "fail"):  # onNoData governs no data only
        out = advance(AnalysisSpec(on_no_data=policy), None, j, T0)
        assert out.action == "hold" and out.verdict == "Error", policy
        assert out.state.consecutive_failures == 0 and out.state.no_data_since is None


def test_error_limit_consecutive_errors_pause_and_a_good_window_resets_the_count():
    spec = AnalysisSpec(error_limit=3)
    err = judge([Sample(q, None, error="timeout: no answer within 10s") for q in qs()], T0)
    good = judge(samples(), T0)
    o1 = advance(spec, None, err, T0)
    o2 = advance(spec, o1.state, err, T0)
    assert (o1.action, o2.action, o2.state.consecutive_errors) == ("hold", "hold", 2)
    assert advance(spec, o2.state, good, T0).state.consecutive_errors == 0
    o3 = advance(spec, o2.state, err, T0)
    assert o3.action == "pause" and o3.state.paused_reason is not None
    # the reason names the failing query and why
    assert "timeout: no answer within 10s" in o3.state.paused_reason and "requests" in o3.state.paused_reason


def test_errors_do_not_touch_the_failure_count():
    spec = AnalysisSpec(failure_limit=2)
    bad = judge(samples(error_rate=0.5), T0)
    err = judge([Sample(q, None, error="http: HTTP 503") for q in qs()], T0)
    o = advance(spec, None, bad, T0)
    o = advance(spec, o.state, err, T0)
    assert o.action == "hold" and o.state.consecutive_failures == 1
    assert advance(spec, o.state, bad, T0).action == "fail"


def test_missing_stable_ratio_does_not_block_a_pass():
    spec = AnalysisSpec(max_latency_ratio_to_stable=2)
    j = judge(
        [
            Sample(q, None if q.metric == RATIO else s.value)
            for q, s in zip(qs(spec), samples(spec), strict=True)
        ],
        T0,
    )
    assert j.verdict == "Pass"


def test_failure_limit_counts_consecutive_failures():
    spec = AnalysisSpec(failure_limit=3)
    bad = judge(samples(error_rate=0.5), T0)
    good = judge(samples(), T0)
    o1 = advance(spec, None, bad, T0)
    o2 = advance(spec, o1.state, bad, T0)
    assert (o1.action, o2.action, o2.state.consecutive_failures) == ("hold", "hold", 2)
    o3 = advance(spec, o2.state, good, T0)
    assert o3.action == "pass" and o3.state.consecutive_failures == 0
    o = None
    state = o3.state
    for _ in range(3):
        o = advance(spec, state, bad, T0)
        state = o.state
    assert o is not None and o.action == "fail"


def test_no_data_hold_then_fail_after_timeout():
    spec = AnalysisSpec(on_no_data="hold", no_data_timeout="30s")
    nd = judge(samples(requests=1.0), T0)
    o = advance(spec, None, nd, T0)
    assert o.action == "hold" and o.state.no_data_since == T0
    o = advance(spec, o.state, nd, T0 + timedelta(seconds=29))
    assert o.action == "hold"
    o = advance(spec, o.state, nd, T0 + timedelta(seconds=30))
    assert o.action == "fail" and "noDataTimeout" in o.reason


@pytest.mark.parametrize(("policy", "action"), [("pass", "pass"), ("fail", "fail")])
def test_no_data_policies(policy, action):
    o = advance(AnalysisSpec(on_no_data=policy), None, judge(samples(requests=0.0), T0), T0)
    assert o.action == action


def test_measurements_are_kept_per_metric_up_to_the_retention():
    st = None
    spec = AnalysisSpec(measurementRetention=3)
    for i in range(20):
        st = advance(spec, st, judge(samples(), T0 + timedelta(seconds=i)), T0).state
    assert st is not None
    per_metric: dict[str, list[datetime]] = {}
    for m in st.measurements:
        per_metric.setdefault(m.metric, []).append(m.time)
    newest = [T0 + timedelta(seconds=i) for i in (17, 18, 19)]
    assert per_metric and all(times == newest for times in per_metric.values()), per_metric


@pytest.mark.parametrize(
    ("replicas", "weight", "split"),
    [
        (1, 5, (1, 1)),
        (2, 25, (1, 2)),
        (2, 50, (1, 1)),
        (4, 25, (1, 3)),
        (4, 50, (2, 2)),
        (10, 5, (1, 10)),
        (10, 25, (3, 9)),
        (3, 100, (3, 0)),
        (0, 50, (0, 0)),
    ],
)
def test_replica_split(replicas, weight, split):
    assert replica_split(replicas, weight) == split


def split_by_search(replicas: int, weight: int) -> tuple[int, int]:
    """The rule replica_split implements, by trying every (c, s): the reference for its linear search."""
    best = min(
        (round(abs(100 * c / (c + s) - weight), 9), c, -s, s)
        for c in range(1, replicas + 1)
        for s in range(1, replicas + 1)
        if c + s >= replicas
    )
    return best[1], best[3]


def test_replica_split_is_the_best_pair_of_all():
    for replicas in range(1, 41):
        for weight in range(1, 100):
            assert replica_split(replicas, weight) == split_by_search(replicas, weight), (replicas, weight)
    for replicas, weight in ((1000, 1), (1000, 33), (997, 50), (1000, 99)):
        c, s = replica_split(replicas, weight)  # the API allows 1000: linear, not a million pairs
        assert c >= 1 and s >= 1 and c + s >= replicas and abs(100 * c / (c + s) - weight) < 0.1


def _pod(name, rev, gate, ready=True, terminating=False):
    return PodFacts(name, rev, terminating, "Running", False, None, ready, ready and gate == "True", gate)


def test_pod_gates_keep_pods_in_traffic_and_take_out_extras():
    facts = [
        _pod("a-1", "a", "True"),
        _pod("a-2", "a", "True"),
        _pod("a-3", "a", None),
        _pod("b-1", "b", None, ready=False),
        _pod("b-2", "b", None),
        _pod("gone-1", "gone", "True"),
        _pod("stray-1", "stray", None),
        _pod("a-0", "a", "True", terminating=True),
    ]
    spec = ModelDeployment.from_api(BASE_MD).spec
    targets = [Target("a", spec, 3, "stable", 1), Target("b", spec, 2, "canary", 1)]
    assert pod_gates(facts, targets) == [
        ("a-2", False),
        ("a-3", False),
        ("b-1", False),
        ("b-2", True),  # the ready one first
        ("gone-1", False),  # a revision on its way out leaves traffic
    ]


def test_httproute_weights():
    assert backend_weights("s", None, None) == [("s", 100)]
    assert backend_weights("s", "c", 25) == [("s", 75), ("c", 25)]
    body = {
        **BASE_MD,
        "spec": {
            **BASE_MD["spec"],
            "rollout": {
                "trafficRouting": {"mode": "gatewayAPI", "gatewayAPI": {"parentRefs": [{"name": "gw"}]}}
            },
        },
    }
    route = build_httproute(ModelDeployment.from_api(body), "s", "c", 30)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    refs = route["spec"]["rules"][0]["backendRefs"]
    assert [(r["name"], r["port"], r["weight"]) for r in refs] == [
        ("minilm-s", 8080, 70),
        ("minilm-c", 8080, 30),
    ]
    assert route["metadata"]["ownerReferences"][0]["uid"] == "md-uid-1"


def test_the_canary_example_parses_and_renders_its_custom_metric():
    import yaml
    from md_cases import REPO

    body = yaml.safe_load((REPO / "examples" / "canary-echo.yaml").read_text())
    md = ModelDeployment.from_api({**body, "metadata": {**body["metadata"], "namespace": "prod"}})
    q = {
        x.metric: x
        for x in build_queries(
            md.spec.rollout.analysis,
            namespace="prod",
            name="echo",
            revision="r1",
            stable="r0",
            interval="30s",
        )
    }
    assert set(q) == {REQUESTS, ERROR_RATE, P99, RATIO, CLIENT_ERRORS, "queue-wait-p99-ms"}
    assert 'modeldeploy_io_revision="r1"}[30s]' in q["queue-wait-p99-ms"].promql
    assert "{{" not in q["queue-wait-p99-ms"].promql and q["queue-wait-p99-ms"].threshold == 50


def test_generation_is_judged_by_first_token_and_per_token_latency_not_by_request_latency():
    spec = AnalysisSpec.model_validate({"maxTTFTP99Ms": 500, "maxTimePerOutputTokenP99Ms": 40})
    gen = {
        q.metric: q
        for q in build_queries(
            spec, namespace="ns", name="m", revision="c1", stable="s1", interval="10s", generation=True
        )
    }
    assert set(gen) == {REQUESTS, ERROR_RATE, TTFT, TPOT, CLIENT_ERRORS}
    assert (gen[TTFT].threshold, gen[TPOT].threshold) == (500.0, 40.0)
    assert "modelserver_generation_time_to_first_token_seconds_bucket" in gen[TTFT].promql
    assert "modelserver_generation_time_per_output_token_seconds_bucket" in gen[TPOT].promql
    assert 'modeldeploy_io_revision="c1"' in gen[TTFT].promql and "* 1000" in gen[TTFT].promql
    # unset thresholds: not asked; an encoder is never asked them
    bare = build_queries(
        AnalysisSpec(), namespace="ns", name="m", revision="c1", stable="s1", interval="10s", generation=True
    )
    assert {q.metric for q in bare} == {REQUESTS, ERROR_RATE, CLIENT_ERRORS}
    assert not {TTFT, TPOT} & {q.metric for q in qs(spec)}
