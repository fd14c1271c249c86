"""``down`` leaves the machine as ``up --node containerd`` found it: no process, mount, cgroup, route,
namespace, host path or sysctl of the real node is left. Runs before the session's cluster starts
(conftest.py's OWN_NODE_MODULES), so that cluster's ``up`` is also the second ``up`` on this machine."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from localcluster import realnode
from localcluster import realnode_config as rc
from localcluster.cluster import down, up

WATCHED_MOUNT_ROOTS = ("/run/containerd", "/var/lib/kubelet", "/run/netns", "/var/run/netns")


def _node_processes() -> list[str]:
    names = ("kubelet", "containerd", "containerd-shim-runc-v2", "modeldeploy-device-plugin", "pause")
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                exe = os.readlink(d / "exe")
            except OSError:
                continue
            base = os.path.basename(exe)  # the binaries directory links to <name>-<version>-<key>
            if any(base == n or base.startswith(f"{n}-v") for n in names):
                found.append(f"{d.name} {exe}")
    return found


def host_snapshot(extra_roots: tuple[Path, ...]) -> dict[str, Any]:
    roots = (*WATCHED_MOUNT_ROOTS, *map(str, extra_roots))
    mounts = sorted(
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if any(line.split()[4] == r or line.split()[4].startswith(r + "/") for r in roots)
    )
    ip = lambda *a: subprocess.run(["ip", *a], capture_output=True, text=True).stdout  # noqa: E731
    return {
        "sysctls": {k: Path("/proc/sys", k).read_text().strip() for k in rc.KUBELET_SYSCTLS},
        "paths": {p: os.path.lexists(p) for p in realnode.HOST_PATHS},
        "mounts": mounts,
        "cgroups": sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods")),
        "routes": ip("route"),
        "netns": sorted(n for n in ip("netns", "list").split() if n.startswith(("modeldeploy-", "cni-"))),
        "links": sorted(n for n in ip("-o", "link").split() if n.startswith(("mdh", "cni0", "veth"))),
        "processes": _node_processes(),
    }


def test_down_leaves_the_host_as_up_found_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    state = tmp_path_factory.mktemp("updown")
    root = realnode.containerd_root()
    before = host_snapshot((state,))
    cluster = up(state, node="containerd")
    try:
        during = host_snapshot((state, root))
        assert during["processes"], "no kubelet/containerd process while the node runs"
        assert during["cgroups"], "the kubelet made no kubepods cgroup"
        assert all(Path("/proc/sys", k).read_text().strip() == str(v) for k, v in rc.KUBELET_SYSCTLS.items())
        assert cluster.node == "containerd"
    finally:
        down(state)
    after = host_snapshot((state,))
    assert after == before
