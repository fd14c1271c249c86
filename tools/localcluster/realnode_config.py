"""The real node's configuration (``up --node containerd``): pure builders of containerd's config.toml, the
CNI network list, the KubeletConfiguration and the command lines of containerd, the kubelet and the fake
GPU device plugin, plus the host sysctls the kubelet insists on. Nothing here starts a process.

Where things run and why (docs/local-cluster.md, "The real node"):

* containerd and the kubelet run in the cluster's pod network namespace (``modeldeploy-N``), entered with
  ``nsenter --net`` only: ``ip netns exec`` would also give them a private mount namespace, and the
  kubelet's volume mounts must be seen by containerd and runc, which set up the containers' mounts;
* pods get IPs from a bridge ``cni0`` in that namespace on ``10.245.N.0/24`` (the bridge is the gateway,
  ``10.245.N.1``), a range of their own next to the process agent's ``10.244.N.0/24``: the host routes it
  to the namespace's anchor, so the host (Prometheus, the tests) reaches pod IPs, and pods reach the host
  end ``10.244.N.1`` (apiserver, Prometheus) and the ClusterIPs through the namespace's routes;
* the kubelet's node IP is the namespace's anchor ``10.244.N.254``: the apiserver on the host reaches the
  kubelet's port 10250 there (logs, exec), as it reaches Traefik and KEDA.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .clusterdns import CLUSTER_DOMAIN

NODE_NAME = "real-node-0"
#: what ``up --node`` accepts: the process agent (the default) or the real node
NODE_MODES = ("process", "containerd")
CONTAINERD_VERSION = "2.4.2"  # tools/containerd/go.mod; the node reports containerd://<this>
GPU_DEVICES = 2  # fake nvidia.com/gpu devices the device plugin advertises
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
#: the containerd namespace the CRI plugin keeps Kubernetes' images and containers in
CRI_NAMESPACE = "k8s.io"
PAUSE_IMAGE = "docker.io/modeldeploy/pause:3.10"  # tools/build-images.sh's ref (PAUSE_VERSION there)
#: labels the process agent's GPU node carries that workloads select on (e2e tests: nodeSelector)
NODE_LABELS = {"nvidia.com/gpu.present": "true", "type": "real"}
#: kwok's fake nodes in a cluster with the real node: only pods that tolerate it land there
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
_BASE_NODE_PODS = ipaddress.ip_network("10.245.0.0/16")

#: The host sysctls the kubelet v1.37 wants (pkg/kubelet/cm/container_manager_linux.go,
#: setupKernelTunables). With ``protectKernelDefaults: false`` it rewrites them silently; we run it with
#: ``true`` (it refuses to start if one differs), set them ourselves at ``up`` and restore the previous
#: values at ``down``, so the host is changed only while the node runs and every change is recorded.
KUBELET_SYSCTLS: dict[str, int] = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}


def sysctl_changes(current: dict[str, int]) -> dict[str, tuple[int, int]]:
    """``{key: (current, wanted)}`` for each of :data:`KUBELET_SYSCTLS` that differs from ``current``."""
    return {k: (current[k], v) for k, v in KUBELET_SYSCTLS.items() if current[k] != v}


def node_pod_cidr(index: int) -> str:
    """The real node's pod range for pod network ``index``: ``10.245.N.0/24`` (disjoint from the agent's
    ``10.244.N.0/24``, the ClusterIPs' ``10.96.N.0/24`` and kwok's ``10.(100+N).0.0/16``, N <= 120)."""
    return str(list(_BASE_NODE_PODS.subnets(new_prefix=24))[index])


def bridge_ip(pod_cidr: str) -> str:
    """The bridge's own address, the pods' gateway: the range's first address."""
    return str(ipaddress.ip_network(pod_cidr)[1])


