"""One pod on the process node agent (:mod:`localcluster.agent`), run as a kubelet runs it: its volumes
first, then the init containers in order, each to completion, then the containers as local processes
inside the cluster's pod network namespace; probes, restarts with back-off, status reports, the
preStop hook and the graceful stop on deletion."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import urllib3

from . import images
from .container_env import ConfigError, ContainerEnv
from .kubeapi import KubeError
from .podstatus import (
    MAX_TERMINATION_MESSAGE_BYTES,
    PODINITIALIZING,
    ContainerState,
    PodState,
    desired_status,
    status_differs,
    termination_message,
)
from .probes import ProbeTracker, run_probe
from .volumes import (
    Mount,
    PodVolumes,
    VolumeError,
    check_mount_path,
    container_mounts,
    wrap_command,
)

if TYPE_CHECKING:
    from .agent import NodeAgent

log = logging.getLogger("localcluster.agent")

TICK_S = 0.2
MAX_BACKOFF_S = 10.0
VOLUME_RETRY_S = 1.0  # between attempts to provide a pod's volumes
REFRESH_S = 5.0  # between re-reads of a pod's configMap and secret volumes
DEFAULT_TERMINATION_PATH = "/dev/termination-log"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ContainerRunner:
    def __init__(self, spec: dict[str, Any], *, init: bool = False, has_init: bool = False) -> None:
        self.spec = spec
        self.init = init
        self.argv = images.command_for(spec)
        self.state = ContainerState(name=spec["name"], image=spec["image"], init=init)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup = ProbeTracker(spec.get("startupProbe"), result=False)
        self.readiness = ProbeTracker(spec.get("readinessProbe"), result=False)
        self.liveness = ProbeTracker(spec.get("livenessProbe"), result=True)
        self.restart_at = 0.0
        self.backoff = 1.0
        self.mounts: list[Mount] = []
        self.error: str | None = None  # why the container can never start (a mount the agent refuses)
        self.ever_started = False
        self.log_offset = 0  # where this run's output starts in the container's log file

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class PodRunner:
    def __init__(self, agent: NodeAgent, pod: dict[str, Any]) -> None:
        self.agent = agent
        self.pod = pod
        self.uid: str = pod["metadata"]["uid"]
        self.ns: str = pod["metadata"]["namespace"]
        self.name: str = pod["metadata"]["name"]
        self.ip = agent.ips.take()
        agent.net.add_pod_ip(self.ip)
        self.dir = agent.state_dir / "pods" / f"{self.ns}_{self.name}_{self.uid[:8]}"
        self.dir.mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        self.init_containers = [ContainerRunner(c, init=True) for c in spec.get("initContainers") or []]
        self.containers = [ContainerRunner(c) for c in spec["containers"]]
        if self.init_containers:
            for c in self.containers:
                c.state.waiting_reason = PODINITIALIZING
        self.initialized = not self.init_containers
        self.volumes = PodVolumes(pod, self.dir / "volumes", lookup=self._lookup)
        self.envs = ContainerEnv(agent, pod, ip=self.ip, pod_dir=self.dir)
        self.state = PodState(
            pod_ip=self.ip,
            start_time=now_rfc3339(),
            containers=[c.state for c in self.containers],
            init_containers=[c.state for c in self.init_containers],
        )
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.ns}/{self.name}", daemon=True)
        self._next_refresh = 0.0

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self.pod = pod
        self.volumes.sync(pod)  # downwardAPI files follow label/annotation changes at once

    def vanish(self) -> None:
        """The pod object is gone (force-deleted): stop processes at once."""
        self._gone.set()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{self.ns}/pods/{self.name}"

    @property
    def all_containers(self) -> list[ContainerRunner]:
        return [*self.init_containers, *self.containers]

    def _lookup(self, path: str) -> dict[str, Any] | None:
        return self.agent.api.get(path, ok_missing=True)

    # ----- process management -------------------------------------------------------------------
    def _event(self, reason: str, message: str, container: str | None = None) -> None:
        stamp = now_rfc3339()
        involved: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": self.ns,
            "name": self.name,
            "uid": self.uid,
        }
        if container is not None:
            init = any(c.name == container for c in self.init_containers)
            kind = "initContainers" if init else "containers"
            involved["fieldPath"] = f"spec.{kind}{{{container}}}"
        try:
            self.agent.api.create(
                f"/api/v1/namespaces/{self.ns}/events",
                {
                    "apiVersion": "v1",
                    "kind": "Event",
                    "metadata": {"generateName": f"{self.name}."},
                    "involvedObject": involved,
                    "reason": reason,
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "localcluster-agent"},
                    "firstTimestamp": stamp,
                    "lastTimestamp": stamp,
                    "count": 1,
                },
            )
        except (KubeError, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("event %s for %s/%s not posted: %s", reason, self.ns, self.name, exc)

    def _exec_prefix(self, c: ContainerRunner) -> list[str]:
        """Where exec probes and hooks run: in the container's own mount namespace when it has one."""
        if c.mounts and c.proc is not None:
            return ["nsenter", "-t", str(c.proc.pid), "-m", "-n", "--"]
        return self.agent.net.exec_prefix()

    def _termination_file(self, c: ContainerRunner) -> Path:
        return self.dir / "termination" / c.name

    def _log_file(self, c: ContainerRunner) -> Path:
        return self.dir / f"{c.name}.log"

    def _mounts(self, c: ContainerRunner) -> None:
        """The container's volume mounts and its termination-message file (after the volumes are ready)."""
        if c.argv is None:
            return
        try:
            c.mounts, skipped = container_mounts(c.spec, self.volumes)
        except VolumeError as exc:
            c.error = str(exc)
            return
        if skipped:
            log.info(
                "%s/%s container %s: volume types the node agent does not provide are not mounted: %s",
                self.ns,
                self.name,
                c.name,
                ", ".join(skipped),
            )
        term_path = str(c.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH)
        try:
            target = check_mount_path("terminationMessagePath", term_path)
        except VolumeError as exc:
            log.warning("%s/%s container %s: %s; no termination message", self.ns, self.name, c.name, exc)
            return
        if not any(m.path == target for m in c.mounts):
            c.mounts.append(Mount(self._termination_file(c), target, False))

    def _start(self, c: ContainerRunner) -> bool:
        """Start the container's process; False when it could not (its state says why)."""
        now = time.monotonic()
        if c.argv is None:  # an unmapped image: an init container completes, a sidecar runs, nothing runs
            c.state.started_at = now_rfc3339()
            c.ever_started = True
            if c.init:
                log.info("%s/%s init container %s (unmapped image) not run", self.ns, self.name, c.name)
                c.state.finished(0, "", now_rfc3339())
                c.state.terminated_exit_code = 0
            else:
                c.state.running = c.state.started = c.state.ready = True
            return True
        if c.error is not None:
            if c.state.waiting_reason != "CreateContainerConfigError":
                log.warning("%s/%s container %s not started: %s", self.ns, self.name, c.name, c.error)
                self._event("FailedMount", c.error, c.name)
            c.state.waiting_reason, c.state.waiting_message = "CreateContainerConfigError", c.error
            return False
        try:
            env = self.envs.build(c.spec, self.pod)
        except (ConfigError, KubeError, ValueError) as exc:
            if c.state.waiting_message != str(exc):
                log.warning("%s/%s container %s not started: %s", self.ns, self.name, c.name, exc)
                self._event("Failed", f"Error: {exc}", c.name)
            c.state.waiting_reason, c.state.waiting_message = "CreateContainerConfigError", str(exc)
            c.restart_at = now + 1.0
            return False
        term = self._termination_file(c)
        term.parent.mkdir(parents=True, exist_ok=True)
        term.write_bytes(b"")  # a fresh file for every run, as the kubelet gives each container instance
        term.chmod(0o666)
        scratch = self.dir / "mnt" / c.name
        if c.mounts:
            scratch.mkdir(parents=True, exist_ok=True)
        logpath = self._log_file(c)
        logf = open(logpath, "ab")  # noqa: SIM115 - owned by the child
        try:
            c.log_offset = logf.tell()
            c.proc = subprocess.Popen(
                wrap_command([*self.agent.net.exec_prefix(), *c.argv], c.mounts, scratch, self.agent.keep),
                env=env,
                cwd=c.spec.get("workingDir") or self.dir,
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            logf.close()
        self.agent.procs.add(c.proc.pid)
        if c.ever_started:
            c.state.restart_count += 1
        c.ever_started = True
        c.state.running, c.state.pid, c.state.started_at = True, c.proc.pid, now_rfc3339()
        c.state.waiting_reason, c.state.waiting_message = None, ""
        c.state.ready = False
        c.state.started = c.startup.probe is None
        c.startup.reset(now, initial=c.startup.probe is None)
        c.readiness.reset(now, initial=c.readiness.probe is None)
        c.liveness.reset(now, initial=True)
        log.info(
            "started %s/%s %scontainer %s pid %d on %s",
            self.ns,
            self.name,
            "init " if c.init else "",
            c.name,
            c.proc.pid,
            self.ip,
        )
        return True

    def _message(self, c: ContainerRunner, code: int) -> str:
        """The termination message of the run that just ended (the kubelet's rules)."""
        file_tail = _read_tail(self._termination_file(c), MAX_TERMINATION_MESSAGE_BYTES)
        log_tail = _read_tail(self._log_file(c), 64 * 1024, start=c.log_offset)
        fallback = c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        return termination_message(file_tail, log_tail, fallback_to_logs=fallback, exit_code=code)

    def _reap(self, c: ContainerRunner, code: int) -> None:
        assert c.proc is not None
        self.agent.procs.remove(c.proc.pid)
        c.proc = None
        code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as runtimes report
        c.state.finished(code, self._message(c, code), now_rfc3339())
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if c.init:
            restart = code != 0 and policy != "Never"
        else:
            restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if restart:
            c.restart_at = time.monotonic() + c.backoff
            c.state.waiting_reason = "CrashLoopBackOff"
            c.state.waiting_message = (
                f"back-off {c.backoff:g}s restarting failed container={c.name} "
                f"pod={self.name}_{self.ns}({self.uid})"
            )
            c.backoff = min(c.backoff * 2, MAX_BACKOFF_S)
            log.warning(
                "%s/%s %scontainer %s exited %d; restarting",
                self.ns,
                self.name,
                "init " if c.init else "",
                c.name,
                code,
            )
        else:
            c.state.terminated_exit_code = code
            log.info("%s/%s container %s exited %d; not restarted", self.ns, self.name, c.name, code)

    def _stop_container(self, c: ContainerRunner, grace_s: float) -> None:
        if c.proc is None:
            return
        _kill_group(c.proc.pid, signal.SIGTERM)
        try:
            c.proc.wait(timeout=max(grace_s, 0.1))
        except subprocess.TimeoutExpired:
            _kill_group(c.proc.pid, signal.SIGKILL)
            c.proc.wait()
        _kill_group(c.proc.pid, signal.SIGKILL)  # leftovers of the process group
        self.agent.procs.remove(c.proc.pid)
        c.proc = None
        c.state.running = c.state.ready = False

    def _pre_stop(self, c: ContainerRunner, budget_s: float) -> None:
        hook = ((c.spec.get("lifecycle") or {}).get("preStop")) or {}
        try:
            if "exec" in hook:
                subprocess.run(
                    [*self._exec_prefix(c), *hook["exec"]["command"]],
                    env=self.envs.build(c.spec, self.pod),
                    timeout=budget_s,
                    capture_output=True,
                )
            elif "httpGet" in hook:
                h = hook["httpGet"]
                httpx.get(f"http://{self.ip}:{h['port']}{h.get('path', '/')}", timeout=budget_s)
            elif "sleep" in hook:
                time.sleep(min(float(hook["sleep"]["seconds"]), budget_s))
        except (
            OSError,
            httpx.HTTPError,
            urllib3.exceptions.HTTPError,
            subprocess.TimeoutExpired,
            ConfigError,
            KubeError,
        ):
            pass

    # ----- the loop -----------------------------------------------------------------------------
    def _deleting(self) -> dict[str, Any] | None:
        with self._lock:
            pod = self.pod
        return pod if pod["metadata"].get("deletionTimestamp") else None

    def _prepare_volumes(self) -> bool:
        """Provide the pod's volumes before any container starts, retrying (FailedMount events) as the
        kubelet's volume manager does; False when the pod went away meanwhile."""
        if self.volumes.skipped:
            log.info(
                "%s/%s: volumes of types the node agent does not provide are not mounted: %s",
                self.ns,
                self.name,
                ", ".join(f"{n} ({k})" for n, k in self.volumes.skipped.items()),
            )
        reported: dict[str, str] = {}
        while not self._gone.is_set():
            pod = self._deleting()
            if pod is not None:
                self._terminate(pod)
                return False
            errors = self.volumes.prepare()
            if not errors:
                return True
            for name, err in errors.items():
                if reported.get(name) != err:
                    self._event("FailedMount", f'MountVolume.SetUp failed for volume "{name}" : {err}')
            reported = errors
            self._report()
            self._gone.wait(VOLUME_RETRY_S)
        return False

    def _run(self) -> None:
        try:
            if not self._prepare_volumes():
                if self._gone.is_set():
                    self._kill_all()
                return
            for c in self.all_containers:
                self._mounts(c)
            while not self._gone.is_set():
                pod = self._deleting()
                if pod is not None:
                    self._terminate(pod)
                    return
                self._tick()
                self._report()
                time.sleep(TICK_S)
            self._kill_all()
        except Exception:
            log.exception("pod runner %s/%s failed", self.ns, self.name)
            self._kill_all()
        finally:
            # The scratch mount points go first: once the volumes are gone, nothing of the pod is left.
            shutil.rmtree(self.dir / "mnt", ignore_errors=True)
            self.volumes.remove()
            self.agent.forget(self)

    def _tick(self) -> None:
        now = time.monotonic()
        if self.volumes.refreshable and now >= self._next_refresh:
            self._next_refresh = now + REFRESH_S
            self.volumes.refresh()
        if not self.initialized:
            self._tick_init(now)
            if not self.initialized:
                return
            for c in self.containers:
                c.state.waiting_reason = None
        for c in self.containers:
            if c.proc is not None:
                code = c.proc.poll()
                if code is not None:
                    self._reap(c, code)
                    continue
                self._probe(c, now)
            elif c.argv is not None and c.error is None and c.state.terminated_exit_code is None:
                if now >= c.restart_at:
                    self._start(c)
            elif not c.ever_started and c.state.waiting_reason is None:
                self._start(c)  # an unmapped image, or a refused mount: reported once

    def _tick_init(self, now: float) -> None:
        """Run the init containers one after the other, each to completion (the kubelet's order)."""
        for c in self.init_containers:
            if c.state.completed:
                continue
            if c.proc is not None:
                code = c.proc.poll()
                if code is not None:
                    self._reap(c, code)
            elif c.state.terminated_exit_code is not None:
                return  # failed and not restarted (restartPolicy Never): the pod has failed
            elif c.error is not None:
                self._start(c)  # reports the refusal
            elif now >= c.restart_at:
                self._start(c)
            if not c.state.completed:
                return
        self.initialized = True
        log.info("%s/%s initialized", self.ns, self.name)

    def _probe(self, c: ContainerRunner, now: float) -> None:
        env: dict[str, str] = {}
        prefix = self._exec_prefix(c)
        if not c.state.started and c.startup.due(now):
            ok = run_probe(c.startup.probe or {}, c.spec, self.ip, env, prefix)
            if c.startup.record(ok, now):
                c.state.started = True
            elif c.startup.failures >= int((c.startup.probe or {}).get("failureThreshold", 3)):
                log.warning("%s/%s startup probe failed; restarting", self.ns, self.name)
                self._restart(c)
                return
        if not c.state.started:
            return
        if c.liveness.due(now) and not c.liveness.record(
            run_probe(c.liveness.probe or {}, c.spec, self.ip, env, prefix), now
        ):
            log.warning("%s/%s liveness probe failed; restarting", self.ns, self.name)
            self._restart(c)
            return
        if c.readiness.due(now):
            c.readiness.record(run_probe(c.readiness.probe or {}, c.spec, self.ip, env, prefix), now)
        c.state.ready = c.readiness.result
        if c.state.ready:
            c.backoff = 1.0

    def _restart(self, c: ContainerRunner) -> None:
        grace = float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        pid = c.proc.pid if c.proc else None
        self._stop_container(c, grace)
        c.state.finished(137, self._message(c, 137), now_rfc3339())
        c.restart_at = time.monotonic()
        if pid:
            log.info("killed pid %d for restart", pid)

    def _report(self) -> None:
        with self._lock:
            pod = self.pod
        if self.agent.unreachable(pod["spec"].get("nodeName", "")):
            return  # a kubelet cut off from the apiserver: the containers run on, no status gets out
        want = desired_status(pod, self.state, now_rfc3339())
        if not status_differs(pod, want):
            return
        try:
            updated = self.agent.api.strategic_patch(self.path + "/status", {"status": want})
        except KubeError as exc:
            if exc.status == 404:
                self._gone.set()
                return
            log.warning("status update of %s/%s failed: %s", self.ns, self.name, exc)
            return
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # the apiserver is unreachable (restarted, partitioned): as a kubelet, keep the containers
            # running and report again at the next tick (this used to end the pod runner and kill them)
            log.warning("status update of %s/%s: apiserver unreachable: %s", self.ns, self.name, exc)
            return
        if updated:
            with self._lock:
                if int(updated["metadata"]["resourceVersion"]) >= int(
                    self.pod["metadata"]["resourceVersion"]
                ):
                    self.pod = updated
            self.volumes.sync(updated)

    def _terminate(self, pod: dict[str, Any]) -> None:
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))
        deadline = time.monotonic() + grace
        log.info("terminating %s/%s (grace %.0fs)", self.ns, self.name, grace)
        for c in self.containers:
            if c.proc is not None:
                self._pre_stop(c, max(deadline - time.monotonic(), 0.1))
        for c in self.all_containers:
            self._stop_container(c, deadline - time.monotonic())
        with contextlib.suppress(KubeError):
            self.agent.api.delete(
                self.path,
                {
                    "apiVersion": "v1",
                    "kind": "DeleteOptions",
                    "gracePeriodSeconds": 0,
                    "preconditions": {"uid": self.uid},
                },
            )

    def _kill_all(self) -> None:
        for c in self.all_containers:
            self._stop_container(c, 2.0)


def _read_tail(path: Path, limit: int, start: int = 0) -> bytes:
    """At most the last ``limit`` bytes of ``path`` from offset ``start`` on (empty when missing)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(start, size - limit))
            return f.read()
    except OSError:
        return b""
