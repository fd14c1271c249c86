"""A container the kernel killed for its memory limit: the pod facts (modeldeploy.oom), a canary rolled
back at once naming it, a stable reported and left running."""

from __future__ import annotations

from typing import Any

from md_canary import World, canary_md
from modeldeploy import builders as b
from modeldeploy.oom import OOMKill, describe, oom_kill, worst


def _pod(
    state: dict[str, Any],
    last: dict[str, Any] | None = None,
    *,
    restarts: int = 0,
    limit: str | None = "150Mi",
    init: bool = False,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "server"}
    if limit is not None:
        container["resources"] = {"limits": {"memory": limit}}
    st: dict[str, Any] = {"name": "server", "state": state, "restartCount": restarts}
    if last is not None:
        st["lastState"] = last
    key = "initContainers" if init else "containers"
    return {
        "metadata": {"name": "echo-abc-1"},
        "spec": {key: [container]},
        "status": {"initContainerStatuses" if init else "containerStatuses": [st]},
    }


OOM = {"terminated": {"reason": "OOMKilled", "exitCode": 137}}
CRASHLOOP = {"waiting": {"reason": "CrashLoopBackOff"}}
RUNNING = {"running": {"startedAt": "2026-01-01T00:00:00Z"}}


def test_a_container_killed_now_is_down():
    assert oom_kill(_pod(OOM, restarts=0)) == OOMKill("server", "echo-abc-1", "150Mi", 0, True)


def test_a_container_waiting_to_restart_after_the_kill_is_down():
    assert oom_kill(_pod(CRASHLOOP, OOM, restarts=3)) == OOMKill("server", "echo-abc-1", "150Mi", 3, True)


def test_a_container_ready_again_after_a_kill_is_up_and_one_only_running_is_still_down():
    ready = _pod(RUNNING, OOM, restarts=1)
    ready["status"]["containerStatuses"][0]["ready"] = True
    k = oom_kill(ready)
    assert k is not None and not k.down and k.restarts == 1
    starting = oom_kill(_pod(RUNNING, OOM, restarts=1))  # restarted, not ready: killed again soon
    assert starting is not None and starting.down


def test_other_terminations_are_not_oom_kills():
    assert oom_kill(_pod({"terminated": {"reason": "Error", "exitCode": 1}})) is None
    assert oom_kill(_pod(CRASHLOOP, {"terminated": {"reason": "Error", "exitCode": 137}})) is None
    assert oom_kill(_pod(RUNNING)) is None
    assert oom_kill({"metadata": {"name": "p"}}) is None  # no status yet


def test_an_init_container_and_no_limit():
    k = oom_kill(_pod(OOM, init=True, limit=None))
    assert k is not None and k.memory_limit is None
    said = "container server of pod echo-abc-1 OOMKilled (no memory limit), restarted 0 time(s)"
    assert describe(k) == said


def test_the_one_reported_is_down_then_most_restarted_then_by_name():
    up = OOMKill("server", "a", "1Gi", 9, False)
    down_b = OOMKill("server", "b", "1Gi", 2, True)
    down_c = OOMKill("server", "c", "1Gi", 5, True)
    assert worst([up, down_b, down_c]) == down_c
    assert worst([up]) == up and worst([]) is None


# ---------------------------------------------------------------------------------------------- rollout


def _oom(w: World, pod: dict[str, Any], restarts: int) -> None:
    """The kubelet's report of the kill: the server container waits in CrashLoopBackOff."""
    pod["spec"]["containers"] = [{"name": b.CONTAINER_NAME, "resources": {"limits": {"memory": "150Mi"}}}]
    pod["status"]["containerStatuses"] = [
        {"name": b.CONTAINER_NAME, "state": CRASHLOOP, "lastState": OOM, "restartCount": restarts}
    ]
    pod["status"]["conditions"] = [
        c for c in pod["status"]["conditions"] if c["type"] not in ("ContainersReady", "Ready")
    ] + [{"type": "ContainersReady", "status": "False"}]


def test_an_oom_killed_canary_is_rolled_back_at_once_naming_the_container():
    w = World(canary_md(interval="60s", progressDeadline="10m"))
    old = w.deploy_first()
    new = w.new_version("2")
    w.rec.reconcile("default", "minilm")
    w.controllers()
    pod = w.pods(new)[0]
    _oom(w, pod, restarts=2)
    w.rec.reconcile("default", "minilm")  # the pod's watch event: no time passes, no window is judged
    st = w.status
    assert st["stableRevision"] == old and "canaryRevision" not in st
    h = st["history"][-1]
    assert (h["revision"], h["outcome"]) == (new, "RolledBack")
    name = pod["metadata"]["name"]
    want = f"container {b.CONTAINER_NAME} of pod {name} OOMKilled (memory limit 150Mi), restarted 2 time(s)"
    assert h["reason"] == want
    assert w.prom.windows(new) == 0
    rolled = [e for e in w.fake.events if e["reason"] == "RolledBack"]
    assert rolled and want in rolled[-1]["message"]
    assert w.cond("Degraded")["reason"] == "RolledBack" and want in w.cond("Degraded")["message"]
    assert w.pods_in_traffic(old) == 2


def test_an_oom_killed_canary_is_rolled_back_while_paused_too():
    w = World(canary_md(interval="60s"))
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.raw["spec"]["rollout"]["paused"] = True
    _oom(w, w.pods(new)[0], restarts=0)
    w.rec.reconcile("default", "minilm")
    assert w.status["history"][-1]["outcome"] == "RolledBack"


def test_an_oom_killed_stable_is_reported_and_left_running():
    w = World(canary_md())
    stable = w.deploy_first()
    pod = w.pods(stable)[0]
    _oom(w, pod, restarts=1)
    w.reconcile()
    st = w.status
    assert st["stableRevision"] == stable and [h["outcome"] for h in st["history"]] == ["Deployed"]
    deg = w.cond("Degraded")
    assert deg["status"] == "True" and deg["reason"] == "OOMKilled"
    assert f"of pod {pod['metadata']['name']} OOMKilled (memory limit 150Mi)" in deg["message"]
    assert st["phase"] == "Degraded"
    assert [e["type"] for e in w.fake.events if e["reason"] == "OOMKilled"] == ["Warning"]
    assert w.fake.obj("Deployment", f"minilm-{stable}")["spec"]["replicas"] == 2
    # it runs again (the kill stays in lastState for the pod's life): no longer Degraded
    pod["status"]["containerStatuses"][0].update(state=RUNNING, ready=True)
    pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "ContainersReady"]
    pod["status"]["conditions"].append({"type": "ContainersReady", "status": "True"})
    w.reconcile()
    assert w.cond("Degraded")["status"] == "False" and w.status["phase"] == "Healthy"
