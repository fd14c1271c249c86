"""Container probes (httpGet, tcpSocket, exec) run against a process-run pod, with kubelet's counting."""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from typing import Any

import httpx


def _port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int) or (isinstance(port, str) and port.isdigit()):
        return int(port)
    for p in container.get("ports") or []:
        if p.get("name") == port:
            return int(p["containerPort"])
    raise ValueError(f"container {container['name']!r} has no port named {port!r}")


def run_probe(
    probe: dict[str, Any],
    container: dict[str, Any],
    pod_ip: str,
    env: dict[str, str],
    exec_prefix: list[str] = [],  # noqa: B006 - never mutated
) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            h = probe["httpGet"]
            scheme = h.get("scheme", "HTTP").lower()
            url = f"{scheme}://{pod_ip}:{_port(container, h['port'])}{h.get('path', '/')}"
            headers = {x["name"]: x["value"] for x in h.get("httpHeaders") or []}
            r = httpx.get(url, headers=headers, timeout=timeout, verify=False)
            return 200 <= r.status_code < 400
        if "tcpSocket" in probe:
            port = _port(container, probe["tcpSocket"]["port"])
            with socket.create_connection((pod_ip, port), timeout=timeout):
                return True
        if "exec" in probe:
            res = subprocess.run(
                [*exec_prefix, *probe["exec"]["command"]],
                env={**os.environ, **env},
                timeout=timeout,
                capture_output=True,
            )
            return res.returncode == 0
    except (OSError, httpx.HTTPError, subprocess.TimeoutExpired, ValueError):
        return False
    return False


@dataclass
class ProbeTracker:
    """Kubelet's probe bookkeeping: initial delay, period, success and failure thresholds."""

    probe: dict[str, Any] | None
    result: bool  # current verdict before the first run (readiness: False, liveness: True)
    started_at: float = 0.0
    next_run: float = 0.0
    successes: int = 0
    failures: int = 0

    def reset(self, now: float, initial: bool) -> None:
        self.started_at = now
        self.result = initial
        self.successes = self.failures = 0
        delay = float((self.probe or {}).get("initialDelaySeconds", 0))
        self.next_run = now + delay

    def due(self, now: float) -> bool:
        return self.probe is not None and now >= self.next_run

    def record(self, ok: bool, now: float) -> bool:
        """Count one probe result; return the (possibly changed) verdict."""
        assert self.probe is not None
        self.next_run = now + float(self.probe.get("periodSeconds", 10))
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.probe.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.probe.get("failureThreshold", 3)):
                self.result = False
        return self.result
