"""Bring the local cluster up and down.

``up`` starts etcd, kube-apiserver (RBAC, its own CA, service-account keys), kube-controller-manager,
kube-scheduler, kwok (fake GPU and CPU nodes), the process node agent and Prometheus, all on
127.0.0.1 with free ports, and, inside the cluster's pod network namespace, kube-proxy (Service
ClusterIPs, ``10.96.N.0/24``, answer from the host and from pods), Traefik (the Gateway API data
plane: the shared Gateway ``gateway-system/public-gateway`` answers at ``http://10.244.N.254:80``) and
versitygw (an S3 object store at ``http://10.244.N.254:9000``, credentials in ``s3-credentials.json``)
and CoreDNS (the cluster DNS at ``10.244.N.254:53``: ``<service>.<namespace>.svc.cluster.local``),
waits until the cluster is Ready,
records everything it started in ``cluster.json`` and returns, leaving the processes running. ``down``
stops exactly those processes (and any pod process the agent left) and removes the state directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from . import clusterdns, config, podnet
from .kubeapi import KubeAPI
from .pki import CertificateAuthority, KeyPair, service_account_keys
from .state import REPO_ROOT, ClusterRecord, Layout, ProcessRecord


class ClusterError(RuntimeError):
    """A component failed to start or the cluster did not become Ready; the message holds its log tail."""


@dataclass(frozen=True)
class Cluster:
    """A running local cluster, as seen by its users."""

    state_dir: Path
    kubeconfig: Path
    prometheus_url: str
    apiserver_url: str
    service_cidr: str = ""  # the Service ClusterIP range (empty for a cluster not started here)
    gateway_url: str = ""  # the shared Gateway (Traefik), reachable from the host and from pods
    s3_url: str = ""  # the object store (versitygw), reachable from the host and from pods
    prometheus_url_pods: str = ""  # Prometheus as pods (and KEDA) reach it; "" where unknown


def binaries_dir() -> Path:
    """Where the pinned binaries are (built on first use): ``$LOCALCLUSTER_BIN_DIR`` or the build cache."""
    if env := os.environ.get("LOCALCLUSTER_BIN_DIR"):
        return Path(env)
    out = subprocess.run(
        [str(REPO_ROOT / "tools" / "build-binaries.sh")], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _Starter:
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


def crds_established(api: KubeAPI, crd_path: str, names: Iterable[str]) -> bool:
    """Whether every CustomResourceDefinition in ``names`` has condition Established=True."""
    for name in names:
        crd = api.get(f"{crd_path}/{name}") or {}
        if not any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        ):
            return False
    return True


def running_cluster(state_dir: Path) -> Cluster | None:
    """The cluster recorded in ``state_dir`` if all its processes are alive."""
    rec = ClusterRecord.load(state_dir)
    if rec is None or not rec.processes or not all(_alive(p.pid) for p in rec.processes):
        return None
    layout = Layout(state_dir)
    return Cluster(
        state_dir,
        layout.kubeconfig,
        rec.prometheus_url,
        rec.apiserver_url,
        rec.service_cidr,
        rec.gateway_url,
        rec.s3_url,
        rec.prometheus_url_pods,
    )


def s3_credentials() -> dict[str, str]:
    """A fresh root user for the object store: an AWS-shaped access key id and secret."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
    access = "LOCAL" + "".join(secrets.choice(alphabet) for _ in range(15))
    return {"accessKey": access, "secretKey": secrets.token_urlsafe(30)[:40]}


def keda_enabled() -> bool:
    """Whether ``up`` starts KEDA (and its metrics server behind the aggregation layer): unless
    ``$LOCALCLUSTER_KEDA`` is ``0``."""
    return os.environ.get("LOCALCLUSTER_KEDA", "1") != "0"


