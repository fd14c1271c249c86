"""One reader of Prometheus text for tests and benchmarks (prometheus_client's parser)."""

from __future__ import annotations

from localcluster.promtext import sample_sum, sample_values

TEXT = """\
# HELP modeldeploy_reconciles_total Reconciles.
# TYPE modeldeploy_reconciles_total counter
modeldeploy_reconciles_total{result="changed"} 3.0
modeldeploy_reconciles_total{result="unchanged"} 5.0
# HELP modelserver_queue_depth Items queued.
# TYPE modelserver_queue_depth gauge
modelserver_queue_depth{model="m",version="1"} 7.0
# HELP modelserver_padding_ratio Padded over real tokens.
# TYPE modelserver_padding_ratio histogram
modelserver_padding_ratio_bucket{le="1.5",model="m"} 2.0
modelserver_padding_ratio_bucket{le="+Inf",model="m"} 4.0
modelserver_padding_ratio_sum{model="m"} 5.0
modelserver_padding_ratio_count{model="m"} 4.0
"""


def test_counters_by_label_and_in_total():
    assert sample_values(TEXT, "modeldeploy_reconciles_total", result="changed") == [3.0]
    assert sample_sum(TEXT, "modeldeploy_reconciles_total") == 8.0


def test_a_missing_series_is_empty_not_zero():
    assert sample_values(TEXT, "modeldeploy_reconciles_total", result="error") == []
    assert sample_values(TEXT, "modeldeploy_no_such_total") == []


def test_gauges_and_histogram_parts():
    assert sample_sum(TEXT, "modelserver_queue_depth") == 7.0
    assert (
        sample_sum(TEXT, "modelserver_padding_ratio_sum")
        / sample_sum(TEXT, "modelserver_padding_ratio_count")
        == 1.25
    )
    assert sample_values(TEXT, "modelserver_padding_ratio_bucket", le="+Inf") == [4.0]
