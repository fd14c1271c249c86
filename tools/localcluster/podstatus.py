"""Pure computation of a process-run pod's status, as a kubelet would report it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import NODE_IP


@dataclass
class ContainerState:
    name: str
    image: str
    running: bool = False
    started_at: str | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    pid: int | None = None
    last_exit_code: int | None = None
    last_finished_at: str | None = None
    waiting_reason: str | None = None
    terminated_exit_code: int | None = None  # set when the container will not run again


@dataclass
class PodState:
    pod_ip: str
    start_time: str
    containers: list[ContainerState] = field(default_factory=list)


def readiness_gates_pass(pod: dict[str, Any]) -> bool:
    """All ``spec.readinessGates`` have a condition with status True (a missing condition is False)."""
    conds = {c["type"]: c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    return all(conds.get(g["conditionType"]) == "True" for g in pod["spec"].get("readinessGates") or [])


def _container_status(c: ContainerState) -> dict[str, Any]:
    st: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imageID": f"local://{c.image}",
        "ready": c.ready,
        "started": c.started,
        "restartCount": c.restart_count,
    }
    if c.pid is not None:
        st["containerID"] = f"process://{c.pid}"
    if c.running:
        st["state"] = {"running": {"startedAt": c.started_at}}
    elif c.terminated_exit_code is not None:
        st["state"] = {
            "terminated": {
                "exitCode": c.terminated_exit_code,
                "reason": "Completed" if c.terminated_exit_code == 0 else "Error",
                "finishedAt": c.last_finished_at,
            }
        }
    else:
        st["state"] = {"waiting": {"reason": c.waiting_reason or "ContainerCreating"}}
    if c.last_exit_code is not None:
        st["lastState"] = {
            "terminated": {
                "exitCode": c.last_exit_code,
                "reason": "Completed" if c.last_exit_code == 0 else "Error",
                "finishedAt": c.last_finished_at,
            }
        }
    return st


def _condition(pod: dict[str, Any], ctype: str, status: bool, now: str) -> dict[str, Any]:
    """A pod condition whose lastTransitionTime only moves when its status flips."""
    want = "True" if status else "False"
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype and c.get("status") == want:
            return {"type": ctype, "status": want, "lastTransitionTime": c.get("lastTransitionTime") or now}
    return {"type": ctype, "status": want, "lastTransitionTime": now}


def desired_status(pod: dict[str, Any], state: PodState, now: str) -> dict[str, Any]:
    """The ``status`` fields the agent owns for this pod (merged by condition type on patch)."""
    containers_ready = bool(state.containers) and all(c.ready for c in state.containers)
    ready = containers_ready and readiness_gates_pass(pod)
    if all(c.terminated_exit_code is not None for c in state.containers) and state.containers:
        phase = "Succeeded" if all(c.terminated_exit_code == 0 for c in state.containers) else "Failed"
    elif any(c.running for c in state.containers):
        phase = "Running"
    else:
        phase = "Pending"
    return {
        "phase": phase,
        "hostIP": NODE_IP,
        "hostIPs": [{"ip": NODE_IP}],
        "podIP": state.pod_ip,
        "podIPs": [{"ip": state.pod_ip}],
        "startTime": state.start_time,
        "conditions": [
            _condition(pod, "PodReadyToStartContainers", True, now),
            _condition(pod, "Initialized", True, now),
            _condition(pod, "ContainersReady", containers_ready, now),
            _condition(pod, "Ready", ready, now),
        ],
        "containerStatuses": [_container_status(c) for c in state.containers],
    }


def status_differs(pod: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether patching ``desired`` would change the pod's live status."""
    live = pod.get("status") or {}
    for key, value in desired.items():
        if key == "conditions":
            live_conds = {c["type"]: c for c in live.get("conditions") or []}
            for c in value:
                lc = live_conds.get(c["type"])
                if lc is None or lc.get("status") != c["status"]:
                    return True
        elif key == "containerStatuses":
            strip = ("lastState", "state", "ready", "started", "restartCount", "containerID")
            mine = [{k: s.get(k) or None for k in strip} for s in value]
            theirs = [{k: s.get(k) or None for k in strip} for s in live.get("containerStatuses") or []]
            if mine != theirs:
                return True
        elif live.get(key) != value:
            return True
    return False
