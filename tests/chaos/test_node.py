"""The node that holds the canary's pods goes NotReady mid-step (issue 23, section 3): v1's pods are
pinned to one node (the one the clients' kube-proxy is on), v2's to the other; half an interval into v2's
first step v2's node is cut off from the apiserver (``localcluster.faults.node_unreachable``): its lease
is no longer renewed and its kubelet (the node agent) reports nothing, so kube-controller-manager marks
the node NotReady (Unknown) after its grace period (50 s) and the canary's pods not ready, which takes
them out of the Service's endpoints. The containers run on, as they do on a node that is partitioned from
the control plane. The node is healed once the canary has had no ready pod for two intervals.

By then the rollout is at its 100 % step, waiting for a second canary pod that the lost node never
starts. Promises (docs/reliability.md): no client request fails -- the canary's pods serve until they
leave the endpoints, and at 100 % the stable's pods stand in for the canary pods that are not in traffic
(on 32e4d22's canary.py the stable had no pod in traffic there and the clients got ``connection
refused``); no window is judged without canary traffic (they hold); after the heal the rollout resumes
and v2 is promoted, as without the fault. Times are printed and written to $CHAOS_REPORT.
"""

from __future__ import annotations

import time
from typing import Any

from e2e.canary_support import events
from localcluster import faults
from localcluster.config import CPU_NODE, GPU_NODE
from localcluster.testing import Kube, wait_for

from .rollout_under_fault import INTERVAL_S, NAME, dump, play

#: the local cluster's kube-proxy, which the clients' traffic goes through, is "on" this node (its
#: hostnameOverride): the stable's pods are pinned here
CLIENT_NODE = GPU_NODE
#: the canary's pods are pinned here, and this node is lost. Not the kube-proxy's node: kwok rewrites a
#: recovering node's addresses, and kube-proxy exits when its own node's addresses change (a kubelet would
#: restart it; the local cluster has nothing that does, and the Service would stay frozen on old rules)
CANARY_NODE = CPU_NODE


def node_ready(kube: Kube, node: str) -> str:
    conds = (kube.get(f"/api/v1/nodes/{node}") or {}).get("status", {}).get("conditions", [])
    return next((c["status"] for c in conds if c["type"] == "Ready"), "")


def ready_pods_on(kube: Kube, ns: str, node: str) -> int:
    n = 0
    for p in kube.pods(ns, f"modeldeploy.io/name={NAME}"):
        conds = {c["type"]: c["status"] for c in p.get("status", {}).get("conditions", [])}
        n += p["spec"].get("nodeName") == node and conds.get("Ready") == "True"
    return n


def test_the_canarys_node_going_not_ready_mid_step(
    kube: Kube, operator: Any, namespace: str, report: dict[str, Any]
) -> None:
    seen: dict[str, float] = {}

    def fault() -> None:
        started = time.monotonic()
        with faults.node_unreachable(kube.cluster, CANARY_NODE):
            wait_for(
                lambda: node_ready(kube, CANARY_NODE) not in ("True", ""),
                timeout=120,
                interval=0.5,
                what=f"{CANARY_NODE} NotReady",
            )
            seen["node_not_ready_after_s"] = time.monotonic() - started
            wait_for(
                lambda: ready_pods_on(kube, namespace, CANARY_NODE) == 0,
                timeout=60,
                interval=0.5,
                what="the canary's pods not ready",
            )
            seen["canary_out_of_traffic_after_s"] = time.monotonic() - started
            dump(kube, namespace)
            time.sleep(2 * INTERVAL_S)  # windows come due with no canary traffic
            dump(kube, namespace)
        wait_for(lambda: node_ready(kube, CANARY_NODE) == "True", timeout=60, interval=0.5, what="node Ready")

    out = play(kube, namespace, fault, report, "canary_node_not_ready", nodes=(CLIENT_NODE, CANARY_NODE))
    held = [e for e in events(kube, namespace, NAME) if e["reason"] == "AnalysisHold"]
    out.update(
        {
            "node_not_ready_after_s": round(seen["node_not_ready_after_s"], 1),
            "canary_out_of_traffic_after_s": round(seen["canary_out_of_traffic_after_s"], 1),
            "windows_held": len(held),
        }
    )
    print(f"canary node NotReady: {out}")
    assert out["outcome"] == "Promoted"
