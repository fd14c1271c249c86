"""The node agent's kubelet-like pod status and probe bookkeeping."""

from __future__ import annotations

from typing import Any

from localcluster.podstatus import (
    ContainerState,
    PodState,
    desired_status,
    readiness_gates_pass,
    status_differs,
)
from localcluster.probes import ProbeTracker


def _pod(gates: list[str] = (), conditions: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "spec": {"containers": [{"name": "c"}], "readinessGates": [{"conditionType": g} for g in gates]},
        "status": {"conditions": list(conditions)},
    }


def _state(ready: bool, running: bool = True) -> PodState:
    c = ContainerState(
        name="c", image="i", running=running, ready=ready, started=running, pid=42, started_at="t0"
    )
    return PodState(pod_ip="127.64.0.1", start_time="t0", containers=[c])


def _cond(status: dict[str, Any], ctype: str) -> str:
    return next(c["status"] for c in status["conditions"] if c["type"] == ctype)


def test_ready_needs_ready_containers() -> None:
    st = desired_status(_pod(), _state(ready=False), "now")
    assert st["phase"] == "Running" and st["podIP"] == "127.64.0.1"
    assert _cond(st, "ContainersReady") == "False" and _cond(st, "Ready") == "False"
    st = desired_status(_pod(), _state(ready=True), "now")
    assert _cond(st, "Ready") == "True"


def test_ready_needs_every_readiness_gate_true() -> None:
    gate = "modeldeploy.io/in-traffic"
    assert not readiness_gates_pass(_pod([gate]))
    st = desired_status(_pod([gate]), _state(ready=True), "now")
    assert _cond(st, "ContainersReady") == "True" and _cond(st, "Ready") == "False"
    on = _pod([gate], [{"type": gate, "status": "True"}])
    assert _cond(desired_status(on, _state(ready=True), "now"), "Ready") == "True"
    off = _pod([gate], [{"type": gate, "status": "False"}])
    assert _cond(desired_status(off, _state(ready=True), "now"), "Ready") == "False"


def test_transition_time_kept_while_status_unchanged() -> None:
    pod = _pod(conditions=[{"type": "Ready", "status": "True", "lastTransitionTime": "earlier"}])
    st = desired_status(pod, _state(ready=True), "now")
    assert next(c for c in st["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == "earlier"
    st = desired_status(pod, _state(ready=False), "now")
    assert next(c for c in st["conditions"] if c["type"] == "Ready")["lastTransitionTime"] == "now"


def test_status_differs_only_on_real_changes() -> None:
    pod = _pod()
    want = desired_status(pod, _state(ready=True), "now")
    assert status_differs(pod, want)
    pod["status"] = dict(want)
    assert not status_differs(pod, desired_status(pod, _state(ready=True), "later"))
    assert status_differs(pod, desired_status(pod, _state(ready=False), "later"))


def test_terminated_containers_make_the_pod_succeeded_or_failed() -> None:
    state = _state(ready=False, running=False)
    pod = _pod()
    for policy, code, phase in (
        ("Never", 0, "Succeeded"),
        ("Never", 1, "Failed"),
        ("OnFailure", 0, "Succeeded"),
        ("Always", 0, "Running"),  # the kubelet: "all containers are in the process of restarting"
    ):
        pod["spec"]["restartPolicy"] = policy
        state.containers[0].terminated_exit_code = code
        st = desired_status(pod, state, "now")
        assert st["phase"] == phase, (policy, code)
    pod["spec"]["restartPolicy"] = "Never"
    state.containers[0].terminated_exit_code = 1
    st = desired_status(pod, state, "now")
    assert next(c for c in st["conditions"] if c["type"] == "Ready")["reason"] == "PodFailed"


def test_a_crash_looping_container_keeps_the_pod_running_like_the_kubelet() -> None:
    state = _state(ready=False, running=False)
    c = state.containers[0]
    c.finished(1, "boom", "t1")
    c.waiting_reason, c.waiting_message = "CrashLoopBackOff", "back-off 2s restarting failed container=c"
    st = desired_status(_pod(), state, "now")
    assert st["phase"] == "Running"
    cs = st["containerStatuses"][0]
    assert cs["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": c.waiting_message}}
    assert cs["lastState"]["terminated"] == {
        "exitCode": 1,
        "reason": "Error",
        "message": "boom",
        "startedAt": "t0",
        "finishedAt": "t1",
    }


def test_probe_tracker_counts_thresholds_and_honours_delay_and_period() -> None:
    t = ProbeTracker(
        {"initialDelaySeconds": 5, "periodSeconds": 2, "failureThreshold": 2, "successThreshold": 2}, False
    )
    t.reset(100.0, initial=False)
    assert not t.due(104.9) and t.due(105.0)
    assert t.record(True, 105.0) is False  # one success of two
    assert not t.due(106.0) and t.due(107.0)
    assert t.record(True, 107.0) is True
    assert t.record(False, 109.0) is True  # one failure of two
    assert t.record(False, 111.0) is False


def test_empty_last_state_from_the_apiserver_is_no_change() -> None:
    pod = _pod()
    want = desired_status(pod, _state(ready=True), "now")
    live = dict(want)
    live["containerStatuses"] = [{**want["containerStatuses"][0], "lastState": {}}]
    pod["status"] = live
    assert not status_differs(pod, want)
