"""The process node agent: a minimal kubelet for pods of this repository's images.

It watches pods bound to any node, takes those whose image maps to a local command
(:mod:`localcluster.images`), and for each one:

* gives it a pod IP of the cluster's pod network (:mod:`localcluster.podnet`: ``10.244.N.0/24``, added to
  the one network namespace all pods share) and starts every container as a local process inside that
  namespace (``ip netns exec``, own process group) with the container's command, args and env (values
  from fields, Secrets and ConfigMaps resolved; ``KUBECONFIG`` a kubeconfig with the pod's service-account
  token), told to bind to the pod IP; a container of an unmapped image (a sidecar) is reported running
  and not run;
* probes it (startup, readiness, liveness: httpGet, tcpSocket, exec) and writes pod status like a
  kubelet: phase, podIP, container states, restart counts, ``ContainersReady`` and ``Ready``, where
  ``Ready`` also requires every ``spec.readinessGates`` condition to be True;
* restarts a crashed container (per restartPolicy, with back-off) and counts the restart;
* provides ``downwardAPI`` volumes (:mod:`localcluster.volumes`): written the kubelet's atomic way under
  ``<pod dir>/volumes/<name>``, rewritten whenever the watch brings a change of the pod's labels or
  annotations, and bind-mounted at the container's ``mountPath`` in a private mount namespace of the
  container (:mod:`localcluster.podmount`); removed with the pod;
* on deletion runs the preStop hook, sends SIGTERM, waits the grace period, SIGKILLs what is left and
  removes the pod object.

Pods of other images are left to kwok's simulated stages.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import urllib3
import yaml

from . import images
from .kubeapi import KubeAPI, KubeError
from .podnet import PodNetwork
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
    keep_paths,
    wrap_command,
)

log = logging.getLogger("localcluster.agent")

TICK_S = 0.2
#: a file ``<agent state dir>/unreachable-nodes/<node>`` cuts that node's "kubelet" off from the apiserver
#: (:func:`localcluster.faults.node_unreachable`): its pods keep running, nothing is reported for them
UNREACHABLE_NODES = "unreachable-nodes"
MAX_BACKOFF_S = 10.0
VOLUME_RETRY_S = 1.0  # between attempts to provide a pod's volumes
REFRESH_S = 5.0  # between re-reads of a pod's configMap and secret volumes
DEFAULT_TERMINATION_PATH = "/dev/termination-log"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class IPPool:
    def __init__(self, addresses: list[str]) -> None:
        self._free = list(addresses)
        self._lock = threading.Lock()

    def take(self) -> str:
        with self._lock:
            if not self._free:
                raise RuntimeError("pod network exhausted")
            return self._free.pop(0)

    def give_back(self, ip: str) -> None:
        with self._lock:
            self._free.append(ip)


class ProcessRegistry:
    """Pids of live pod processes on disk, so ``localcluster down`` can stop them even if we die."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, pid: int) -> None:
        (self.dir / str(pid)).touch()

    def remove(self, pid: int) -> None:
        (self.dir / str(pid)).unlink(missing_ok=True)


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class ConfigError(RuntimeError):
    """A container's configuration cannot be made (a missing Secret or ConfigMap key): the kubelet's
    ``CreateContainerConfigError``, retried."""


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
    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        """The container's environment; :class:`ConfigError` when a referenced object or key is missing."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
        env.update({"HOSTNAME": self.name, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        entry = images.entry_for(container["image"])
        if entry and entry.host_env:
            env[entry.host_env] = self.ip
        sa_kubeconfig = self._service_account_kubeconfig()
        if sa_kubeconfig:
            env["KUBECONFIG"] = str(sa_kubeconfig)
        for src in container.get("envFrom") or []:
            env.update(self._env_from(src))
        for e in container.get("env") or []:
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "valueFrom" in e:
                value = self._value_from(e["valueFrom"])
                if value is not None:
                    env[e["name"]] = value
            else:
                env[e["name"]] = ""
        return env

    def _object(self, kind: str, name: str) -> dict[str, Any] | None:
        plural = "secrets" if kind == "Secret" else "configmaps"
        return self.agent.api.get(f"/api/v1/namespaces/{self.ns}/{plural}/{name}", ok_missing=True)

    @staticmethod
    def _data(kind: str, obj: dict[str, Any]) -> dict[str, str]:
        if kind == "Secret":
            return {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
        return {str(k): str(v) for k, v in (obj.get("data") or {}).items()}

    def _env_from(self, src: dict[str, Any]) -> dict[str, str]:
        prefix = str(src.get("prefix") or "")
        for kind, key in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
            if key in src:
                ref = src[key]
                obj = self._object(kind, ref["name"])
                if obj is None:
                    if ref.get("optional"):
                        return {}
                    raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
                return {prefix + k: v for k, v in self._data(kind, obj).items()}
        return {}

    def _value_from(self, source: dict[str, Any]) -> str | None:
        if "fieldRef" in source:
            fields = {
                "metadata.name": self.name,
                "metadata.namespace": self.ns,
                "metadata.uid": self.uid,
                "spec.nodeName": self.pod["spec"].get("nodeName", ""),
                "spec.serviceAccountName": self.pod["spec"].get("serviceAccountName", "default"),
                "status.podIP": self.ip,
                "status.hostIP": "127.0.0.1",
            }
            path = source["fieldRef"]["fieldPath"]
            if path.startswith("metadata.labels['") or path.startswith("metadata.annotations['"):
                kind, key = path.split("['", 1)
                return str((self.pod["metadata"].get(kind.split(".")[1]) or {}).get(key.rstrip("']"), ""))
            return fields.get(path)
        for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            if ref_key in source:
                ref = source[ref_key]
                obj = self._object(kind, ref["name"])
                if obj is None:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f'{kind.lower()} "{ref["name"]}" not found')
                data = self._data(kind, obj)
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise ConfigError(f"couldn't find key {ref['key']} in {kind} {self.ns}/{ref['name']}")
                return data[ref["key"]]
        return None

    def _service_account_kubeconfig(self) -> Path | None:
        """A kubeconfig with the pod's service-account token: the local stand-in for in-cluster config."""
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        path = self.dir / "serviceaccount.kubeconfig"
        if path.exists():
            return path
        sa = spec.get("serviceAccountName") or "default"
        try:
            resp = self.agent.api.create(
                f"/api/v1/namespaces/{self.ns}/serviceaccounts/{sa}/token",
                {
                    "apiVersion": "authentication.k8s.io/v1",
                    "kind": "TokenRequest",
                    "spec": {
                        "expirationSeconds": 86400,
                        "boundObjectRef": {
                            "apiVersion": "v1",
                            "kind": "Pod",
                            "name": self.name,
                            "uid": self.uid,
                        },
                    },
                },
            )
        except KubeError as exc:
            log.warning("no service-account token for %s/%s: %s", self.ns, self.name, exc)
            return None
        token = (resp or {})["status"]["token"]
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {
                        "server": self.agent.server_for_pods,
                        "certificate-authority": self.agent.ca_file,
                    },
                }
            ],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [
                {"name": "in-cluster", "context": {"cluster": "in-cluster", "user": sa, "namespace": self.ns}}
            ],
            "current-context": "in-cluster",
        }
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path

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
            env = self._env(c.spec)
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
                    env=self._env(c.spec),
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


