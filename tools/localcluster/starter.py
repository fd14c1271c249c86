"""Starting the local cluster's processes: each in a process group of its own with its log under the
state directory, recorded in ``cluster.json`` as soon as it runs, and waited on until it is ready."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .state import ClusterRecord, Layout, ProcessRecord


class ClusterError(RuntimeError):
    """A component failed to start or the cluster did not become Ready; the message holds its log tail."""


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Starter:
    def __init__(self, layout: Layout, record: ClusterRecord) -> None:
        self.layout = layout
        self.record = record
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        logpath = self.layout.log(name)
        with open(logpath, "ab") as logf:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.layout.root,
                env={**os.environ, **(env or {})},
            )
        self.procs[name] = proc
        self.record.processes.append(ProcessRecord(name, proc.pid, argv, str(logpath)))
        self.record.save()

    def wait_for(self, name: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode}; log {self.layout.log(name)}:\n"
                    f"{_tail(self.layout.log(name))}"
                )
            with contextlib.suppress(Exception):
                if check():
                    return
            time.sleep(0.2)
        raise ClusterError(
            f"{name} not ready after {timeout:.0f}s; log {self.layout.log(name)}:\n"
            f"{_tail(self.layout.log(name))}"
        )