def up(state_dir: Path, *, timeout: float = 120.0, audit: bool = True, keda: bool | None = None) -> Cluster:
    existing = running_cluster(state_dir)
    if existing is not None:
        return existing
    down(state_dir)  # clear a half-dead previous cluster
    bin_dir = binaries_dir()
    layout = Layout(state_dir)
    for d in (layout.root, layout.pki, layout.logs, layout.kwok_dir, layout.prometheus_dir, layout.agent_dir):
        d.mkdir(parents=True, exist_ok=True)
    rec = ClusterRecord(state_dir=str(state_dir))
    names = ("etcd", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok", "prometheus")
    rec.ports = {n: free_port() for n in names}
    rec.save()
    net = podnet.choose(podnet.used_indices())
    net.create()
    rec.pod_network_index = net.index
    rec.service_cidr = net.service_cidr
    rec.save()
    starter = _Starter(layout, rec)
    try:
        _bring_up(
            starter, layout, rec, bin_dir, net, timeout, audit, keda_enabled() if keda is None else keda
        )
    except BaseException:
        down(state_dir, keep_logs_on_error=True)
        raise
    return Cluster(
        state_dir,
        layout.kubeconfig,
        rec.prometheus_url,
        rec.apiserver_url,
        rec.service_cidr,
        rec.gateway_url,
        rec.s3_url,
        rec.prometheus_url_pods,
    )


def _bring_up(
    starter: _Starter,
    layout: Layout,
    rec: ClusterRecord,
    bin_dir: Path,
    net: podnet.PodNetwork,
    timeout: float,
    audit: bool,
    keda: bool = True,
) -> None:
    ports = rec.ports
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(deadline - time.monotonic(), 1.0)

    ca = CertificateAuthority(layout.pki)
    serving = ca.issue(
        "apiserver",
        "kube-apiserver",
        server_ips=("127.0.0.1", net.kubernetes_service_ip, net.host_ip),
        server_dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        client=False,
    )
    sa = service_account_keys(layout.pki)
    server = f"https://127.0.0.1:{ports['apiserver']}"
    rec.apiserver_url = server

    def client_kubeconfig(name: str, cn: str, org: str | None, at: str = server) -> Path:
        pair = ca.issue(name, cn, org=org)
        path = layout.kubeconfig if name == "admin" else layout.component_kubeconfig(name)
        path.write_text(yaml.safe_dump(config.kubeconfig(at, ca.pair.cert, pair, cn)))
        path.chmod(0o600)
        return path

    admin = client_kubeconfig("admin", "localcluster-admin", "system:masters")
    kcm = client_kubeconfig("controller-manager", "system:kube-controller-manager", None)
    sched = client_kubeconfig("scheduler", "system:kube-scheduler", None)
    # kube-proxy runs inside the pod network, so it reaches the apiserver at the host end; the user
    # system:kube-proxy is bound to the built-in ClusterRole system:node-proxier.
    proxy_kcfg = client_kubeconfig(
        "kube-proxy", "system:kube-proxy", None, at=f"https://{net.host_ip}:{ports['apiserver']}"
    )
    # Traefik runs inside the pod network too (it must reach pod IPs, and pods must reach it): the user
    # localcluster-traefik, bound below to the rights its Gateway provider needs.
    traefik_kcfg = client_kubeconfig(
        "traefik", "localcluster-traefik", None, at=f"https://{net.host_ip}:{ports['apiserver']}"
    )
    dns_kcfg = client_kubeconfig(
        "coredns", clusterdns.USER, None, at=f"https://{net.host_ip}:{ports['apiserver']}"
    )
    for name in ("traefik", "versitygw", "coredns"):
        if not (bin_dir / name).exists():
            raise ClusterError(f"no {name} in {bin_dir} (tools/build-binaries.sh builds it)")
    front_proxy_ca, proxy_client = _front_proxy(layout)
    if keda:
        for b in ("keda-operator", "keda-adapter", "keda-config"):
            if not (bin_dir / b).exists():
                raise ClusterError(f"no {b} in {bin_dir} (tools/build-binaries.sh builds it)")
    # KEDA runs in the pod network too and authenticates as its ServiceAccount's user (a client
    # certificate for system:serviceaccount:keda:keda-operator), the subject of its own RBAC.
    keda_kcfg = client_kubeconfig(
        "keda", config.KEDA_USER, "system:serviceaccounts", at=f"https://{net.host_ip}:{ports['apiserver']}"
    )
    try:
        proxy_mode = config.proxy_mode(
            have_nft=shutil.which("nft") is not None, have_iptables=shutil.which("iptables") is not None
        )
    except ValueError as exc:
        raise ClusterError(str(exc)) from None
    prom_pair = ca.issue("prometheus", "localcluster-prometheus")

    starter.start("etcd", config.etcd_args(bin_dir, layout.etcd_data, ports["etcd"], ports["etcd_peer"]))
    starter.wait_for(
        "etcd",
        lambda: httpx.get(f"http://127.0.0.1:{ports['etcd']}/health", timeout=1).status_code == 200,
        left(),
    )

    audit_log = audit_policy = None
    if audit:
        audit_policy = layout.root / "audit-policy.yaml"
        audit_policy.write_text(yaml.safe_dump(config.AUDIT_POLICY))
        audit_log = layout.logs / "audit.log"
    starter.start(
        "kube-apiserver",
        config.apiserver_args(
            bin_dir,
            etcd_port=ports["etcd"],
            secure_port=ports["apiserver"],
            ca=ca.pair,
            serving=serving,
            sa=sa,
            service_cidr=net.service_cidr,
            audit_log=audit_log,
            audit_policy=audit_policy,
        )
        + config.aggregation_layer_args(front_proxy_ca=front_proxy_ca, proxy_client=proxy_client),
    )
    admin_pair = KeyPair(layout.pki / "admin.crt", layout.pki / "admin.key")
    ctx = ssl.create_default_context(cafile=str(ca.pair.cert))
    ctx.load_cert_chain(str(admin_pair.cert), str(admin_pair.key))
    with httpx.Client(verify=ctx) as c:
        starter.wait_for(
            "kube-apiserver", lambda: c.get(f"{server}/readyz", timeout=2).status_code == 200, left()
        )
    api = KubeAPI(admin)

    # Prometheus reads pods through RBAC like any other client.
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {
            "metadata": {"name": "localcluster:prometheus"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes", "services", "endpoints"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
        },
    )
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": "localcluster:prometheus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "localcluster:prometheus",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "localcluster-prometheus"}
            ],
        },
    )

    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        {"metadata": {"name": "localcluster:traefik"}, "rules": config.TRAEFIK_RULES},
    )
    api.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        {
            "metadata": {"name": "localcluster:traefik"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "localcluster:traefik",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "localcluster-traefik"}
            ],
        },
    )

    for path, obj in clusterdns.rbac_objects():
        api.create(path, obj)
    corefile = layout.root / "Corefile"
    corefile.write_text(clusterdns.corefile(listen_ip=net.anchor_ip, kubeconfig=dns_kcfg))
    starter.start("coredns", [*net.exec_prefix(), *clusterdns.args(bin_dir, corefile_path=corefile)])

    starter.start(
        "kube-controller-manager",
        config.controller_manager_args(
            bin_dir, kubeconfig_path=kcm, port=ports["controller_manager"], ca=ca.pair, sa=sa
        ),
    )
    starter.start(
        "kube-scheduler", config.scheduler_args(bin_dir, kubeconfig_path=sched, port=ports["scheduler"])
    )

    stage_file = layout.kwok_dir / "stages.yaml"
    stage_file.write_text(yaml.safe_dump_all(config.kwok_stages(bin_dir / "kwok-stages")))
    starter.start(
        "kwok",
        config.kwok_args(
            bin_dir,
            kubeconfig_path=admin,
            config_files=[stage_file],
            server_port=ports["kwok"],
            pod_cidr=net.kwok_cidr,
        ),
    )
    starter.start(
        "node-agent",
        [
            sys.executable,
            "-m",
            "localcluster",
            "agent",
            "--kubeconfig",
            str(admin),
            "--state-dir",
            str(layout.agent_dir),
            "--pod-network",
            str(net.index),
        ],
    )

    prom_cfg = layout.prometheus_dir / "prometheus.yml"
    prom_cfg.write_text(
        yaml.safe_dump(
            config.prometheus_config(
                apiserver=server, ca=ca.pair.cert, client=prom_pair, pod_cidr=net.agent_cidr
            )
        )
    )
    starter.start(
        "prometheus",
        config.prometheus_args(
            bin_dir, config=prom_cfg, data_dir=layout.prometheus_dir / "data", port=ports["prometheus"]
        ),
    )
    rec.prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"
    rec.prometheus_url_pods = f"http://{net.host_ip}:{ports['prometheus']}"
    rec.apiserver_url_pods = f"https://{net.host_ip}:{ports['apiserver']}"
    rec.save()

    for node in config.default_nodes():
        api.create("/api/v1/nodes", node)
    api.create(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        config.kubernetes_endpointslice(host_ip=net.host_ip, port=ports["apiserver"]),
    )
    # After the nodes exist: kube-proxy waits for its Node object (up to 30 s) before it starts. One
    # kube-proxy serves both fake nodes (they are the same machine); it takes the GPU node's name.
    proxy_cfg = layout.root / "kube-proxy.yaml"
    proxy_cfg.write_text(
        yaml.safe_dump(
            config.kube_proxy_config(
                kubeconfig_path=proxy_kcfg,
                node_name=config.GPU_NODE,
                bind_ip=net.anchor_ip,
                cluster_cidr=net.agent_cidr,
                mode=proxy_mode,
            )
        )
    )
    starter.start("kube-proxy", [*net.exec_prefix(), *config.kube_proxy_args(bin_dir, config_path=proxy_cfg)])
    # The object store, in the pod network like Traefik: one URL for the host and for pods.
    creds = s3_credentials()
    layout.s3_credentials_file.touch(mode=0o600)
    layout.s3_credentials_file.write_text(json.dumps(creds) + "\n")
    layout.s3_data.mkdir(parents=True, exist_ok=True)
    starter.start(
        "versitygw",
        [
            *net.exec_prefix(),
            *config.versitygw_args(
                bin_dir, listen_ip=net.anchor_ip, data_dir=layout.s3_data, access_log=layout.s3_access_log
            ),
        ],
        env={"ROOT_ACCESS_KEY_ID": creds["accessKey"], "ROOT_SECRET_ACCESS_KEY": creds["secretKey"]},
    )
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    gateway_crds: list[str] = []
    for f in sorted((bin_dir / "gateway-api-crds").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                api.create(crd_path, doc)
                gateway_crds.append(doc["metadata"]["name"])

    def gateway_api_established() -> bool:
        return crds_established(api, crd_path, gateway_crds)

    def nodes_ready() -> bool:
        items = (api.get("/api/v1/nodes") or {}).get("items", [])
        ready = [
            n
            for n in items
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) == len(config.default_nodes())

    starter.wait_for("kwok", nodes_ready, left())
    starter.wait_for(
        "kube-controller-manager",
        lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default", ok_missing=True) is not None,
        left(),
    )
    starter.wait_for(
        "kube-scheduler",
        lambda: (
            httpx.get(f"https://127.0.0.1:{ports['scheduler']}/healthz", verify=False, timeout=1).status_code
            == 200
        ),
        left(),
    )
    starter.wait_for("kube-apiserver", gateway_api_established, left())
    # The Gateway API data plane: after the CRDs (its informers need them), in the pod network.
    for path, obj in config.gateway_objects():
        api.create(path, obj)
    starter.start(
        "traefik",
        [*net.exec_prefix(), *config.traefik_args(bin_dir, listen_ip=net.anchor_ip)],
        env={"KUBECONFIG": str(traefik_kcfg)},
    )
    keda_api_service = _start_keda(starter, api, layout, bin_dir, net, ca, keda_kcfg, left) if keda else None
    proxy_healthz = f"http://{net.anchor_ip}:{config.KUBE_PROXY_HEALTHZ_PORT}/healthz"
    starter.wait_for("kube-proxy", lambda: httpx.get(proxy_healthz, timeout=1).status_code == 200, left())
    dns_ready = clusterdns.ready_url(net.anchor_ip)
    starter.wait_for("coredns", lambda: httpx.get(dns_ready, timeout=1).status_code == 200, left())
    starter.wait_for(
        "prometheus", lambda: httpx.get(f"{rec.prometheus_url}/-/ready", timeout=1).status_code == 200, left()
    )
    s3_url = f"http://{net.anchor_ip}:{config.S3_PORT}"
    starter.wait_for(
        "versitygw",
        lambda: httpx.get(f"{s3_url}{config.S3_HEALTH_PATH}", timeout=1).status_code == 200,
        left(),
    )
    rec.s3_url = s3_url
    rec.save()
    ping = f"http://{net.anchor_ip}:{config.TRAEFIK_PING_PORT}/ping"
    starter.wait_for("traefik", lambda: httpx.get(ping, timeout=1).status_code == 200, left())
    gw_ns, gw_name = config.GATEWAY_NAMESPACE, config.GATEWAY_NAME
    gateway = f"/apis/gateway.networking.k8s.io/v1/namespaces/{gw_ns}/gateways/{gw_name}"
    starter.wait_for("traefik", lambda: config.gateway_programmed(api.get(gateway)), left())
    if keda_api_service:
        # Available: the apiserver reached the adapter through the aggregation layer.
        starter.wait_for(
            "keda-adapter", lambda: config.api_service_available(api.get(keda_api_service)), left()
        )
    rec.gateway_url = f"http://{net.anchor_ip}:{config.GATEWAY_PORT}"
    rec.save()
    layout.prometheus_url_file.write_text(rec.prometheus_url + "\n")
    layout.gateway_url_file.write_text(rec.gateway_url + "\n")
    layout.s3_url_file.write_text(rec.s3_url + "\n")
    api.close()


def _front_proxy(layout: Layout) -> tuple[Path, KeyPair]:
    """The aggregation layer's front-proxy CA (a CA of its own: every certificate it signs may assert
    any user to an extension server) and the client certificate the apiserver proxies with."""
    front = CertificateAuthority(layout.pki / "front-proxy", common_name="modeldeploy-front-proxy-ca")
    return front.pair.cert, front.issue("front-proxy-client", config.FRONT_PROXY_CLIENT)


def _start_keda(
    starter: _Starter,
    api: KubeAPI,
    layout: Layout,
    bin_dir: Path,
    net: podnet.PodNetwork,
    ca: CertificateAuthority,
    kubeconfig_path: Path,
    left: Callable[[], float],
) -> str:
    """KEDA's CRDs, RBAC, Service, EndpointSlice and APIService (all from its module's ``config/``), then
    keda-operator and keda-adapter inside the pod network. Returns the APIService's path (to wait on)."""
    kcfg = bin_dir / "keda-config"
    crd_path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    crds: list[str] = []
    for doc in config.keda_crds(kcfg / "crd"):
        api.create(crd_path, doc)
        crds.append(doc["metadata"]["name"])
    for path, obj in config.keda_metrics_objects(
        kcfg, ca_bundle=ca.pair.cert.read_bytes(), endpoint_ip=net.anchor_ip
    ):
        api.create(path, obj)
    for path, obj in config.keda_rbac(kcfg):  # after its namespace
        api.create(path, obj)
    # One certificate for both: the operator's gRPC server and the adapter's client (mutual TLS, each
    # checks the other against ca.crt), and the adapter's HTTPS (the apiserver checks it against the
    # APIService's caBundle, by the Service's DNS name).
    svc_dns = tuple(
        f"{name}.{config.KEDA_NAMESPACE}.svc{suffix}"
        for name in ("keda-operator", config.KEDA_METRICS_SERVICE)
        for suffix in ("", ".cluster.local")
    )
    pair = ca.issue("keda-serving", "keda", server_ips=(net.anchor_ip,), server_dns=svc_dns)
    cert_dir = layout.pki / "keda-certs"
    cert_dir.mkdir(exist_ok=True)
    for src, name in ((ca.pair.cert, "ca.crt"), (pair.cert, "tls.crt"), (pair.key, "tls.key")):
        shutil.copyfile(src, cert_dir / name)
    (cert_dir / "tls.key").chmod(0o600)

    def established() -> bool:
        return crds_established(api, crd_path, crds)

    starter.wait_for("kube-apiserver", established, left())  # the operator's informers need them
    env = config.keda_env(kubeconfig_path)
    starter.start(
        "keda-operator",
        [*net.exec_prefix(), *config.keda_operator_args(bin_dir, listen_ip=net.anchor_ip, cert_dir=cert_dir)],
        env=env,
    )
    starter.start(
        "keda-adapter",
        [
            *net.exec_prefix(),
            *config.keda_adapter_args(
                bin_dir, listen_ip=net.anchor_ip, cert_dir=cert_dir, kubeconfig_path=kubeconfig_path
            ),
        ],
        env=env,
    )
    return f"/apis/apiregistration.k8s.io/v1/apiservices/{config.KEDA_APISERVICE}"


def _signal(pid: int, sig: int) -> None:
    """Signal the process group led by ``pid`` (all we start lead one), and ``pid`` itself."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _stop_pid(pid: int, timeout: float) -> None:
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)


def down(state_dir: Path, *, keep_logs_on_error: bool = False) -> None:
    """Stop everything ``up`` started (agent first, so it stops its pods), then remove the state."""
    rec = ClusterRecord.load(state_dir)
    if rec is not None:
        order = {
            "node-agent": 0,
            "kube-proxy": 1,
            "coredns": 1,
            "traefik": 1,
            "versitygw": 1,
            "prometheus": 1,
            "kwok": 2,
            "kube-scheduler": 3,
            "kube-controller-manager": 4,
            "kube-apiserver": 5,
            "etcd": 6,
        }
        for p in sorted(rec.processes, key=lambda p: order.get(p.name, -1)):
            _stop_pid(p.pid, timeout=15 if p.name == "node-agent" else 10)
    if rec is not None and rec.pod_network_index:
        net = podnet.PodNetwork(rec.pod_network_index)
        for pid in net.pids():
            _stop_pid(pid, timeout=5)
        net.destroy()
    procs_dir = Layout(state_dir).agent_dir / "procs"
    if procs_dir.is_dir():
        for f in procs_dir.iterdir():
            if f.name.isdigit():
                _stop_pid(int(f.name), timeout=5)
    if keep_logs_on_error:
        logs = Layout(state_dir).logs
        if logs.is_dir():
            saved = state_dir.parent / f"{state_dir.name}-failed-logs"
            shutil.rmtree(saved, ignore_errors=True)
            shutil.copytree(logs, saved)
    shutil.rmtree(state_dir, ignore_errors=True)
