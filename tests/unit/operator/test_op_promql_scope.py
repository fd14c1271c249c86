"""A custom analysis query reads its own namespace only (issue 24, finding 6): the author of a
ModelDeployment in ``team-a`` tries to read ``team-b``'s series through the operator's Prometheus
identity, and every way of writing it is refused with the field named; what Prometheus runs is the
expression that was checked."""

from __future__ import annotations

import copy

import pytest
from md_fakekube import FakeKube
from modeldeploy.analysis import build_queries
from modeldeploy.api import ModelDeployment
from modeldeploy.promql_scope import ScopeError, scoped
from modeldeploy.reconciler import Reconciler
from pydantic import ValidationError

OWN = 'rate(modelserver_requests_total{namespace="team-a",modeldeploy_io_name="m"}[1m])'


@pytest.mark.parametrize(
    "query",
    [
        'sum(rate(modelserver_requests_total{namespace="team-b"}[1m]))',  # another namespace, plainly
        "sum(rate(modelserver_requests_total[1m]))",  # every namespace
        "up",
        'sum(rate(x{namespace=~"team-a|team-b"}[1m]))',  # a regex that also matches the victim
        'sum(rate(x{namespace!="team-a"}[1m]))',
        'x{namespace="team-a"} + on() group_left x{namespace="team-b"}',  # one side of a join
        f'{OWN} or absent(x{{namespace="team-b"}})',  # inside a function
        'max_over_time(x{namespace="team-b"}[1h:1m])',  # a subquery
        'count({__name__=~".+"})',
        'x{namespace="team-a" or namespace="team-b"}',  # Prometheus 3's alternatives
        "sum(",  # not PromQL
    ],
)
def test_a_query_that_could_read_another_namespace_is_refused(query: str) -> None:
    with pytest.raises(ScopeError):
        scoped(query, "team-a")


@pytest.mark.parametrize(
    "query",
    [
        OWN,
        f"histogram_quantile(0.99, sum by (le) ({OWN.replace('requests_total', 'duration_seconds_bucket')}))",
        f'sum({OWN}) / sum(rate(y{{namespace="team-a",code=~"5.."}}[1m])) or on() vector(0)',
        'x{namespace="team-a",namespace!="x"} offset 5m',
        "vector(1)",
    ],
)
def test_a_query_held_to_its_namespace_runs_as_the_parser_renders_it(query: str) -> None:
    rendered = scoped(query, "team-a")
    assert scoped(rendered, "team-a") == rendered  # stable: what is sent is what was checked


def md_with_query(query: str, namespace: str = "team-a") -> dict:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": namespace, "generation": 1, "uid": "u-1"},
        "spec": {
            "model": {"name": "m", "version": "1", "uri": "noop://?delay_ms=1"},
            "rollout": {
                "analysis": {
                    "metrics": [
                        {"name": "ok", "query": "vector(0)", "max": 1},
                        {"name": "spy", "query": query, "max": 1},
                    ]
                }
            },
        },
    }


def test_the_modeldeployment_is_invalid_and_the_error_names_the_field() -> None:
    with pytest.raises(ValidationError) as e:
        ModelDeployment.from_api(
            md_with_query('sum(rate(modelserver_requests_total{namespace="team-b"}[1m]))')
        )
    (err,) = e.value.errors()
    assert err["loc"] == ("spec", "rollout", "analysis", "metrics", 1, "query")
    assert 'needs namespace="team-a"' in err["msg"] and 'namespace="team-b"' in err["msg"]
    # the placeholder is the way to write it
    md = ModelDeployment.from_api(
        md_with_query('sum(rate(modelserver_requests_total{namespace="{{namespace}}"}[{{interval}}]))')
    )
    assert md.spec.rollout.analysis.metrics[1].name == "spy"


def test_the_operator_reports_it_and_acts_on_nothing() -> None:
    fake = FakeKube()
    fake.put(copy.deepcopy(md_with_query("sum(rate(modelserver_requests_total[1m]))", namespace="default")))
    Reconciler(fake).reconcile("default", "m")  # type: ignore[arg-type]
    st = fake.obj("ModelDeployment", "m")["status"]  # type: ignore[index]
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert "spec.rollout.analysis.metrics.1.query" in degraded["message"]
    assert fake.of_kind("Deployment") == []


def test_prometheus_gets_the_rendered_checked_expression() -> None:
    md = ModelDeployment.from_api(
        md_with_query('avg_over_time(x{namespace="{{namespace}}",rev="{{revision}}"}[{{interval}}])>0')
    )
    built = build_queries(
        md.spec.rollout.analysis, namespace="team-a", name="m", revision="r1", stable="r0", interval="30s"
    )
    sent = [q.promql for q in built if q.metric == "spy"]
    assert sent == ['avg_over_time(x{namespace="team-a",rev="r1"}[30s]) > 0']
