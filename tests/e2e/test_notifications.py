"""Rollout notifications end to end (issue 27): the operator, real noop servers, the real Prometheus, and
real HTTP receivers in this process that the operator POSTs to.

* A receiver records every event of a good rollout, in order, each signed under the namespace's key
  (derived from the operator's signing key file, as a team would get it with ``kubectl modeldeploy
  notification-key``).
* Receivers that answer 500 or hang (30 s per try, 3 tries) leave the rollout's timing unchanged: the
  same rollout, measured both ways, is printed and reported; each step must still advance within its
  interval plus a margin far below one hung try (30 s), and the receivers were really called.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from localcluster.operator_process import notification_key_file
from localcluster.receiver import receivers as started_receivers
from localcluster.testing import Kube, wait_for
from modeldeploy.notify import namespace_key, verify

from .canary_support import LoadGenerator, md_status, noop_md

NAME = "told"
GOOD = "noop://?delay_ms=2"
REPORT: dict[str, Any] = {}
#: far below one hung try (30 s): a delivery that blocked a reconcile would blow it
STEP_MARGIN_S = 12.0


@pytest.fixture
def receivers() -> Iterator[Any]:
    with started_receivers() as start:
        yield start


def rollout(kube: Kube, ns: str, hooks: list[dict[str, Any]]) -> dict[str, float]:
    """v1, then a good v2 with ``hooks``: when each step was seen (monotonic), until Promoted."""
    kube.apply(noop_md(NAME, "1", GOOD, notifications=hooks), ns)
    wait_for(lambda: md_status(kube, ns, NAME).get("phase") == "Healthy", timeout=120, what="v1 healthy")
    v1 = md_status(kube, ns, NAME)["stableRevision"]
    load = LoadGenerator(kube, ns, NAME).wait_serving().start()
    try:
        kube.apply(noop_md(NAME, "2", GOOD + "&rev=2", notifications=hooks), ns)
        seen: dict[str, float] = {"applied": time.monotonic()}

        def promoted() -> bool:
            st = md_status(kube, ns, NAME)
            if st.get("canaryRevision") and st.get("step") is not None:
                seen.setdefault(f"step{st['step']}", time.monotonic())
            return st.get("stableRevision") not in (None, v1) and not st.get("canaryRevision")

        wait_for(promoted, timeout=120, interval=0.1, what="v2 promoted")
        seen["promoted"] = time.monotonic()
    finally:
        load.stop()
    # what clients saw: every request answered (the receivers are not in the data path)
    assert set(load.by_kind()) == {"ok"}, load.by_kind()
    return seen


def test_a_receiver_is_told_every_event_of_a_rollout_signed_for_its_namespace(
    kube: Kube, operator: Any, namespace: str, receivers: Any
) -> None:
    r = receivers()
    seen = rollout(kube, namespace, [{"url": r.url}])
    wait_for(lambda: any(json.loads(d)["type"] == "Promoted" for _, _, d in r.got), timeout=15)
    key = namespace_key(notification_key_file(kube.cluster).read_bytes(), namespace)
    types = []
    for _, headers, data in r.got:
        assert verify(key, "notification", headers, data), headers
        doc = json.loads(data)
        assert (doc["namespace"], doc["name"]) == (namespace, NAME)
        types.append(doc["type"])
    assert types == ["Started", "StepAdvanced", "StepAdvanced", "Promoted"], types
    REPORT["good_receiver"] = {"promoted_after_s": round(seen["promoted"] - seen["applied"], 1)}
    print("good receiver:", types, REPORT["good_receiver"])


def test_receivers_that_answer_500_or_hang_leave_the_rollout_timing_unchanged(
    kube: Kube, operator: Any, namespace: str, receivers: Any
) -> None:
    failing, hanging = receivers(status=500), receivers(hang=True)
    hooks = [{"url": failing.url}, {"url": hanging.url, "timeout": "30s", "format": "cloudevents"}]
    seen = rollout(kube, namespace, hooks)
    took = round(seen["promoted"] - seen["applied"], 1)
    REPORT["failing_and_hanging_receivers"] = {"promoted_after_s": took}
    good = REPORT.get("good_receiver", {}).get("promoted_after_s")
    print("500 + hanging receivers:", seen, REPORT, "ratio to the good receiver's:", good and took / good)
    # they were called: the failing one again and again, the hanging one held a connection
    wait_for(lambda: len(failing.got) >= 3 and hanging.got, timeout=15)
    assert json.loads(hanging.got[0][2])["specversion"] == "1.0"
    # each step advanced within its interval (6 s) plus a margin far below one hung try
    marks = [seen[k] for k in ("step0", "step1", "step2", "promoted") if k in seen]
    gaps = [b - a for a, b in itertools.pairwise(marks)]
    assert len(marks) == 4 and all(g < 6 + STEP_MARGIN_S for g in gaps), seen
