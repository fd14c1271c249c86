"""``kubectl modeldeploy dashboard`` (modeldeploy/dashboard.py): the JSON the page draws, shaped from a
ModelDeployment by pure functions, and the local server's rules (127.0.0.1, GET only, its own Host
names, nothing from elsewhere). The page itself, in a browser during a real rollout:
tests/e2e/test_dashboard.py."""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from modeldeploy import cli, dashboard
from modeldeploy.dashboard import (
    charts,
    focus_revision,
    make_server,
    shape_list,
    shape_modeldeployment,
    window_verdict,
    windows,
)
from modeldeploy.dashboard_page import PAGE_CSS, PAGE_HTML, PAGE_JS
from modeldeploy.kube import KubeError

T1, T2, T3 = "2025-05-01T10:00:10Z", "2025-05-01T10:00:24Z", "2025-05-01T10:00:38Z"
NOW = datetime(2025, 5, 1, 10, 1, tzinfo=UTC)


def m(metric: str, verdict: str, value: float | None = 1.0, **kw: Any) -> dict[str, Any]:
    return {
        "metric": metric,
        "query": f"q_{metric}",
        "value": value,
        "threshold": kw.pop("threshold", 2.0),
        "verdict": verdict,
        "revision": kw.pop("revision", "c2"),
        "time": kw.pop("time", T1),
        **kw,
    }


def judged(
    metric: str, verdict: str, time: str, canary: float, stable: float, limit: float
) -> dict[str, Any]:
    j = {"canary": canary, "stable": stable, "canarySamples": 7, "stableSamples": 7, "low": 0.1}
    j |= {"high": 0.3, "pValue": 0.001, "reason": ""}
    return m(metric, verdict, value=canary / stable - 1, threshold=limit, time=time, judge=j)


def md(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "echo", "generation": 3},
        "spec": {"model": {"name": "echo", "version": "2"}, "rollout": {"steps": [25, 50, 100]}},
        "status": {"observedGeneration": 3, **status},
    }


# ------------------------------------------------------------------------------- a window's verdict


def test_a_window_fails_when_a_decisive_measurement_fails() -> None:
    assert (
        window_verdict([m("requests", "Pass"), m("error-rate", "Fail"), m("p99-latency-ms", "Pass")])
        == "Fail"
    )


def test_a_dry_run_measurement_never_decides_a_window() -> None:
    assert window_verdict([m("requests", "Pass"), m("p99-latency-ms", "Fail", dryRun=True)]) == "Pass"


def test_an_erroring_query_makes_the_window_an_error_whatever_else_failed() -> None:
    assert window_verdict([m("requests", "Pass"), m("error-rate", "Fail"), m("custom", "Error")]) == "Error"


def test_too_few_requests_make_a_window_no_data_even_with_a_failed_check() -> None:
    assert window_verdict([m("requests", "NoData"), m("error-rate", "Fail")]) == "NoData"


def test_a_shadow_whose_copies_fail_is_judged_failed_however_few_were_compared() -> None:
    ms = [m("shadow-samples", "NoData"), m("shadow-error-rate", "Fail")]
    assert window_verdict(ms) == "Fail"


def test_an_inconclusive_judge_holds_the_window_when_nothing_failed() -> None:
    assert window_verdict([m("requests", "Pass"), m("judge-latency-ms", "Inconclusive")]) == "Inconclusive"


# ------------------------------------------------------------------------------- the current rollout


def test_the_current_rollout_is_the_canary_while_there_is_one() -> None:
    st = {"canaryRevision": "c2", "analysis": {"measurements": [m("requests", "Pass", revision="old")]}}
    assert focus_revision(st) == "c2"


def test_after_a_rollback_the_current_rollout_is_the_revision_measured_last() -> None:
    ms = [m("requests", "Pass", revision="a1", time=T1), m("requests", "Fail", revision="b2", time=T2)]
    assert focus_revision({"stableRevision": "a1", "analysis": {"measurements": ms}}) == "b2"


def test_a_shadow_stage_is_the_current_rollout() -> None:
    assert focus_revision({"shadow": {"revision": "s3"}}) == "s3"


def test_nothing_measured_and_no_canary_is_no_current_rollout() -> None:
    assert focus_revision({"stableRevision": "a1"}) is None


def test_windows_group_the_revisions_measurements_by_time_oldest_first() -> None:
    ms = [
        m("requests", "Pass", time=T2),
        m("error-rate", "Fail", time=T2),
        m("requests", "Pass", time=T1),
        m("error-rate", "Pass", time=T1),
        m("error-rate", "Pass", time=T1, revision="stable1"),
    ]
    ws = windows(ms, "c2")
    assert [(w["time"], w["verdict"]) for w in ws] == [(T1, "Pass"), (T2, "Fail")]
    assert [x["metric"] for x in ws[0]["measurements"]] == ["requests", "error-rate"]
    assert ws[1]["measurements"][1]["query"] == "q_error-rate"


# ------------------------------------------------------------------------------- charts


