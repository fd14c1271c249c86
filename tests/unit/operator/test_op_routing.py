"""The HTTPRoute in gatewayAPI mode with ``canaryHeader``: a first rule sends requests carrying the header
to the canary during every step, whatever the weight; not before a canary pod is Ready, not during the
shadow stage, and gone at promotion or rollback. The reconciler against the in-memory apiserver, a fake
clock and a fake Prometheus (md_canary.py)."""

from __future__ import annotations

from typing import Any

import pytest
from md_canary import World, canary_md, watch_the_route
from modeldeploy import routing
from modeldeploy.analysis import ERROR_RATE
from modeldeploy.api import ModelDeployment
from pydantic import ValidationError

HEADER = {"name": "x-modeldeploy-canary", "value": "always"}
GATEWAY = {"parentRefs": [{"name": "public-gateway", "namespace": "gateway-system"}], "hostnames": ["m.test"]}


def gateway_world(header: dict[str, str] | None = HEADER, **rollout: Any) -> World:
    gw = {**GATEWAY, **({"canaryHeader": header} if header else {})}
    return World(canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": gw}, **rollout))


def rules(w: World) -> list[dict[str, Any]]:
    return list(w.fake.obj("HTTPRoute", "minilm")["spec"]["rules"])


def header_target(w: World) -> str | None:
    """The Service the header rule sends to (None: no header rule); asserts the rule's exact shape."""
    rs = rules(w)
    with_header = [r for r in rs if any("headers" in m for m in r["matches"])]
    if not with_header:
        return None
    assert len(with_header) == 1 and rs[0] is with_header[0], rs  # first, one rule
    (match,) = with_header[0]["matches"]
    assert match == {
        "path": {"type": "PathPrefix", "value": "/"},
        "headers": [{"type": "Exact", "name": "x-modeldeploy-canary", "value": "always"}],
    }
    (ref,) = with_header[0]["backendRefs"]
    assert ref["port"] == 8080 and ref["kind"] == "Service" and ref["weight"] == 1
    return str(ref["name"])


def weights(w: World) -> list[tuple[str, int]]:
    plain = [r for r in rules(w) if not any("headers" in m for m in r["matches"])]
    assert len(plain) == 1
    return [(r["name"], r["weight"]) for r in plain[0]["backendRefs"]]


def test_the_header_sends_to_the_canary_during_every_step_and_is_gone_after_promotion() -> None:
    w = gateway_world()
    old = w.deploy_first()
    assert header_target(w) is None  # no canary: nothing to send to
    assert weights(w) == [(f"minilm-{old}", 100)]
    new = w.new_version("2")
    w.rec.reconcile("default", "minilm")  # the canary's Deployment exists, no pod of it yet
    assert header_target(w) is None  # a gateway would answer 503
    assert weights(w) == [(f"minilm-{old}", 100), (f"minilm-{new}", 0)]
    seen = []
    for _ in range(40):
        w.run_for(1)
        st = w.status
        if st.get("canaryRevision") != new:
            break
        seen.append((st["step"], dict(weights(w))[f"minilm-{new}"], header_target(w)))
    assert {step for step, _, _ in seen} == {0, 1, 2}  # steps 25, 50, 100
    # on exactly while the canary has route weight, i.e. one of its pods is Ready (the first reconcile
    # after its pod appeared still saw none: weight 0 and no header rule, together)
    assert all((target == f"minilm-{new}") == (weight > 0) for _, weight, target in seen), seen
    assert [weight for _, weight, _ in seen].count(0) <= 1, seen
    assert [h["outcome"] for h in w.status["history"]][-1] == "Promoted"
    assert header_target(w) is None
    assert weights(w) == [(f"minilm-{new}", 100)]


def test_the_header_rule_is_removed_at_rollback() -> None:
    w = gateway_world()
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile(rounds=4)  # its pod comes up, is gated into traffic, and its endpoint turns ready
    assert header_target(w) == f"minilm-{new}"
    w.prom.values[new] = {ERROR_RATE: 0.5}
    w.run_for(10)
    assert [h["outcome"] for h in w.status["history"]][-1] == "RolledBack"
    assert header_target(w) is None
    assert weights(w) == [(f"minilm-{old}", 100)]


def test_no_header_rule_during_the_shadow_stage() -> None:
    shadow = {"duration": "10s", "sampleRate": 0.2, "minSamples": 200, "minAgreement": 0.99}
    w = gateway_world(shadow=shadow)
    old = w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    shadowing = 0
    for _ in range(30):
        st = w.status
        if st.get("phase") == "Shadowing":
            shadowing += 1
            assert header_target(w) is None  # the shadow's pods answer no client, header or not
            assert weights(w) == [(f"minilm-{old}", 100), (f"minilm-{new}", 0)]
        elif st.get("canaryRevision") == new and st.get("stepStartedAt"):
            break
        w.run_for(1)
    assert shadowing >= 5
    # the first step: on once the canary's pod is Ready and its slice says so (a shadow target's Service
    # publishes not-ready addresses: its endpoint was "ready" all along, but not "serving")
    w.reconcile(rounds=2)
    assert w.status["step"] == 0 and header_target(w) == f"minilm-{new}"


def test_without_canary_header_the_route_has_one_rule() -> None:
    w = gateway_world(header=None)
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    assert w.status["canaryRevision"] == new and len(rules(w)) == 1 and header_target(w) is None


def test_build_httproute_puts_the_header_rule_first_and_keeps_the_route_fields() -> None:
    body = canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {**GATEWAY, "canaryHeader": HEADER}})
    body["metadata"].update({"namespace": "default", "uid": "u1"})
    md = ModelDeployment.from_api(body)
    route = routing.build_httproute(md, "a", "b", 25, header_canary="b")
    assert [r["backendRefs"][0]["name"] for r in route["spec"]["rules"]] == ["minilm-b", "minilm-a"]
    assert [(x["name"], x["weight"]) for x in route["spec"]["rules"][1]["backendRefs"]] == [
        ("minilm-a", 75),
        ("minilm-b", 25),
    ]
    assert route["spec"]["hostnames"] == ["m.test"]
    assert route["spec"]["parentRefs"][0] == {
        "name": "public-gateway",
        "namespace": "gateway-system",
        "group": "gateway.networking.k8s.io",
        "kind": "Gateway",
    }
    assert len(routing.build_httproute(md, "a", "b", 25)["spec"]["rules"]) == 1  # no canary in traffic


