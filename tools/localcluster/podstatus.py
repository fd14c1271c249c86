"""Pure computation of a process-run pod's status, as a kubelet would report it.

Ported from Kubernetes v1.37.2 (``pkg/kubelet/kubelet_pods.go``: ``getPhase`` and the default waiting
states of ``convertToAPIContainerStatuses``; ``pkg/kubelet/status/generate.go``: the ``Initialized``,
``ContainersReady`` and ``Ready`` conditions; ``pkg/kubelet/kuberuntime/kuberuntime_container.go``: the
termination message and its ``FallbackToLogsOnError`` tail), without restartable (sidecar) init
containers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import NODE_IP

# pkg/kubelet/container/runtime.go
MAX_TERMINATION_MESSAGE_BYTES = 4 * 1024  # MaxContainerTerminationMessageLength: the file's last 4 KiB
MAX_TERMINATION_LOG_BYTES = 2 * 1024  # MaxContainerTerminationMessageLogLength
MAX_TERMINATION_LOG_LINES = 80  # MaxContainerTerminationMessageLogLines
MAX_POD_TERMINATION_MESSAGE_BYTES = 12 * 1024  # MaxPodTerminationMessageLogLength, shared by all statuses

PODINITIALIZING = "PodInitializing"
CONTAINERCREATING = "ContainerCreating"


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
    last_started_at: str | None = None
    last_message: str = ""  # the termination message of the last run
    waiting_reason: str | None = None
    waiting_message: str = ""
    terminated_exit_code: int | None = None  # set when the container will not run again
    init: bool = False  # an init container: Ready once it completed with exit code 0

    def finished(self, code: int, message: str, now: str) -> None:
        """The running process exited with ``code``: it becomes the last state."""
        self.running = self.ready = self.started = False
        self.last_exit_code = code
        self.last_finished_at = now
        self.last_started_at = self.started_at
        self.last_message = message

    @property
    def completed(self) -> bool:
        """An init container that ran to completion (exit code 0) and will not run again."""
        return self.terminated_exit_code == 0


@dataclass
class PodState:
    pod_ip: str
    start_time: str
    containers: list[ContainerState] = field(default_factory=list)
    init_containers: list[ContainerState] = field(default_factory=list)


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def termination_message(file_tail: bytes, log_tail: bytes, *, fallback_to_logs: bool, exit_code: int) -> str:
    """The ``message`` of a terminated state, the kubelet's way: the termination message file's last 4 KiB;
    with ``FallbackToLogsOnError``, when that is empty and the exit failed, the log's last 80 lines (at
    most its last 2 KiB). ``file_tail`` and ``log_tail`` are the ends of the file and of this run's log."""
    data = file_tail[-MAX_TERMINATION_MESSAGE_BYTES:]
    if data or not fallback_to_logs or exit_code == 0:
        return data.decode(errors="replace")
    lines = log_tail.splitlines(keepends=True)[-MAX_TERMINATION_LOG_LINES:]
    return b"".join(lines)[-MAX_TERMINATION_LOG_BYTES:].decode(errors="replace")


def _terminated(code: int, message: str, started: str | None, finished: str | None) -> dict[str, Any]:
    t: dict[str, Any] = {"exitCode": code, "reason": exit_reason(code)}
    if message:
        t["message"] = message
    if started:
        t["startedAt"] = started
    if finished:
        t["finishedAt"] = finished
    return t


def _container_status(c: ContainerState, default_waiting: str, budget: int) -> dict[str, Any]:
    st: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imageID": f"local://{c.image}",
        "ready": c.completed if c.init else c.ready,
        "started": c.started if not c.init else c.running,
        "restartCount": c.restart_count,
    }
    if c.pid is not None:
        st["containerID"] = f"process://{c.pid}"
    if c.running:
        st["state"] = {"running": {"startedAt": c.started_at}}
    elif c.terminated_exit_code is not None:
        st["state"] = {
            "terminated": _terminated(
                c.terminated_exit_code, c.last_message[-budget:], c.last_started_at, c.last_finished_at
            )
        }
    else:
        waiting: dict[str, Any] = {"reason": c.waiting_reason or default_waiting}
        if c.waiting_message:
            waiting["message"] = c.waiting_message
        st["state"] = {"waiting": waiting}
    if c.last_exit_code is not None and c.terminated_exit_code is None:
        st["lastState"] = {
            "terminated": _terminated(
                c.last_exit_code, c.last_message[-budget:], c.last_started_at, c.last_finished_at
            )
        }
    return st


def _condition(
    pod: dict[str, Any], ctype: str, status: bool, now: str, reason: str = "", message: str = ""
) -> dict[str, Any]:
    """A pod condition whose lastTransitionTime only moves when its status flips."""
    want = "True" if status else "False"
    out: dict[str, Any] = {"type": ctype, "status": want, "lastTransitionTime": now}
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c["type"] == ctype and c.get("status") == want:
            out["lastTransitionTime"] = c.get("lastTransitionTime") or now
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def _go_list(names: list[str]) -> str:
    """A Go ``[]string`` formatted with ``%s``: ``[a b]``."""
    return "[" + " ".join(names) + "]"


def readiness_gates_pass(pod: dict[str, Any]) -> bool:
    """All ``spec.readinessGates`` have a condition with status True (a missing condition is False)."""
    return not _gate_messages(pod)