@dataclass(frozen=True)
class NodePaths:
    """Where the node's files live. Everything but containerd's root is under the cluster's state
    directory and goes with ``down``; the root (content store and unpacked snapshots) is a cache shared by
    the clusters of this machine, one at a time, so a 6 GB image is imported once, not at every ``up``."""

    state_dir: Path
    containerd_root: Path

    @property
    def base(self) -> Path:
        return self.state_dir / "node"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd-state"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd.toml"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet.yaml"

    @property
    def pod_logs(self) -> Path:
        return self.base / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.base / "volume-plugins"

    @property
    def record(self) -> Path:
        """What ``up`` changed on the host (sysctls, paths it created): read by ``down`` to undo it."""
        return self.base / "host-changes.json"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def to_toml(doc: dict[str, Any], prefix: str = "") -> str:
    """A minimal TOML writer for nested tables of strings, ints, bools and lists (what containerd's
    config needs; the standard library reads TOML but does not write it). Keys with dots are quoted."""
    scalars = {k: v for k, v in doc.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    out = [f"{k} = {_toml_value(v)}" for k, v in scalars.items()]
    for k, v in tables.items():
        key = json.dumps(k) if "." in k else k
        name = f"{prefix}.{key}" if prefix else key
        body = to_toml(v, name)
        has_scalars = any(not isinstance(x, dict) for x in v.values())
        out.append((f"\n[{name}]\n" if has_scalars or not v else "\n") + body)
    return "\n".join(out).strip("\n") + "\n"


def containerd_config(
    paths: NodePaths, *, bin_dir: Path, sandbox_image: str = PAUSE_IMAGE, log_level: str = "info"
) -> dict[str, Any]:
    """containerd 2.x's config (version 3). Non-defaults, each for a reason:

    * its socket, root, state and CNI directories are the cluster's, not /run/containerd and /etc/cni;
    * ``restrict_oom_score_adj``: root here lacks CAP_SYS_RESOURCE, so runc cannot lower a container's
      oom_score_adj below containerd's own (the first sandbox failed so); containerd clamps it instead;
    * runc's cgroups through cgroupfs (``SystemdCgroup = false``): no systemd here, like the kubelet's
      ``cgroupDriver``; runc's path explicit (the shim would search PATH);
    * ``netns_mounts_under_state_dir``: the pods' network namespaces are mounted under the state
      directory, not /run/netns, so ``down`` finds every one of them there;
    * the sandbox (pause) image pinned to the one ``up`` imports: nothing is pulled (no registry);
    * NRI, tracing and the snapshotters that are not built or not used are off, so nothing else is
      created on the host.
    """
    runtime = "io.containerd.cri.v1.runtime"
    return {
        "version": 3,
        "root": str(paths.containerd_root),
        "state": str(paths.containerd_state),
        "disabled_plugins": [
            "io.containerd.nri.v1.nri",
            "io.containerd.internal.v1.opt",
            "io.containerd.tracing.processor.v1.otlp",
            "io.containerd.internal.v1.tracing",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.blockfile",
            "io.containerd.snapshotter.v1.erofs",
        ],
        "grpc": {"address": str(paths.containerd_socket)},
        "ttrpc": {"address": f"{paths.containerd_socket}.ttrpc"},
        "debug": {"level": log_level},
        "plugins": {
            "io.containerd.cri.v1.images": {
                "snapshotter": "overlayfs",
                "pinned_images": {"sandbox": sandbox_image},
            },
            runtime: {
                "restrict_oom_score_adj": True,
                "netns_mounts_under_state_dir": True,
                "enable_selinux": False,
                "disable_apparmor": True,
                "cdi_spec_dirs": [],
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"BinaryName": str(bin_dir / "runc"), "SystemdCgroup": False},
                        }
                    },
                },
                "cni": {
                    "bin_dirs": [str(bin_dir / "cni-bin")],
                    "conf_dir": str(paths.cni_conf_dir),
                    "max_conf_num": 1,
                },
            },
            # exec, attach and port-forward streams: on the namespace's loopback, where the kubelet
            # (same namespace) proxies them from the apiserver
            "io.containerd.grpc.v1.cri": {"stream_server_address": "127.0.0.1", "stream_server_port": "0"},
        },
    }


def cni_conflist(*, pod_cidr: str, ipam_dir: Path) -> dict[str, Any]:
    """The pod network: a bridge in the cluster's namespace (its gateway), host-local addresses (state in
    the cluster's directory, not /var/lib/cni), hairpin mode so a pod reaches itself through its own
    Service, and portmap for hostPorts (nftables, like kube-proxy: no iptables needed). No ``ipMasq``:
    nothing leaves the machine, and the host routes the pod range back to the namespace."""
    return {
        "cniVersion": "1.0.0",
        "name": "modeldeploy",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr, "gateway": bridge_ip(pod_cidr)}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "backend": "nftables"},
        ],
    }


