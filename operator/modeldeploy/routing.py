"""Gateway API routing (pure): the HTTPRoute of a ModelDeployment in ``gatewayAPI`` mode.

One ``HTTPRoute`` named like the ModelDeployment, attached to ``spec.rollout.trafficRouting.gatewayAPI
.parentRefs``, with one weighted backendRef per revision Service (``<name>-<revision>``): the stable
revision gets ``100 - w``, the canary ``w`` (exact weights, unlike ``replicas`` mode) once one of its pods
is Ready, 0 before (``plan.route_weight``). Warm and failed revisions are not listed (weight 0 means no
traffic). Written with server-side apply like every child; the real apiserver validates it against the
Gateway API CRDs.
"""

from __future__ import annotations

from typing import Any

from . import builders as b
from .api import ModelDeployment

GROUP = "gateway.networking.k8s.io"
API_VERSION = f"{GROUP}/v1"


def backend_weights(stable: str, canary: str | None, weight: int | None) -> list[tuple[str, int]]:
    """(revision, weight) of the route's backends, in a stable order (stable first)."""
    if canary is None or weight is None:
        return [(stable, 100)]
    w = max(0, min(100, weight))
    return [(stable, 100 - w), (canary, w)]


def build_httproute(
    md: ModelDeployment, stable: str, canary: str | None, weight: int | None
) -> dict[str, Any]:
    gw = md.spec.rollout.traffic_routing.gateway_api
    assert gw is not None, "gatewayAPI mode without spec.rollout.trafficRouting.gatewayAPI"
    labels = {**b.common_labels(md), b.LABEL_COMPONENT: "route"}
    spec: dict[str, Any] = {
        "parentRefs": [p.to_api() for p in gw.parent_refs],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                "backendRefs": [
                    {
                        "group": "",
                        "kind": "Service",
                        "name": b.revision_service_name(md.name, rev),
                        "port": b.SERVER_PORT,
                        "weight": w,
                    }
                    for rev, w in backend_weights(stable, canary, weight)
                ],
            }
        ],
    }
    if gw.hostnames:
        spec["hostnames"] = list(gw.hostnames)
    meta = {
        "name": md.name,
        "namespace": md.namespace,
        "labels": labels,
        "ownerReferences": [b.owner_reference(md)],
    }
    return b.stamp({"apiVersion": API_VERSION, "kind": "HTTPRoute", "metadata": meta, "spec": spec})
