"""Init containers and termination messages in the node agent's pod status (the kubelet's rules)."""

from __future__ import annotations

from typing import Any

import pytest
from localcluster.podstatus import (
    ContainerState,
    PodState,
    desired_status,
    pod_phase,
    status_differs,
    termination_message,
)


def _pod(policy: str = "Always") -> dict[str, Any]:
    return {
        "spec": {
            "restartPolicy": policy,
            "initContainers": [{"name": "fetch"}, {"name": "check"}],
            "containers": [{"name": "server"}],
        },
        "status": {},
    }


def _state() -> PodState:
    return PodState(
        pod_ip="10.244.1.2",
        start_time="t0",
        init_containers=[ContainerState("fetch", "i", init=True), ContainerState("check", "i", init=True)],
        containers=[ContainerState("server", "i")],
    )


def _cond(st: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in st["conditions"] if c["type"] == ctype)


def test_before_the_init_containers_ran_everything_waits_pod_initializing() -> None:
    st = desired_status(_pod(), _state(), "now")
    assert st["phase"] == "Pending"
    init = _cond(st, "Initialized")
    assert init["status"] == "False" and init["reason"] == "ContainersNotInitialized"
    assert init["message"] == "containers with incomplete status: [fetch check]"
    assert [s["state"] for s in st["initContainerStatuses"]] == [
        {"waiting": {"reason": "PodInitializing"}}
    ] * 2
    assert st["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert _cond(st, "Ready")["reason"] == "ContainersNotReady"
    assert _cond(st, "Ready")["message"] == "containers with unready status: [server]"


def test_a_completed_init_container_is_ready_and_terminated_completed() -> None:
    state = _state()
    fetch = state.init_containers[0]
    fetch.running, fetch.started_at, fetch.pid = True, "t1", 7
    st = desired_status(_pod(), state, "now")
    assert st["initContainerStatuses"][0]["state"] == {"running": {"startedAt": "t1"}}
    assert st["phase"] == "Pending"
    fetch.finished(0, "", "t2")
    fetch.terminated_exit_code = 0
    st = desired_status(_pod(), state, "now")
    s = st["initContainerStatuses"][0]
    assert s["ready"] is True and s["started"] is False
    assert s["state"] == {
        "terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "t1", "finishedAt": "t2"}
    }
    assert "lastState" not in s
    assert _cond(st, "Initialized")["message"] == "containers with incomplete status: [check]"


def test_all_init_containers_done_initializes_the_pod() -> None:
    state = _state()
    for c in state.init_containers:
        c.finished(0, "", "t")
        c.terminated_exit_code = 0
    st = desired_status(_pod(), state, "now")
    assert _cond(st, "Initialized")["status"] == "True" and "reason" not in _cond(st, "Initialized")
    state.containers[0].running = True
    assert desired_status(_pod(), state, "now")["phase"] == "Running"


def test_a_failing_init_container_in_back_off_shows_its_termination_message() -> None:
    state = _state()
    fetch = state.init_containers[0]
    fetch.started_at = "t1"
    fetch.finished(3, "AccessDenied: s3://models/x", "t2")
    fetch.restart_count = 2
    fetch.waiting_reason, fetch.waiting_message = "CrashLoopBackOff", "back-off 4s restarting failed"
    st = desired_status(_pod(), state, "now")
    assert st["phase"] == "Pending"
    s = st["initContainerStatuses"][0]
    assert s["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert s["lastState"]["terminated"]["message"] == "AccessDenied: s3://models/x"
    assert s["lastState"]["terminated"]["exitCode"] == 3 and s["restartCount"] == 2
    assert _cond(st, "Initialized")["status"] == "False"


def test_a_failed_init_container_fails_the_pod_with_restart_policy_never() -> None:
    state = _state()
    fetch = state.init_containers[0]
    fetch.finished(1, "NotFound", "t2")
    fetch.terminated_exit_code = 1
    st = desired_status(_pod("Never"), state, "now")
    assert st["phase"] == "Failed"
    s = st["initContainerStatuses"][0]
    assert s["state"]["terminated"]["message"] == "NotFound" and "lastState" not in s
    assert _cond(st, "Ready")["reason"] == "PodFailed"
    assert _cond(st, "Initialized")["status"] == "False"


@pytest.mark.parametrize(
    ("policy", "init_code", "main", "want"),
    [
        ("Always", None, "waiting", "Pending"),
        ("OnFailure", 1, "waiting", "Pending"),  # failed init, restarting
        ("Never", 1, "waiting", "Failed"),
        ("Always", 0, "running", "Running"),
        ("Always", 0, "crashed", "Running"),
        ("OnFailure", 0, "crashed", "Running"),
        ("Never", 0, "crashed", "Failed"),
        ("Never", 0, "done", "Succeeded"),
    ],
)
def test_pod_phase_follows_the_kubelets_get_phase(
    policy: str, init_code: int | None, main: str, want: str
) -> None:
    init = ContainerState("i", "x", init=True)
    if init_code is not None:
        init.finished(init_code, "", "t")
        if init_code == 0 or policy == "Never":
            init.terminated_exit_code = init_code
    c = ContainerState("c", "x")
    if main == "running":
        c.running = True
    elif main == "crashed":
        c.finished(2, "", "t")
        if policy == "Never":
            c.terminated_exit_code = 2
    elif main == "done":
        c.finished(0, "", "t")
        c.terminated_exit_code = 0
    assert pod_phase(policy, [init], [c]) == want


def test_termination_message_takes_the_files_last_4_kib() -> None:
    assert termination_message(b"x" * 5000 + b"END", b"log", fallback_to_logs=True, exit_code=1) == (
        "x" * (4096 - 3) + "END"
    )
    assert termination_message(b"", b"a\nb\n", fallback_to_logs=False, exit_code=1) == ""


def test_fallback_to_logs_on_error_takes_the_last_80_lines_at_most_2_kib() -> None:
    log = b"".join(f"line {i}\n".encode() for i in range(200))
    msg = termination_message(b"", log, fallback_to_logs=True, exit_code=2)
    assert msg.startswith("line 120\n") and msg.endswith("line 199\n")
    long_lines = b"".join(b"y" * 99 + b"\n" for _ in range(80))
    assert len(termination_message(b"", long_lines, fallback_to_logs=True, exit_code=2)) == 2048
    # only on a failed exit, and never over a non-empty file
    assert termination_message(b"", log, fallback_to_logs=True, exit_code=0) == ""
    assert termination_message(b"own", log, fallback_to_logs=True, exit_code=2) == "own"


def test_messages_share_the_pods_12_kib() -> None:
    state = _state()
    for c in state.init_containers:
        c.finished(1, "m" * 4096, "t")
    st = desired_status(_pod(), state, "now")
    # three statuses: 12 KiB / 3 = 4 KiB each, so nothing is cut here
    assert len(st["initContainerStatuses"][0]["lastState"]["terminated"]["message"]) == 4096
    pod = _pod()
    pod["spec"]["containers"] += [{"name": "b"}]
    state.containers.append(ContainerState("b", "i"))
    st = desired_status(pod, state, "now")
    assert len(st["initContainerStatuses"][0]["lastState"]["terminated"]["message"]) == 3072


def test_a_changed_condition_message_is_a_change() -> None:
    pod, state = _pod(), _state()
    pod["status"] = desired_status(pod, state, "now")
    assert not status_differs(pod, desired_status(pod, state, "later"))
    state.init_containers[0].finished(0, "", "t")
    state.init_containers[0].terminated_exit_code = 0
    assert status_differs(pod, desired_status(pod, state, "later"))