def test_a_threshold_metric_charts_the_canary_the_stable_in_the_same_window_and_the_threshold() -> None:
    ms = [
        m("p99-latency-ms", "Pass", value=10.0, threshold=250.0, time=T1),
        m("p99-latency-ms", "Pass", value=8.0, threshold=250.0, time=T1, revision="a1"),
        m("p99-latency-ms", "Fail", value=300.0, threshold=250.0, time=T2),
    ]
    (chart,) = charts(ms, "c2", "a1")
    assert chart["metric"] == "p99-latency-ms" and chart["kind"] == "threshold"
    assert [(p["time"], p["canary"], p["stable"], p["threshold"], p["verdict"]) for p in chart["points"]] == [
        (T1, 10.0, 8.0, 250.0, "Pass"),
        (T2, 300.0, None, 250.0, "Fail"),
    ]


def test_a_judge_latency_chart_draws_both_medians_and_the_most_the_canary_may_take() -> None:
    ms = [
        judged("judge-latency-ms", "Pass", T1, 21.0, 20.0, 0.25),
        judged("judge-latency-ms", "Fail", T2, 30.0, 20.0, 0.25),
    ]
    (chart,) = charts(ms, "c2", "a1")
    assert chart["kind"] == "judge"
    first, second = chart["points"]
    assert (first["canary"], first["stable"], first["threshold"]) == (21.0, 20.0, pytest.approx(25.0))
    assert second["verdict"] == "Fail" and second["increase"] == pytest.approx(0.5)


def test_a_judge_error_share_is_allowed_an_absolute_increase() -> None:
    (chart,) = charts([judged("judge-error-rate", "Fail", T1, 0.2, 0.01, 0.01)], "c2", "a1")
    assert chart["points"][0]["threshold"] == pytest.approx(0.02)


def test_charts_are_per_metric_of_the_current_rollout_only() -> None:
    ms = [
        m("error-rate", "Pass", time=T1),
        m("requests", "Pass", time=T1),
        m("error-rate", "Pass", revision="x"),
    ]
    assert [c["metric"] for c in charts(ms, "c2", None)] == ["error-rate", "requests"]


def test_a_dry_run_point_is_marked() -> None:
    (chart,) = charts([m("p99-latency-ms", "Fail", dryRun=True)], "c2", None)
    assert chart["points"][0]["dryRun"] is True


# ------------------------------------------------------------------------------- a ModelDeployment


def rolling_back() -> dict[str, Any]:
    failing = m("error-rate", "Fail", value=0.21, threshold=0.05, time=T3)
    return md(
        phase="Degraded",
        revision="c2",
        stableRevision="a1",
        revisions=[
            {"revision": "a1", "role": "stable", "replicas": 3, "inTrafficReplicas": 3, "modelVersion": "1"},
            {"revision": "c2", "role": "old", "replicas": 0, "inTrafficReplicas": 0, "modelVersion": "2"},
        ],
        conditions=[{"type": "Degraded", "status": "True", "reason": "RolledBack", "message": "x"}],
        analysis={"consecutiveFailures": 2, "measurements": [m("requests", "Pass", time=T3), failing]},
        history=[
            {"revision": "a1", "outcome": "Deployed", "time": T1, "reason": "first"},
            {
                "revision": "c2",
                "outcome": "RolledBack",
                "time": T3,
                "reason": "error-rate",
                "measurement": failing,
            },
        ],
    )


def test_a_canary_at_its_first_step_shows_its_step_of_the_steps_and_both_weights() -> None:
    view = shape_modeldeployment(
        md(
            phase="Progressing",
            canaryRevision="c2",
            stableRevision="a1",
            step=0,
            canaryWeight=25,
            achievedCanaryWeight=20,
        )
    )
    assert view["step"] == {"index": 0, "count": 3, "weight": 25, "paused": False}
    assert (view["canaryWeight"], view["achievedCanaryWeight"]) == (25, 20)
    assert view["analysis"]["revision"] == "c2" and view["analysis"]["windows"] == []


def test_a_rolled_back_deployment_shows_no_step_the_failing_window_and_the_history_with_its_measurement() -> (
    None
):
    view = shape_modeldeployment(rolling_back())
    assert view["step"] is None and view["phase"] == "Degraded"
    assert [(r["revision"], r["role"], r["inTrafficReplicas"]) for r in view["revisions"]] == [
        ("a1", "stable", 3),
        ("c2", "old", 0),
    ]
    assert view["analysis"]["revision"] == "c2"
    assert [w["verdict"] for w in view["analysis"]["windows"]] == ["Fail"]
    last = view["history"][-1]
    assert last["outcome"] == "RolledBack" and last["measurement"]["metric"] == "error-rate"
    assert last["measurement"]["value"] == 0.21 and last["measurement"]["threshold"] == 0.05
    assert view["history"][0]["measurement"] is None