def kubelet_config(
    paths: NodePaths,
    *,
    ca: Path,
    serving_cert: Path,
    serving_key: Path,
    node_ip: str,
    cluster_dns: str,
    resolv_conf: Path,
) -> dict[str, Any]:
    """The KubeletConfiguration. Non-defaults, each for a reason (docs/local-cluster.md):

    * ``failCgroupV1: false``: this machine is cgroup v1 (hybrid); v1.37 refuses v1 otherwise;
    * ``cgroupDriver: cgroupfs``: no systemd; runc's cgroups the same way (containerd's config);
    * ``protectKernelDefaults: true``: the kubelet checks the host sysctls instead of rewriting them;
      ``up`` sets them and ``down`` restores them (:data:`KUBELET_SYSCTLS`);
    * ``oomScoreAdj: 0``: lowering its own score (default -999) needs CAP_SYS_RESOURCE, which root lacks;
    * image GC at 100 % and disk eviction thresholds at an absolute 500 MiB: the disk here is half full
      of other things, and the serving image (6 GB) has nowhere to be pulled from again once collected;
      a test machine's disk use must not taint the node with DiskPressure (1 % of this 252 GB disk is
      2.5 GB, which a parallel image build once went under: the kubelet evicted the test's pods);
    * ``failSwapOn: false``: a machine with swap still runs the node (pods get no swap: NoSwap);
    * authentication by client certificate (the cluster CA) or token (webhook), no anonymous access;
      authorization by webhook (SubjectAccessReview), as kubeadm sets it: the apiserver's own client
      certificate is in ``system:masters``, any other caller needs RBAC on ``nodes/proxy``;
    * cluster DNS: CoreDNS on the namespace's anchor address (no kube-dns Service here); pods with
      ``dnsPolicy: Default`` get the namespace's resolv.conf (which also names it);
    * address and port 10250 on the anchor only; healthz on the namespace's loopback; no read-only port.
    """
    floor = "500Mi"
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "tlsCertFile": str(serving_cert),
        "tlsPrivateKeyFile": str(serving_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [cluster_dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "serializeImagePulls": True,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": floor,
            "nodefs.inodesFree": "1%",
            "imagefs.available": floor,
            "imagefs.inodesFree": "1%",
        },
        "failSwapOn": False,
        "memorySwap": {"swapBehavior": "NoSwap"},
        "protectKernelDefaults": True,
        "oomScoreAdj": 0,
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.volume_plugins),
        "registerNode": True,
        "logging": {"verbosity": 1},
    }


def kubelet_args(
    bin_dir: Path, paths: NodePaths, *, kubeconfig_path: Path, node_ip: str, labels: dict[str, str]
) -> list[str]:
    """The kubelet's command line: what has no KubeletConfiguration field (root dir, name, IP, labels)."""
    return [
        str(bin_dir / "kubelet"),
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={kubeconfig_path}",
        f"--root-dir={paths.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={node_ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
    ]


def containerd_args(bin_dir: Path, paths: NodePaths) -> list[str]:
    return [str(bin_dir / "containerd"), f"--config={paths.containerd_config}"]


def device_plugin_args(bin_dir: Path, *, devices: int = GPU_DEVICES) -> list[str]:
    """The fake GPU device plugin: its socket goes into the kubelet's fixed device-plugin directory
    (``/var/lib/kubelet/device-plugins``, hard-coded in the kubelet: one real node per machine)."""
    return [str(bin_dir / "modeldeploy-device-plugin"), f"--devices={devices}"]


def netns_prefix(netns: str) -> list[str]:
    """Enter only the network namespace: the mount namespace stays the host's (see the module doc)."""
    return ["nsenter", f"--net=/run/netns/{netns}", "--"]


def node_env(bin_dir: Path) -> dict[str, str]:
    """containerd's shim finds ``containerd-shim-runc-v2`` on PATH: the binaries directory goes first."""
    return {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"}
