"""The real node (``up --node containerd``): containerd, the kubelet and the fake GPU device plugin, started
in the cluster's pod network namespace, and everything they left on the host undone at ``down``.

:class:`RealNode` holds ``up``'s steps (called by :mod:`localcluster.bringup` in its order); its
configuration is :mod:`localcluster.realnode_config`'s; :func:`teardown` is ``down``'s part;
:func:`stop_device_plugin` / :func:`start_device_plugin` play a node whose GPUs went away (tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from . import nodeimages
from . import realnode_config as rc
from .control_plane_config import kubeconfig
from .kubeapi import KubeAPI
from .pki import CertificateAuthority
from .podnet import PodNetwork, PodNetworkError, _ip
from .starter import ClusterError, Starter
from .state import ClusterRecord, Layout, ProcessRecord

#: host paths the kubelet or containerd create whatever their configuration says (the device-plugin
#: directory is hard-coded; shim sockets go under /run/containerd/s): removed at ``down`` when ``up``
#: found them absent, so the machine is left as it was.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/run/containerd",
    "/var/lib/cni",
    "/etc/cni",
    "/opt/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/etc/containerd",
    "/opt/containerd",
    "/var/run/nri",
    "/etc/kubernetes",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")


def containerd_root() -> Path:
    """containerd's root (content store, snapshots): ``$LOCALCLUSTER_CONTAINERD_ROOT`` or the cache."""
    if env := os.environ.get("LOCALCLUSTER_CONTAINERD_ROOT"):
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache")))
    return cache / "modeldeploy" / "containerd"


def node_paths(state_dir: Path) -> rc.NodePaths:
    return rc.NodePaths(state_dir, containerd_root())