def test_a_deployment_without_status_yet_is_shown_empty() -> None:
    view = shape_modeldeployment({"metadata": {"namespace": "ns", "name": "new"}, "spec": {}})
    assert view["phase"] is None and view["revisions"] == [] and view["history"] == []
    assert view["steps"] == [5, 25, 50, 100] and view["analysis"]["charts"] == []


def test_the_answer_lists_every_deployment_by_namespace_and_name() -> None:
    items = [
        {"metadata": {"namespace": "b", "name": "x"}},
        {"metadata": {"namespace": "a", "name": "z"}},
        {"metadata": {"namespace": "a", "name": "y"}},
    ]
    answer = shape_list(items, None, NOW)
    assert [(i["namespace"], i["name"]) for i in answer["items"]] == [("a", "y"), ("a", "z"), ("b", "x")]
    assert answer["time"] == "2025-05-01T10:01:00Z" and answer["error"] is None
    assert json.loads(json.dumps(answer)) == answer  # plain JSON


# ------------------------------------------------------------------------------- the server


@pytest.fixture
def served() -> Iterator[tuple[int, list[Any]]]:
    """The dashboard's server over a list the test controls (an exception in it: the apiserver failing)."""
    source: list[Any] = [[rolling_back()]]

    def fetch() -> list[dict[str, Any]]:
        if isinstance(source[0], Exception):
            raise source[0]
        return list(source[0])

    server = make_server(fetch, "ns", 0)
    assert server.server_address[0] == "127.0.0.1"
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    try:
        yield server.server_port, source
    finally:
        server.shutdown()
        server.server_close()


def request(port: int, method: str, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.putrequest(method, path, skip_host=True)
    conn.putheader("Host", host or f"127.0.0.1:{port}")
    conn.endheaders()
    r = conn.getresponse()
    out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    conn.close()
    return out


def test_the_json_endpoint_answers_the_shaped_list(served: tuple[int, list[Any]]) -> None:
    port, _ = served
    code, headers, body = request(port, "GET", "/api/modeldeployments")
    assert code == 200 and headers["content-type"] == "application/json"
    answer = json.loads(body)
    assert answer["namespace"] == "ns" and answer["items"][0]["history"][-1]["outcome"] == "RolledBack"


def test_the_page_its_script_and_style_are_served_with_a_policy_that_allows_nothing_else(
    served: tuple[int, list[Any]],
) -> None:
    port, _ = served
    for path, ctype in (
        ("/", "text/html"),
        ("/dashboard.js", "text/javascript"),
        ("/dashboard.css", "text/css"),
    ):
        code, headers, _ = request(port, "GET", path)
        assert code == 200 and headers["content-type"].startswith(ctype), path
        csp = headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "connect-src 'self'" in csp
        assert headers["x-content-type-options"] == "nosniff"
    assert request(port, "GET", "/etc/passwd")[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
def test_the_server_is_read_only(served: tuple[int, list[Any]], method: str) -> None:
    code, headers, _ = request(served[0], method, "/api/modeldeployments")
    assert code == 405 and headers["allow"] == "GET"


@pytest.mark.parametrize("host", ["evil.example:8090", "127.0.0.1.nip.io", "attacker.test"])
def test_a_page_served_under_another_name_cannot_read_the_cluster(
    served: tuple[int, list[Any]], host: str
) -> None:
    """DNS rebinding: a site whose name resolves to 127.0.0.1 sends its own name as Host."""
    code, _, body = request(served[0], "GET", "/api/modeldeployments", host=host)
    assert code == 403 and b"RolledBack" not in body


def test_localhost_is_a_name_of_the_server(served: tuple[int, list[Any]]) -> None:
    assert request(served[0], "GET", "/", host=f"localhost:{served[0]}")[0] == 200


def test_an_apiserver_error_is_shown_by_the_page_not_a_dead_server(
    served: tuple[int, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, source = served
    monkeypatch.setattr(dashboard, "CACHE_S", 0.0)
    source[0] = KubeError(403, {"message": "modeldeployments is forbidden: User cannot list"})
    code, _, body = request(port, "GET", "/api/modeldeployments")
    answer = json.loads(body)
    assert code == 200 and "forbidden" in answer["error"] and answer["items"] == []


# ------------------------------------------------------------------------------- the page and the plugin


def test_the_page_never_parses_cluster_strings_as_html() -> None:
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in PAGE_JS, sink


def test_the_page_loads_nothing_from_anywhere_else() -> None:
    urls = re.findall(r"(?:https?:)?//[\w.-]+", PAGE_HTML + PAGE_JS + PAGE_CSS)
    assert urls == ["http://www.w3.org"], urls  # the SVG namespace name, never fetched


def test_the_plugin_has_a_dashboard_command_for_one_namespace_or_all() -> None:
    args = cli.build_parser().parse_args(["dashboard", "-n", "team-a", "--port", "0"])
    assert args.func is dashboard.run and args.namespace == "team-a" and args.port == 0
    default = cli.build_parser().parse_args(["dashboard"])
    assert default.namespace is None and default.port == dashboard.DEFAULT_PORT