@pytest.mark.parametrize(
    "header",
    [
        {"name": "x canary", "value": "1"},
        {"name": "", "value": "1"},
        {"name": "x-c", "value": ""},
        {"name": "x"},
    ],
)
def test_an_invalid_header_is_refused(header: dict[str, str]) -> None:
    body = canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {**GATEWAY, "canaryHeader": header}})
    body["metadata"].update({"namespace": "default", "uid": "u1"})
    with pytest.raises(ValidationError):
        ModelDeployment.from_api(body)


def test_the_server_container_is_told_its_revision() -> None:
    """So that every answer names its revision (x-modeldeploy-revision), behind a Service or a gateway."""
    from modeldeploy import builders as b

    body = canary_md()
    body["metadata"].update({"namespace": "default", "uid": "u1"})
    md = ModelDeployment.from_api(body)
    dep = b.build_deployment(md, md.spec, "abc123", 2)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MODELDEPLOY_REVISION"] == "abc123"
    assert dep["spec"]["template"]["metadata"]["labels"][b.LABEL_REVISION] == "abc123"


# ------------------------------------------------------------------- no weight on a backend without endpoints


def test_a_failback_keeps_the_failed_revision_routed_until_the_warm_pods_endpoint_is_ready() -> None:
    """The failback's new stable is a warm pod whose gate turns True at the decision: until its endpoint is
    ready in the slices, the route keeps the failed revision (whose pods make-before-break keeps in
    traffic), as kube-proxy does in the other modes -- never a moment with only an empty backend."""
    w = gateway_world(header=None)
    old = w.deploy_first()
    violations = watch_the_route(w)  # from here on: the first deployment has nothing else to route to
    new = w.new_version("2")
    w.reconcile()
    w.run_for(35)
    assert w.status["stableRevision"] == new and weights(w) == [(f"minilm-{new}", 100)]
    w.run_for(routing.ROUTE_DRAIN_SECONDS)  # the old stable's pods leave traffic (warm, not Ready)
    assert w.pods_in_traffic(old) == 0
    w.prom.values[new] = {ERROR_RATE: 0.3}
    w.clock.tick(10)
    w.rec.reconcile("default", "minilm")  # the decision
    assert w.status["stableRevision"] == old
    assert weights(w) == [(f"minilm-{new}", 100)]  # the warm pod's endpoint is not ready yet
    routed = []
    for _ in range(6):
        w.controllers()
        w.rec.reconcile("default", "minilm")
        routed.append(weights(w))
    assert routed[-1] == [(f"minilm-{old}", 100)], routed
    assert [(h["revision"], h["outcome"]) for h in w.status["history"]][-1] == (new, "FailedBack")
    assert violations == []


