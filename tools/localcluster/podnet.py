"""The pod network: a network namespace of the cluster's own, so pods get real, routable pod IPs.

Kubernetes refuses loopback addresses in EndpointSlices, so pods cannot live on 127.0.0.0/8. Each
cluster instead makes one network namespace joined to the host by a veth pair:

* ``10.244.N.0/24`` — process-run pods: each pod IP is added to the namespace's end of the veth and the
  pod's processes run inside the namespace (``ip netns exec``), bound to their IP;
* ``10.(100+N).0.0/16`` — kwok's simulated pods: routed into the same namespace, where nothing
  answers, so even a stray connection never leaves this machine;
* ``10.96.N.0/24`` — the cluster's Service ClusterIPs: routed from the host into the namespace (via
  the namespace's anchor address) and, inside it, onto the veth, so that kube-proxy, which runs inside
  the namespace, translates them there (DNAT to a ready endpoint) for host and pod clients alike. Each
  cluster's rules live in its own namespace, so several clusters never share a table.

The host end (``10.244.N.1``) is how pods reach the apiserver and Prometheus; it is the only address
outside the namespace that pods can reach. ``N`` is chosen free at start.
Needs root and iproute2.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import clusterdns

_BASE_AGENT = ipaddress.ip_network("10.244.0.0/16")
_BASE_SERVICE = ipaddress.ip_network("10.96.0.0/16")
MAX_INDEX = 120


class PodNetworkError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        res = subprocess.run(["ip", *args], capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise PodNetworkError("the `ip` command (iproute2) is needed for the pod network") from exc
    if check and res.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")
    return res


@dataclass(frozen=True)
class PodNetwork:
    index: int

    @property
    def netns(self) -> str:
        return f"modeldeploy-{self.index}"

    @property
    def host_if(self) -> str:
        return f"mdh{self.index}"

    @property
    def pod_if(self) -> str:
        return f"mdp{self.index}"

    @property
    def agent_cidr(self) -> str:
        return str(list(_BASE_AGENT.subnets(new_prefix=24))[self.index])

    @property
    def kwok_cidr(self) -> str:
        """A /16 (simulated pods can be many): ``10.(100+N).0.0/16``."""
        return f"10.{100 + self.index}.0.0/16"

    @property
    def service_cidr(self) -> str:
        """The cluster's Service ClusterIP range, a /24 of its own: ``10.96.N.0/24``."""
        return str(list(_BASE_SERVICE.subnets(new_prefix=24))[self.index])

    @property
    def kubernetes_service_ip(self) -> str:
        """The first address of :attr:`service_cidr`: the apiserver gives it to ``default/kubernetes``."""
        return str(ipaddress.ip_network(self.service_cidr)[1])

    @property
    def host_ip(self) -> str:
        return str(ipaddress.ip_network(self.agent_cidr)[1])

    @property
    def anchor_ip(self) -> str:
        """A permanent address on the namespace's end: routes vanish with a device's last address."""
        return str(ipaddress.ip_network(self.agent_cidr)[254])

    def pod_ips(self) -> list[str]:
        """Addresses handed to pods, in order (the host end ``.1`` and the anchor ``.254`` excluded)."""
        return [str(h) for h in ipaddress.ip_network(self.agent_cidr).hosts()][1:-1]

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.netns]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ----- I/O ------------------------------------------------------------------------------------
    def create(self) -> None:
        _ip("netns", "add", self.netns)
        try:
            _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.pod_if)
            _ip("link", "set", self.pod_if, "netns", self.netns)
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
            _ip("route", "add", self.kwok_cidr, "dev", self.host_if)
            _ip("-n", self.netns, "link", "set", "lo", "up")
            _ip("-n", self.netns, "link", "set", self.pod_if, "up")
            _ip("-n", self.netns, "addr", "add", f"{self.anchor_ip}/32", "dev", self.pod_if)
            # Only the host end is reachable from pods: no default route, so nothing leaves the machine.
            _ip("-n", self.netns, "route", "add", f"{self.host_ip}/32", "dev", self.pod_if)
            # ClusterIPs: the host sends them to the namespace's anchor, pods onto the veth; either way
            # kube-proxy's rules in the namespace rewrite them to an endpoint before they go anywhere.
            _ip("route", "add", self.service_cidr, "via", self.anchor_ip, "dev", self.host_if)
            # The host's packets to a ClusterIP enter as forwarded traffic: forwarding on (in this
            # namespace only), so that kube-proxy's forward-hook rules refuse a Service with no endpoint
            # or an unused ClusterIP at once, like on a node, instead of the kernel dropping it silently.
            self._sysctl("net/ipv4/ip_forward", "1")
            # ... and answered at once: those refusals are ICMP errors, which the kernel rate-limits.
            self._sysctl("net/ipv4/icmp_ratelimit", "0")
            _ip(
                "-n", self.netns, "route", "add", self.service_cidr, "dev", self.pod_if, "src", self.anchor_ip
            )
            # `ip netns exec` bind-mounts this over /etc/resolv.conf: the cluster's DNS (CoreDNS on the
            # anchor address, started by localcluster.cluster), which refuses every name outside the
            # cluster, so lookups in pods never time out against a resolver out of reach.
            self.etc_dir.mkdir(parents=True, exist_ok=True)
            (self.etc_dir / "resolv.conf").write_text(clusterdns.resolv_conf(self.anchor_ip))
        except (PodNetworkError, OSError):
            self.destroy()
            raise

    def _sysctl(self, key: str, value: str) -> None:
        """Set a sysctl of the namespace (``/proc/sys/net`` is the opener's namespace's)."""
        res = subprocess.run(
            [*self.exec_prefix(), "sh", "-c", f"echo {value} > /proc/sys/{key}"],
            capture_output=True,
            text=True,
        )
        if res.returncode != 0:
            raise PodNetworkError(f"setting {key}={value} in {self.netns} failed: {res.stderr.strip()}")

    def add_pod_ip(self, ip: str) -> None:
        _ip("-n", self.netns, "addr", "add", f"{ip}/32", "dev", self.pod_if)

    def remove_pod_ip(self, ip: str) -> None:
        _ip("-n", self.netns, "addr", "del", f"{ip}/32", "dev", self.pod_if, check=False)

    def pids(self) -> list[int]:
        res = _ip("netns", "pids", self.netns, check=False)
        return [int(p) for p in res.stdout.split() if p.isdigit()]

    @property
    def etc_dir(self) -> Path:
        return Path("/etc/netns") / self.netns

    def destroy(self) -> None:
        _ip("link", "del", self.host_if, check=False)
        _ip("netns", "del", self.netns, check=False)
        shutil.rmtree(self.etc_dir, ignore_errors=True)


def used_indices() -> set[int]:
    """Indices already taken by a namespace or interface (of any cluster on this machine)."""
    used: set[int] = set()
    names = _ip("netns", "list", check=False).stdout.split()
    names += _ip("-o", "link", "show", check=False).stdout.replace(":", " ").split()
    for n in names:
        for prefix in ("modeldeploy-", "mdh", "mdp"):
            tail = n.split("@", 1)[0].removeprefix(prefix)
            if n.startswith(prefix) and tail.isdigit():
                used.add(int(tail))
    return used


def choose(used: set[int]) -> PodNetwork:
    """The first free network (pure: ``used`` comes from :func:`used_indices`)."""
    for i in range(1, MAX_INDEX + 1):
        if i not in used:
            return PodNetwork(i)
    raise PodNetworkError(
        f"no free pod network index (1..{MAX_INDEX}): stale namespaces? see `ip netns list`"
    )
