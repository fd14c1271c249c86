"""A process in a cgroup (v1) memory limit: what the kubelet gives a container with
``resources.limits.memory``. Needs root and a writable memory controller (this machine has both)."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

ROOT = Path("/sys/fs/cgroup/memory")


class MemoryCgroup:
    def __init__(self, limit_bytes: int) -> None:
        self.path = ROOT / f"modeldeploy-test-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
        # the container's limit holds swap too (the kubelet sets memsw where swap accounting exists)
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(str(limit_bytes))
        self.limit = limit_bytes

    def prefix(self) -> list[str]:
        """argv prefix that runs a command inside the cgroup."""
        return ["sh", "-c", f'echo $$ > {self.path}/cgroup.procs && exec "$@"', "in-cgroup"]

    def read(self, name: str) -> int:
        return int((self.path / name).read_text().split()[0])

    def oom_kills(self) -> int:
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return self.read("memory.failcnt")  # old kernels: no oom_kill counter

    def remove(self) -> None:
        for pid in (self.path / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def available() -> bool:
    return os.geteuid() == 0 and os.access(ROOT, os.W_OK)