KUBELET_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def _kubelet_listening() -> bool:
    """Whether a kubelet (another cluster's real node) serves the machine's one device-plugin socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(KUBELET_SOCKET))
        except OSError:
            return False
    return True


def _read_sysctl(key: str) -> int:
    return int(Path("/proc/sys", key).read_text().split()[0])


def _write_sysctl(key: str, value: int) -> None:
    Path("/proc/sys", key).write_text(f"{value}\n")


class RealNode:
    """``up``'s real-node steps, sharing the cluster's CA, pod network and admin client."""

    def __init__(
        self,
        starter: Starter,
        layout: Layout,
        bin_dir: Path,
        net: PodNetwork,
        ca: CertificateAuthority,
        server_in_net: str,
    ) -> None:
        self.starter, self.layout, self.bin_dir, self.net, self.ca = starter, layout, bin_dir, net, ca
        self.server_in_net = server_in_net
        self.paths = node_paths(layout.root)
        self.pod_cidr = rc.node_pod_cidr(net.index)
        self.env = rc.node_env(bin_dir)
        self.ctr = nodeimages.Ctr(bin_dir / "ctr", self.paths.containerd_socket, rc.CRI_NAMESPACE)

    def check_binaries(self) -> None:
        names = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr", "runc", "cni-bin", "pause")
        for name in (*names, "modeldeploy-device-plugin"):
            if not (self.bin_dir / name).exists():
                raise ClusterError(f"no {name} in {self.bin_dir} (tools/build-binaries.sh builds it)")

    # ----- the host ------------------------------------------------------------------------------
    def prepare_host(self) -> None:
        """Record what ``down`` must undo (the sysctls' values, which host paths exist) before changing
        anything, then set the kubelet's sysctls, route the pod range into the namespace and let bridged
        pod traffic through the namespace's netfilter (kube-proxy's rules) when br_netfilter is there."""
        p = self.paths
        if _kubelet_listening():
            raise ClusterError(
                f"a kubelet already serves {KUBELET_SOCKET}: one real node per machine (its device-plugin "
                "directory is fixed); `down` the other cluster first"
            )
        for d in (p.base, p.containerd_state, p.cni_conf_dir, p.cni_ipam_dir, p.kubelet_root, p.pod_logs):
            d.mkdir(parents=True, exist_ok=True)
        p.containerd_root.mkdir(parents=True, exist_ok=True)
        current = {k: _read_sysctl(k) for k in rc.KUBELET_SYSCTLS}
        record = {
            "sysctls": current,
            "absent_paths": [h for h in HOST_PATHS if not os.path.lexists(h)],
            "netns": self.net.netns,
        }
        p.record.write_text(json.dumps(record, indent=2))
        for key, (_, wanted) in rc.sysctl_changes(current).items():
            _write_sysctl(key, wanted)
        _ip("route", "add", self.pod_cidr, "via", self.net.anchor_ip, "dev", self.net.host_if)
        self.masquerade_all = not self._bridge_netfilter()

    def _bridge_netfilter(self) -> bool:
        """Pod -> Service -> pod on the same bridge: the reply is bridged straight back, and only with
        br_netfilter does it pass the conntrack that undoes kube-proxy's DNAT. With the module (its
        sysctls are per namespace) it is switched on in the pod network; without, kube-proxy must
        masquerade all Service traffic (``masqueradeAll``), so replies come back through the bridge's IP."""
        try:
            self.net._sysctl("net/bridge/bridge-nf-call-iptables", "1")
        except PodNetworkError:
            return False
        return True

    # ----- containerd ----------------------------------------------------------------------------
    def start_containerd(self, timeout: float) -> None:
        p = self.paths
        p.containerd_config.write_text(rc.to_toml(rc.containerd_config(p, bin_dir=self.bin_dir)))
        (p.cni_conf_dir / "10-modeldeploy.conflist").write_text(
            json.dumps(rc.cni_conflist(pod_cidr=self.pod_cidr, ipam_dir=p.cni_ipam_dir), indent=2)
        )
        argv = [*rc.netns_prefix(self.net.netns), *rc.containerd_args(self.bin_dir, p)]
        self.starter.start("containerd", argv, env=self.env)
        self.starter.wait_for("containerd", lambda: bool(self.ctr.run("version", timeout=5)), timeout)
        remove_containers(self.ctr)  # a crashed earlier cluster's, still in the shared root's metadata

    def import_images(self) -> list[str]:
        """The images of ``make images`` (and the pause image, made here when they are missing); the
        lines ``up`` prints about them."""
        archives, source = nodeimages.find_archives()
        notes = []
        if not any(a.ref == rc.PAUSE_IMAGE for a in archives):
            pause = self.paths.base / "pause.tar"
            nodeimages.write_binary_image(self.bin_dir / "pause", rc.PAUSE_IMAGE, pause)
            archives.append(nodeimages.ImageArchive(rc.PAUSE_IMAGE, pause))
            notes.append(f"no pause image from `make images` ({source}): made {rc.PAUSE_IMAGE} here")
        if not any("modelserver" in a.ref for a in archives):
            notes.append(f"no modelserver image ({source}): run `make images` for pods of our images")
        for a in archives:
            start = time.monotonic()
            done = self.ctr.import_archive(a)
            notes.append(
                f"image {a.ref}: "
                + (f"imported in {time.monotonic() - start:.1f}s" if done else "already in containerd")
            )
        images = self.ctr.image_digests()
        old = nodeimages.superseded(images, {a.ref: images[a.ref] for a in archives if a.ref in images})
        self.ctr.remove(old)
        if old:
            notes.append(f"removed {len(old)} superseded image name(s) from containerd: {', '.join(old)}")
        return notes

    # ----- the kubelet ---------------------------------------------------------------------------
    def start_kubelet(self) -> None:
        """Its client certificate (``system:node:<name>`` in ``system:nodes``, authorized by the Node
        authorizer), its serving certificate for 10250 (the anchor address, signed by the cluster CA,
        which the apiserver checks), its configuration, then the kubelet in the pod network."""
        p, net = self.paths, self.net
        user = f"system:node:{rc.NODE_NAME}"
        client = self.ca.issue("kubelet-client", user, org="system:nodes")
        kcfg = self.layout.component_kubeconfig("kubelet")
        kcfg.write_text(yaml.safe_dump(kubeconfig(self.server_in_net, self.ca.pair.cert, client, user)))
        kcfg.chmod(0o600)
        serving = self.ca.issue(
            "kubelet-serving", user, server_ips=(net.anchor_ip,), server_dns=(rc.NODE_NAME,), client=False
        )
        cfg = rc.kubelet_config(
            p,
            ca=self.ca.pair.cert,
            serving_cert=serving.cert,
            serving_key=serving.key,
            node_ip=net.anchor_ip,
            cluster_dns=net.anchor_ip,
            resolv_conf=net.etc_dir / "resolv.conf",
        )
        p.kubelet_config.write_text(yaml.safe_dump(cfg))
        args = rc.kubelet_args(
            self.bin_dir, p, kubeconfig_path=kcfg, node_ip=net.anchor_ip, labels=rc.NODE_LABELS
        )
        self.starter.start("kubelet", [*rc.netns_prefix(net.netns), *args], env=self.env)

    def wait_registered(self, api: KubeAPI, timeout: float) -> None:
        self.starter.wait_for(
            "kubelet", lambda: api.get(f"/api/v1/nodes/{rc.NODE_NAME}", ok_missing=True) is not None, timeout
        )

    def wait_ready(self, api: KubeAPI, timeout: float) -> None:
        """Ready (containerd's CNI is configured) with the device plugin's GPUs allocatable."""

        def ready() -> bool:
            node = api.get(f"/api/v1/nodes/{rc.NODE_NAME}") or {}
            status = node.get("status", {})
            conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
            gpus = status.get("allocatable", {}).get("nvidia.com/gpu", "0")
            return conds.get("Ready") == "True" and gpus == str(rc.GPU_DEVICES)

        self.starter.wait_for("kubelet", ready, timeout)

    def start_device_plugin(self) -> None:
        # after the kubelet: the plugin registers on the kubelet's socket (it retries until it is there)
        self.starter.start("device-plugin", rc.device_plugin_args(self.bin_dir))


