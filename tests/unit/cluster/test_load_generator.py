"""The e2e load generator (tests/e2e/canary_support.py) hides nothing: an attempt with no ready endpoint
is a failure of its own kind, 4xx are failures, a dead worker or stale routing fails the run, and the split
test is an exact binomial test. The apiserver is a stand-in here (no pods, no slices, or one that fails);
nothing is sent anywhere: with no endpoint the generator never opens a connection."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e import canary_support
from tests.e2e.canary_support import (
    NO_ENDPOINT,
    LoadGenerator,
    LoadGeneratorError,
    Record,
    binomial_p_value,
)


class _EmptyCluster:
    """An apiserver with the model but no ready endpoint (every pod down)."""

    def __init__(self) -> None:
        self.api = self

    def pods(self, ns: str, selector: str = "") -> list[dict[str, Any]]:
        return []

    def get(self, path: str, params: Any = None) -> dict[str, Any]:
        return {"items": []}


class _FailingCluster(_EmptyCluster):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def pods(self, ns: str, selector: str = "") -> list[dict[str, Any]]:
        self.calls += 1
        if self.calls > 1:  # the first refresh (in start) works; then the apiserver is gone
            raise ConnectionError("apiserver unreachable")
        return []


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (200, "ok"),
        (404, "http_4xx"),
        (429, "http_4xx"),
        (503, "http_5xx"),
        (0, "connection_error"),
        (NO_ENDPOINT, "no_endpoint"),
    ],
)
def test_every_attempt_has_a_kind_and_only_200_is_ok(code: int, kind: str) -> None:
    assert Record(0.0, "10.0.0.1", "r", code).kind == kind


def test_no_ready_endpoint_is_recorded_as_a_failure_not_skipped() -> None:
    load = LoadGenerator(_EmptyCluster(), "ns", "m", max_requests=5, max_seconds=10, workers=1)  # type: ignore[arg-type]
    load.start()
    deadline = time.monotonic() + 10
    while len(load.snapshot()) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    load.stop()
    assert load.by_kind() == {"no_endpoint": 5}
    assert load.failed_share() == 1.0


def test_stale_routing_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(canary_support, "STALE_ROUTING_S", 0.3)
    load = LoadGenerator(_FailingCluster(), "ns", "m", max_requests=10_000, max_seconds=5, workers=1)  # type: ignore[arg-type]
    load.start()
    time.sleep(1.0)
    with pytest.raises(LoadGeneratorError, match="routing stale"):
        load.stop()
    assert load.refresh_errors >= 2


def test_a_worker_that_dies_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    load = LoadGenerator(_EmptyCluster(), "ns", "m", max_requests=10, max_seconds=5, workers=2)  # type: ignore[arg-type]

    def boom(rnd: Any) -> tuple[str | None, str | None]:
        raise KeyError("a bug in routing")

    monkeypatch.setattr(load, "pick", boom)
    load.start()
    time.sleep(0.3)
    with pytest.raises(LoadGeneratorError, match="worker 0 died"):
        load.stop()


def test_only_stable_answers_lists_everything_else() -> None:
    load = LoadGenerator(_EmptyCluster(), "ns", "m")  # type: ignore[arg-type]
    load.records = [
        Record(1.0, "a", "v1", 200, "1"),
        Record(2.0, "b", "v2", 200, "2"),  # the other revision
        Record(3.0, "a", "v1", 503, None),  # a failure from the right one
        Record(4.0, "", None, NO_ENDPOINT),
        Record(5.0, "a", "v1", 200, "1"),
    ]
    wrong = load.answered_only_by("v1", "1", since=2.0)
    assert [r.t for r in wrong] == [2.0, 3.0, 4.0]


def test_binomial_test_exact_values() -> None:
    # X ~ Bin(10, 0.5): P(X <= 3) + P(X >= 7) = 2 * (1 + 10 + 45 + 120) / 1024
    assert binomial_p_value(3, 10, 0.5) == pytest.approx(352 / 1024)
    assert binomial_p_value(5, 10, 0.5) == pytest.approx(1.0)
    # a third of 300 requests when a third is asked: fine; a tenth: rejected
    assert binomial_p_value(100, 300, 1 / 3) > 0.5
    assert binomial_p_value(30, 300, 1 / 3) < 1e-12
    # degenerate weights: 0 % and 100 % admit no exception at all
    assert binomial_p_value(0, 50, 0.0) == 1.0 and binomial_p_value(1, 50, 0.0) == 0.0
    assert binomial_p_value(50, 50, 1.0) == 1.0 and binomial_p_value(49, 50, 1.0) == 0.0
    assert binomial_p_value(0, 0, 0.3) == 1.0
