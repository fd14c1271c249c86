"""Containers the kernel killed for their memory limit, read from a pod's status (pure).

A revision whose memory limit is too small for its server never becomes ready: the kernel kills the
server while it loads, the kubelet restarts it, and it crash-loops. Without this the rollout would notice
only at ``progressDeadline`` (minutes) and say "0/1 canary pods in traffic"; the kubelet already says
why, in the container's status (``reason: OOMKilled``), within a second of the kill.

* :func:`oom_kill` -- a pod's OOM-killed container (its name, the pod, the memory limit, restarts), or
  None;
* :func:`worst` -- of several pods, the one to report (one that is down now before one that recovered);
* :func:`describe` -- the words every report uses (history, events, conditions).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

OOM_KILLED = "OOMKilled"


@dataclass(frozen=True)
class OOMKill:
    container: str
    pod: str
    memory_limit: str | None  # the container's limits.memory as the pod spec has it; None: no limit
    restarts: int  # the container's restartCount
    down: bool  # killed and not ready again (terminated, in CrashLoopBackOff, or restarting)


def _limits(pod: Mapping[str, Any]) -> dict[str, str | None]:
    spec = pod.get("spec") or {}
    out: dict[str, str | None] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        limit = ((c.get("resources") or {}).get("limits") or {}).get("memory")
        out[c.get("name", "")] = str(limit) if limit is not None else None
    return out


def _killed(st: Mapping[str, Any]) -> bool | None:
    """True: OOM-killed and down now; False: OOM-killed last time, ready again; None: not OOM-killed.
    ``state.terminated`` is the kill itself (until the kubelet restarts it); ``lastState.terminated``
    stays the kill while it waits in CrashLoopBackOff, while it starts again, and after it is ready.
    Running but not ready is still down: a server killed while loading is restarted, runs a few
    seconds and is killed again -- reporting it up in between would flap the condition every restart."""
    state = st.get("state") or {}
    if (state.get("terminated") or {}).get("reason") == OOM_KILLED:
        return True
    if ((st.get("lastState") or {}).get("terminated") or {}).get("reason") == OOM_KILLED:
        return not ("running" in state and st.get("ready") is True)
    return None


def oom_kill(pod: Mapping[str, Any]) -> OOMKill | None:
    """The pod's OOM-killed container (the server's before an init container's), or None."""
    status = pod.get("status") or {}
    name = (pod.get("metadata") or {}).get("name", "")
    limits = _limits(pod)
    for key in ("containerStatuses", "initContainerStatuses"):
        for st in status.get(key) or []:
            killed = _killed(st)
            if killed is None:
                continue
            container = st.get("name", "")
            restarts = int(st.get("restartCount") or 0)
            return OOMKill(container, name, limits.get(container), restarts, killed)
    return None


def worst(kills: Iterable[OOMKill]) -> OOMKill | None:
    """The one to report: a container that is down now, then the most restarts, then by pod name (stable
    across reconciles, so a status is not rewritten for nothing)."""
    return min(kills, key=lambda k: (not k.down, -k.restarts, k.pod, k.container), default=None)


def describe(k: OOMKill) -> str:
    """``container server of pod echo-1a2b-xyz OOMKilled (memory limit 150Mi), restarted 2 time(s)``."""
    limit = f"memory limit {k.memory_limit}" if k.memory_limit else "no memory limit"
    return f"container {k.container} of pod {k.pod} {OOM_KILLED} ({limit}), restarted {k.restarts} time(s)"