# ----- faults: the node's GPUs go away and come back -----------------------------------------------------
def stop_device_plugin(state_dir: Path) -> None:
    """Stop the device plugin (the kubelet marks its devices unhealthy: ``nvidia.com/gpu`` allocatable
    drops to 0 at its next status update) and drop it from the record, so the cluster still counts as
    running. :func:`start_device_plugin` brings it back."""
    rec = ClusterRecord.load(state_dir)
    if rec is None:
        raise ClusterError(f"no cluster in {state_dir}")
    for p in [p for p in rec.processes if p.name == "device-plugin"]:
        _stop(p.pid, 5)
        rec.processes.remove(p)
    rec.save()


def start_device_plugin(state_dir: Path) -> None:
    rec = ClusterRecord.load(state_dir)
    if rec is None:
        raise ClusterError(f"no cluster in {state_dir}")
    if any(p.name == "device-plugin" for p in rec.processes):
        return
    bin_dir = Path(rec.bin_dir)
    layout = Layout(state_dir)
    argv = rc.device_plugin_args(bin_dir)
    with open(layout.log("device-plugin"), "ab") as logf:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
    rec.processes.append(ProcessRecord("device-plugin", proc.pid, argv, str(layout.log("device-plugin"))))
    rec.save()


# ----- down -------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _stop(pid: int, timeout: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while _alive(pid) and time.monotonic() < deadline + 5:
        time.sleep(0.05)


