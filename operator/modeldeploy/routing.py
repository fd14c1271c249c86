"""Gateway API routing (pure): the HTTPRoute of a ModelDeployment in ``gatewayAPI`` mode.

One ``HTTPRoute`` named like the ModelDeployment, attached to ``spec.rollout.trafficRouting.gatewayAPI
.parentRefs``, with one weighted backendRef per revision Service (``<name>-<revision>``): the stable
revision gets ``100 - w``, the canary ``w`` (exact weights, unlike ``replicas`` mode) once one of its pods
is Ready and its Service's EndpointSlices list it ready, 0 before (``traffic_split.route_weight``); a new
stable not yet routable leaves its share with the revision it replaces (``traffic_split.route_stable``).
Warm and failed revisions are not listed (weight 0 means no traffic). Written with server-side apply like
every child; the real apiserver validates it against the Gateway API CRDs.

With ``gatewayAPI.canaryHeader`` set, while a canary is in traffic (a step, ``traffic_split.routable``) a
first rule sends every request carrying that header (exact value) to the canary alone, whatever the
weight: a rule with a header match takes precedence over the path-only rule (Gateway API's rule
precedence). It is not there during the shadow stage, before the canary has a Ready pod, or once the
canary is promoted or rolled back.

Every rule removes the ``x-modeldeploy-priority`` request header (:data:`PRIORITY_HEADER`): a generation
server takes a request's scheduling level from it (a body may only lower it), so a client outside the
cluster must not be able to raise its own requests above others' and preempt them; callers inside the
cluster, which reach the revision Services without the gateway, are trusted to set it.

A revision the route stops sending to keeps its pods in traffic for :data:`ROUTE_DRAIN_SECONDS` (the
gateway reloads the route a moment later; :func:`modeldeploy.rollout_decision.drain_route_leavers`).
"""

from __future__ import annotations

from typing import Any

from .api import ModelDeployment
from .builders import (
    LABEL_COMPONENT,
    SERVER_PORT,
    common_labels,
    owner_reference,
    revision_service_name,
    stamp,
)

GROUP = "gateway.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"
#: seconds a revision that left the route keeps its pods in traffic (Ready, endpoints ready): a gateway
#: takes the new route only after a watch event and a reload (Traefik reloads at most once per 2 s by
#: default), and the same reload drops endpoints that turned not Ready -- taken out at once, a backend the
#: gateway still weighted had no server (503s). Argo Rollouts keeps an aborted canary 30 s for the same
#: reason (``abortScaleDownDelaySeconds``).
ROUTE_DRAIN_SECONDS = 10
#: the generation servers' trusted priority header (modelserver.gen_app.PRIORITY_HEADER), never passed from
#: a client through the gateway
PRIORITY_HEADER = "x-modeldeploy-priority"
_STRIP_PRIORITY = {"type": "RequestHeaderModifier", "requestHeaderModifier": {"remove": [PRIORITY_HEADER]}}


def backend_weights(stable: str, canary: str | None, weight: int | None) -> list[tuple[str, int]]:
    """(revision, weight) of the route's backends, in a stable order (stable first)."""
    if canary is None or weight is None:
        return [(stable, 100)]
    w = max(0, min(100, weight))
    return [(stable, 100 - w), (canary, w)]


def build_httproute(
    md: ModelDeployment,
    stable: str,
    canary: str | None,
    weight: int | None,
    fallback: str | None = None,
    *,
    header_canary: str | None = None,
) -> dict[str, Any]:
    """The route; with ``fallback`` (the CPU fallback in traffic) every request goes to it. With
    ``header_canary`` (the canary in traffic) and ``gatewayAPI.canaryHeader`` set, requests carrying the
    header go to that revision."""
    gw = md.spec.rollout.traffic_routing.gateway_api
    assert gw is not None, "gatewayAPI mode without spec.rollout.trafficRouting.gatewayAPI"
    labels = {**common_labels(md), LABEL_COMPONENT: "route"}
    header_rules: list[dict[str, Any]] = []
    if gw.canary_header is not None and header_canary is not None and fallback is None:
        header_rules.append(
            {
                "matches": [
                    {
                        "path": {"type": "PathPrefix", "value": "/"},
                        "headers": [
                            {"type": "Exact", "name": gw.canary_header.name, "value": gw.canary_header.value}
                        ],
                    }
                ],
                "filters": [_STRIP_PRIORITY],
                "backendRefs": [
                    {
                        "group": "",
                        "kind": "Service",
                        "name": revision_service_name(md.name, header_canary),
                        "port": SERVER_PORT,
                        "weight": 1,
                    }
                ],
            }
        )
    spec: dict[str, Any] = {
        "parentRefs": [p.to_api() for p in gw.parent_refs],
        "rules": [
            *header_rules,
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "filters": [_STRIP_PRIORITY],
                "backendRefs": [
                    {
                        "group": "",
                        "kind": "Service",
                        "name": revision_service_name(md.name, rev),
                        "port": SERVER_PORT,
                        "weight": w,
                    }
                    for rev, w in ([(fallback, 100)] if fallback else backend_weights(stable, canary, weight))
                ],
            },
        ],
    }
    if gw.hostnames:
        spec["hostnames"] = list(gw.hostnames)
    meta = {
        "name": md.name,
        "namespace": md.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(md)],
    }
    return stamp({"apiVersion": API_VERSION, "kind": "HTTPRoute", "metadata": meta, "spec": spec})
