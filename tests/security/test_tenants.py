"""A ModelDeployment author reaches no further than their own RBAC (issue 24), played on the local cluster
by an author who acts through their own namespaced token (tests/security/tenants.py): allowed to manage
ModelDeployments in their namespace, nothing else.

* Finding 2: the namespace holds a Service ``payments`` that the platform team made (the author may not
  touch it: 403). The author names a ModelDeployment ``payments``. Before the fix the operator applied
  its own Service over it (selector, ownerReference) and deleting the ModelDeployment then
  garbage-collected it. Now: nothing is written to it, ``Degraded``/``NameConflict`` says why, and it
  outlives the ModelDeployment.
* Finding 6: the author's custom analysis query reads another team's namespace: the ModelDeployment is
  ``InvalidSpec`` with the field named, and nothing runs for it.
"""

from __future__ import annotations

import time
from typing import Any

from e2e.canary_support import events, md_status, noop_md
from localcluster.testing import Kube, wait_for

from .tenants import Author

MD_PATH = "/apis/modeldeploy.io/v1alpha1/namespaces/{ns}/modeldeployments"


def condition(st: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in st.get("conditions") or [] if c["type"] == type_), {})


def test_an_author_cannot_take_over_a_service_by_naming_a_modeldeployment_after_it(
    kube: Kube, operator: Any, team_a: Author
) -> None:
    ns = team_a.namespace
    svc_path = f"/api/v1/namespaces/{ns}/services/payments"
    kube.api.create(
        f"/api/v1/namespaces/{ns}/services",
        {
            "metadata": {"name": "payments", "labels": {"app": "payments"}},
            "spec": {
                "selector": {"app": "payments"},
                "ports": [{"name": "web", "port": 80, "targetPort": 8080}],
            },
        },
    )
    before = kube.get(svc_path)
    assert before is not None
    # the author may not change it directly
    assert team_a.denied("PATCH", svc_path, {"spec": {"selector": {"app": "mine"}}})
    # ... nor through the operator
    team_a.api.create(MD_PATH.format(ns=ns), noop_md("payments", "1", "noop://?delay_ms=1", replicas=1))
    st = wait_for(
        lambda: (
            (s := md_status(kube, ns, "payments"))
            and condition(s, "Degraded").get("reason") == "NameConflict"
            and s
        ),
        timeout=60,
        what="the ModelDeployment reports the name conflict",
    )
    assert "Service payments exists and is not this ModelDeployment's" in condition(st, "Degraded")["message"]
    conflict = [e for e in events(kube, ns, "payments") if e["reason"] == "NameConflict"]
    assert conflict and conflict[0]["type"] == "Warning"
    time.sleep(3)  # retries come and go: still nothing written to it
    after = kube.get(svc_path)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["spec"]["selector"] == {"app": "payments"} and not after["metadata"].get("ownerReferences")
    # the author deletes the ModelDeployment: the platform team's Service stays
    team_a.api.delete(f"{MD_PATH.format(ns=ns)}/payments")
    wait_for(lambda: kube.get(f"{MD_PATH.format(ns=ns)}/payments") is None, timeout=30, what="md deleted")
    time.sleep(5)  # the garbage collector would have acted by now
    assert kube.get(svc_path) is not None


def test_an_author_cannot_read_another_namespaces_series_through_an_analysis_query(
    kube: Kube, operator: Any, team_a: Author, team_b: str
) -> None:
    ns = team_a.namespace
    # the author may not read team-b at all
    assert team_a.denied("GET", f"/api/v1/namespaces/{team_b}/pods")
    spy = {
        "name": "their-traffic",
        "query": f'sum(rate(modelserver_requests_total{{namespace="{team_b}"}}[1m]))',
        "max": 1e12,
    }
    md = noop_md("spy", "1", "noop://?delay_ms=1", analysis={"metrics": [spy]})
    team_a.api.create(MD_PATH.format(ns=ns), md)
    st = wait_for(
        lambda: (
            (s := md_status(kube, ns, "spy"))
            and condition(s, "Degraded").get("reason") == "InvalidSpec"
            and s
        ),
        timeout=60,
        what="the ModelDeployment refused as invalid",
    )
    message = condition(st, "Degraded")["message"]
    assert "spec.rollout.analysis.metrics.0.query" in message and f'namespace="{team_b}"' in message
    deployments = kube.api.get(
        f"/apis/apps/v1/namespaces/{ns}/deployments", params={"labelSelector": "modeldeploy.io/name=spy"}
    )
    assert deployments is not None and deployments["items"] == []
    assert not (st.get("analysis") or {}).get("measurements")