def remove_containers(ctr: nodeimages.Ctr) -> None:
    """Kill and delete every task and container (pod sandboxes included) in the CRI's namespace."""
    for cid in ctr.run("containers", "ls", "-q", check=False).split():
        ctr.run("tasks", "kill", "-s", "SIGKILL", cid, check=False, timeout=30)
        ctr.run("tasks", "delete", "-f", cid, check=False, timeout=30)
        ctr.run("containers", "delete", cid, check=False, timeout=30)


def _remove_pods(bin_dir: Path, paths: rc.NodePaths) -> None:
    """With the kubelet stopped: every pod sandbox stopped and removed through the CRI (containers
    killed, CNI DEL, network namespace unmounted) with crictl when it is built, then whatever is left
    through ctr."""
    crictl = bin_dir / "crictl"
    if crictl.exists():
        subprocess.run(
            [str(crictl), "--runtime-endpoint", f"unix://{paths.containerd_socket}", "rmp", "-fa"],
            capture_output=True,
            timeout=60,
        )
    remove_containers(nodeimages.Ctr(bin_dir / "ctr", paths.containerd_socket, rc.CRI_NAMESPACE))


def _shim_pids(socket: Path) -> list[int]:
    """Our containerd's shims (started with ``-address <our socket>``): they outlive containerd."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (d / "cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
                pids.append(int(d.name))
    return pids


def mounts_under(*roots: Path) -> list[str]:
    """Mount points at or below ``roots``, deepest first (so each unmounts before its parent)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(r) or point.startswith(f"{r}/") for r in roots):
            found.append(point)
    return sorted(set(found), key=lambda m: m.count("/"), reverse=True)


def _remove_cgroups() -> None:
    """The kubelet's QoS cgroups (``/kubepods`` in each v1 hierarchy), deepest first; only empty ones
    can go, which they are once every container is gone."""
    for hierarchy in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        top = hierarchy / "kubepods"
        if not top.is_dir():
            continue
        dirs = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()


def teardown(state_dir: Path, rec: ClusterRecord) -> None:
    """``down``'s real-node part, before the control plane stops: device plugin and kubelet stopped, the
    pods' containers and sandboxes removed, containerd and its shims stopped, every mount under the
    node's directories undone, the QoS cgroups removed, the sysctls restored and the host paths ``up``
    found absent removed again."""
    by_name = {p.name: p for p in rec.processes}
    for name in ("device-plugin", "kubelet"):
        if name in by_name:
            _stop(by_name[name].pid, 20)
    paths = node_paths(state_dir)
    if "containerd" in by_name and _alive(by_name["containerd"].pid) and rec.bin_dir:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            _remove_pods(Path(rec.bin_dir), paths)
    if "containerd" in by_name:
        _stop(by_name["containerd"].pid, 10)
    for pid in _shim_pids(paths.containerd_socket):
        _stop(pid, 5)
    record = _load_record(paths)
    if not record:
        # up stopped before it changed the host (e.g. another cluster's real node runs): the cgroups,
        # sockets and containerd root are not ours to touch
        for point in mounts_under(paths.base):
            subprocess.run(["umount", "-l", point], capture_output=True)
        return
    for point in mounts_under(paths.base, paths.containerd_root):
        subprocess.run(["umount", "-l", point], capture_output=True)
    _remove_cgroups()
    for key, value in record.get("sysctls", {}).items():
        with contextlib.suppress(OSError):
            _write_sysctl(key, int(value))
    for path in record.get("absent_paths", []):
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)
    # the device plugin's and the kubelet's sockets, where /var/lib/kubelet was there before us
    dp_dir = KUBELET_SOCKET.parent
    for name in ("kubelet.sock", "modeldeploy-gpu.sock", "kubelet_internal_checkpoint"):
        with contextlib.suppress(OSError):
            (dp_dir / name).unlink()


def _load_record(paths: rc.NodePaths) -> dict[str, Any]:
    try:
        return dict(json.loads(paths.record.read_text()))
    except (OSError, ValueError):
        return {}