class NodeAgent:
    def __init__(self, kubeconfig: Path, state_dir: Path, net: PodNetwork) -> None:
        self.api = KubeAPI(kubeconfig)
        self.net = net
        port = self.api.server.rsplit(":", 1)[1]
        self.server_for_pods = f"https://{net.host_ip}:{port}"
        self.ca_file = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"][
            "certificate-authority"
        ]
        self.state_dir = state_dir
        self.ips = IPPool(net.pod_ips())
        self.procs = ProcessRegistry(state_dir / "procs")
        # host paths a pod's processes need even under a volume mounted over a parent (e.g. /tmp)
        self.keep = keep_paths([state_dir.parent])
        self.runners: dict[str, PodRunner] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    def unreachable(self, node: str) -> bool:
        """Whether ``node`` is played as cut off from the apiserver (a file, so a test can flip it)."""
        return bool(node) and (self.state_dir / UNREACHABLE_NODES / node).exists()

    def forget(self, runner: PodRunner) -> None:
        with self._lock:
            if self.runners.get(runner.uid) is runner:
                del self.runners[runner.uid]
        self.net.remove_pod_ip(runner.ip)
        self.ips.give_back(runner.ip)

    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        if not pod["spec"].get("nodeName") or not images.is_agent_pod(pod):
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            runner = self.runners.get(uid)
            if event_type == "DELETED":
                if runner:
                    runner.vanish()
                return
            if runner is None:
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    return
                if pod["metadata"].get("deletionTimestamp"):
                    # Never started here (e.g. agent restart): just finish the deletion.
                    with contextlib.suppress(KubeError):
                        self.api.delete(
                            f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
                        )
                    return
                runner = PodRunner(self, pod)
                self.runners[uid] = runner
                runner.start()
            else:
                runner.update(pod)

    def run(self) -> None:
        while not self._stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods") or {}
                for pod in listing.get("items", []):
                    self.handle("ADDED", pod)
                rv = listing["metadata"]["resourceVersion"]
                while not self._stopping.is_set():
                    for ev in self.api.watch("/api/v1/pods", rv, timeout_s=300):
                        if ev["type"] == "ERROR":
                            raise KubeError(
                                ev["object"].get("code", 500), ev["object"], "WATCH", "/api/v1/pods"
                            )
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "BOOKMARK":
                            self.handle(ev["type"], ev["object"])
                        if self._stopping.is_set():
                            break
            except (KubeError, urllib3.exceptions.HTTPError, OSError) as exc:
                if self._stopping.is_set():
                    break
                log.warning("watch restarted: %s", exc)
                time.sleep(0.5)

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            runners = list(self.runners.values())
        for r in runners:
            r.vanish()
        for r in runners:
            r.join(10)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localcluster agent")
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--state-dir", type=Path, required=True)
    p.add_argument("--pod-network", type=int, required=True, help="index of the cluster's PodNetwork")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    agent = NodeAgent(args.kubeconfig, args.state_dir, PodNetwork(args.pod_network))

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping pods", signum)
        agent.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