def _gate_messages(pod: dict[str, Any]) -> list[str]:
    conds = {c["type"]: c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
    out = []
    for g in pod["spec"].get("readinessGates") or []:
        t = g["conditionType"]
        if t not in conds:
            out.append(f'corresponding condition of pod readiness gate "{t}" does not exist.')
        elif conds[t] != "True":
            out.append(f'the status of pod readiness gate "{t}" is not "True", but {conds[t]}')
    return out


def pod_phase(restart_policy: str, init: list[ContainerState], containers: list[ContainerState]) -> str:
    """The kubelet's ``getPhase`` for regular init containers and containers."""
    pending_init = failed_init = 0
    for c in init:
        if c.running:
            pending_init += 1
        elif c.terminated_exit_code is not None:
            failed_init += c.terminated_exit_code != 0
        elif c.last_exit_code is not None:  # waiting after a run: in back-off
            failed_init += c.last_exit_code != 0
            pending_init += c.last_exit_code == 0
        else:
            pending_init += 1
    running = waiting = stopped = succeeded = 0
    for c in containers:
        if c.running:
            running += 1
        elif c.terminated_exit_code is not None:
            stopped += 1
            succeeded += c.terminated_exit_code == 0
        elif c.last_exit_code is not None:
            stopped += 1
        else:
            waiting += 1
    if failed_init and restart_policy == "Never":
        return "Failed"
    if pending_init or waiting:
        return "Pending"
    if running:
        return "Running"
    if stopped:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        return "Failed" if restart_policy == "Never" else "Running"
    return "Pending"


def desired_status(pod: dict[str, Any], state: PodState, now: str) -> dict[str, Any]:
    """The ``status`` fields the agent owns for this pod (merged by condition type on patch)."""
    policy = pod["spec"].get("restartPolicy", "Always")
    phase = pod_phase(policy, state.init_containers, state.containers)
    default_waiting = PODINITIALIZING if state.init_containers else CONTAINERCREATING
    n = len(state.containers) + len(state.init_containers)
    budget = MAX_POD_TERMINATION_MESSAGE_BYTES // max(n, 1)

    incomplete = [c.name for c in state.init_containers if not c.completed]
    any_started = any(c.running or c.last_exit_code is not None for c in state.containers)
    if phase == "Succeeded" and not incomplete:
        initialized = _condition(pod, "Initialized", True, now, "PodCompleted")
    elif any_started or not incomplete:
        initialized = _condition(pod, "Initialized", True, now)
    else:
        initialized = _condition(
            pod,
            "Initialized",
            False,
            now,
            "ContainersNotInitialized",
            f"containers with incomplete status: {_go_list(incomplete)}",
        )

    unready = [c.name for c in state.containers if not c.ready]
    if phase in ("Succeeded", "Failed"):
        reason = "PodCompleted" if phase == "Succeeded" else "PodFailed"
        containers_ready = _condition(pod, "ContainersReady", False, now, reason)
        ready = _condition(pod, "Ready", False, now, reason)
    elif unready or not state.containers:
        msg = f"containers with unready status: {_go_list(unready)}" if unready else ""
        containers_ready = _condition(pod, "ContainersReady", False, now, "ContainersNotReady", msg)
        ready = _condition(pod, "Ready", False, now, "ContainersNotReady", msg)
    else:
        containers_ready = _condition(pod, "ContainersReady", True, now)
        gates = _gate_messages(pod)
        if gates:
            ready = _condition(pod, "Ready", False, now, "ReadinessGatesNotReady", ", ".join(gates))
        else:
            ready = _condition(pod, "Ready", True, now)
    out = {
        "phase": phase,
        "hostIP": NODE_IP,
        "hostIPs": [{"ip": NODE_IP}],
        "podIP": state.pod_ip,
        "podIPs": [{"ip": state.pod_ip}],
        "startTime": state.start_time,
        "conditions": [
            _condition(pod, "PodReadyToStartContainers", True, now),
            initialized,
            containers_ready,
            ready,
        ],
        "containerStatuses": [_container_status(c, default_waiting, budget) for c in state.containers],
    }
    if state.init_containers:
        out["initContainerStatuses"] = [
            _container_status(c, PODINITIALIZING, budget) for c in state.init_containers
        ]
    return out


_STATUS_KEYS = ("lastState", "state", "ready", "started", "restartCount", "containerID")


def status_differs(pod: dict[str, Any], desired: dict[str, Any]) -> bool:
    """Whether patching ``desired`` would change the pod's live status."""
    live = pod.get("status") or {}
    for key, value in desired.items():
        if key == "conditions":
            live_conds = {c["type"]: c for c in live.get("conditions") or []}
            for c in value:
                lc = live_conds.get(c["type"])
                if lc is None or any(
                    (lc.get(k) or None) != (c.get(k) or None) for k in ("status", "reason", "message")
                ):
                    return True
        elif key in ("containerStatuses", "initContainerStatuses"):
            mine = [{k: s.get(k) or None for k in _STATUS_KEYS} for s in value]
            theirs = [{k: s.get(k) or None for k in _STATUS_KEYS} for s in live.get(key) or []]
            if mine != theirs:
                return True
        elif live.get(key) != value:
            return True
    return False
