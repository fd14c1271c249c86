"""Reading Prometheus text exposition (``/metrics``) with ``prometheus_client``'s parser, for the tests and
the benchmarks (one reader, not a hand-written one per caller)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_values(text: str, sample: str, **labels: str) -> list[float]:
    """Values of the samples named ``sample`` (as exposed: ``x_total``, ``x_sum``, ``x_bucket``, a gauge's
    own name) whose labels include ``labels``."""
    return [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def sample_sum(text: str, sample: str, **labels: str) -> float:
    """The sum of :func:`sample_values` (0.0 when there is none)."""
    return float(sum(sample_values(text, sample, **labels)))