def test_a_rollout_and_a_rollback_never_weight_a_backend_without_a_ready_endpoint() -> None:
    w = gateway_world()
    old = w.deploy_first()
    violations = watch_the_route(w)  # from here on: the first deployment has nothing else to route to
    new = w.new_version("2")
    w.run_for(25)
    assert w.status["canaryRevision"] == new and dict(weights(w))[f"minilm-{new}"] > 0
    w.prom.values[new] = {ERROR_RATE: 0.5}
    w.run_for(10)
    assert [h["outcome"] for h in w.status["history"]][-1] == "RolledBack"
    assert weights(w) == [(f"minilm-{old}", 100)]
    assert violations == []


# A gateway takes a route change only after a watch event and a reload (Traefik throttles reloads to one
# per 2 s by default); an endpoint that turns not Ready is dropped by the same reload. A revision leaving
# the route must therefore keep ready endpoints until the gateway has surely taken the route without it.
GATEWAY_LAG_S = 5.0  # below the drain, above Traefik's default throttle


def test_a_rolled_back_canary_keeps_its_endpoints_until_the_gateway_has_the_route_without_it() -> None:
    w = gateway_world()
    old = w.deploy_first()
    violations = watch_the_route(w, lag=GATEWAY_LAG_S)
    new = w.new_version("2")
    w.run_for(15)
    assert w.status["canaryRevision"] == new and dict(weights(w))[f"minilm-{new}"] > 0
    w.prom.values[new] = {ERROR_RATE: 0.5}
    for _ in range(15):
        w.run_for(1)
        if w.status.get("canaryRevision") is None:
            break
    assert [h["outcome"] for h in w.status["history"]][-1] == "RolledBack"
    assert weights(w) == [(f"minilm-{old}", 100)] and header_target(w) is None  # at once
    assert violations == []
    assert w.pods_in_traffic(new) > 0  # still Ready: the gateway may route by the old route for a while
    w.run_for(routing.ROUTE_DRAIN_SECONDS + 5)
    assert w.pods(new) == [] and w.fake.obj("Deployment", f"minilm-{new}") is None  # then gone
    assert violations == []


def test_a_promotion_keeps_the_old_stables_endpoints_until_the_gateway_has_the_new_route() -> None:
    w = gateway_world(header=None)
    old = w.deploy_first()
    violations = watch_the_route(w, lag=GATEWAY_LAG_S)
    new = w.new_version("2")
    for _ in range(60):
        w.run_for(1)
        if w.status.get("stableRevision") == new:
            break
    assert w.status["stableRevision"] == new and weights(w) == [(f"minilm-{new}", 100)]
    assert w.pods_in_traffic(old) > 0
    w.run_for(routing.ROUTE_DRAIN_SECONDS + 5)
    assert w.pods_in_traffic(old) == 0 and len(w.pods(old)) == 1  # kept warm (keepPrevious), out of traffic
    assert violations == []


def test_every_rule_of_the_route_removes_the_trusted_priority_header() -> None:
    body = canary_md(trafficRouting={"mode": "gatewayAPI", "gatewayAPI": {**GATEWAY, "canaryHeader": HEADER}})
    body["metadata"].update({"namespace": "default", "uid": "u1"})
    md = ModelDeployment.from_api(body)
    for route in (
        routing.build_httproute(md, "a", "b", 25, header_canary="b"),
        routing.build_httproute(md, "a", None, None, fallback="f"),
    ):
        for rule in route["spec"]["rules"]:
            removed = [
                h
                for f in rule["filters"]
                if f["type"] == "RequestHeaderModifier"
                for h in f["requestHeaderModifier"]["remove"]
            ]
            assert removed == ["x-modeldeploy-priority"]
