"""``up``'s steps, in the order they run (:meth:`BringUp.run`): the credentials, etcd, kube-apiserver,
RBAC, CoreDNS, the controllers, kwok and the node agent, Prometheus, the nodes, kube-proxy, the object
store, the Gateway API CRDs; then, once the control plane is ready, Traefik and KEDA; last, the waits
on the data plane and the URLs written to the state directory.

With ``node="containerd"`` the pods run on a real node instead of the process agent
(:mod:`localcluster.realnode`): containerd and the kubelet start after the kwok nodes (which are then
tainted, so that only pods tolerating them land there) and before kube-proxy, which takes the real node's
name and pod range; the device plugin starts once the kubelet registered, and ``up`` waits last for the
node Ready with its GPUs."""

from __future__ import annotations

import json
import shutil
import ssl
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import yaml

from . import clusterdns, config, podnet
from . import realnode_config as rnc
from .kubeapi import CRD_PATH, KubeAPI
from .objectstore_config import s3_credentials
from .pki import CertificateAuthority, KeyPair, service_account_keys
from .starter import ClusterError, Starter
from .state import ClusterRecord, Layout


def _front_proxy(layout: Layout) -> tuple[Path, KeyPair]:
    """The aggregation layer's front-proxy CA (a CA of its own: every certificate it signs may assert
    any user to an extension server) and the client certificate the apiserver proxies with."""
    front = CertificateAuthority(layout.pki / "front-proxy", common_name="modeldeploy-front-proxy-ca")
    return front.pair.cert, front.issue("front-proxy-client", config.FRONT_PROXY_CLIENT)


class BringUp:
    """One run of ``up`` on a fresh state directory: the steps share the ports, the certificates and
    kubeconfigs the first step makes, and the admin API client of the apiserver step."""

    def __init__(
        self,
        starter: Starter,
        layout: Layout,
        rec: ClusterRecord,
        bin_dir: Path,
        net: podnet.PodNetwork,
        timeout: float,
        *,
        audit: bool,
        keda: bool,
        node: str = "process",
    ) -> None:
        self.starter, self.layout, self.rec, self.bin_dir, self.net = starter, layout, rec, bin_dir, net
        self.audit, self.keda = audit, keda
        self.real_node = node == "containerd"
        self.notes: list[str] = []  # what up prints besides its URLs (the real node's images)
        self.ports = rec.ports
        self.deadline = time.monotonic() + timeout
        self.server = f"https://127.0.0.1:{self.ports['apiserver']}"
        # the apiserver as the components inside the pod network reach it: at the network's host end
        self.server_in_net = f"https://{net.host_ip}:{self.ports['apiserver']}"
        self.gateway_crds: list[str] = []

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 1.0)

    def run(self) -> None:
        self.make_credentials()
        self.start_etcd()
        self.start_apiserver()
        self.grant_prometheus_and_traefik()
        self.start_coredns()
        self.start_controllers()
        self.start_kwok_and_agent()
        self.start_prometheus()
        self.create_nodes()
        if self.real_node:
            self.start_real_node()
        self.start_kube_proxy()
        self.start_object_store()
        self.create_gateway_crds()
        self.wait_for_control_plane()
        self.start_gateway()
        keda_api_service = self.start_keda() if self.keda else None
        self.wait_for_data_plane(keda_api_service)
        if self.real_node:
            self.node.wait_ready(self.api, self.left())
        self.publish_urls()

    # ----- before any process --------------------------------------------------------------------
    def _client_kubeconfig(self, name: str, cn: str, org: str | None, at: str | None = None) -> Path:
        pair = self.ca.issue(name, cn, org=org)
        path = self.layout.kubeconfig if name == "admin" else self.layout.component_kubeconfig(name)
        path.write_text(yaml.safe_dump(config.kubeconfig(at or self.server, self.ca.pair.cert, pair, cn)))
        path.chmod(0o600)
        return path

    def _check_binaries(self, names: Iterable[str]) -> None:
        for name in names:
            if not (self.bin_dir / name).exists():
                raise ClusterError(f"no {name} in {self.bin_dir} (tools/build-binaries.sh builds it)")

    def make_credentials(self) -> None:
        """The cluster's CA, the apiserver's serving certificate, the service-account keys, a kubeconfig
        per component and the front proxy's certificates; the binaries checked; kube-proxy's mode."""
        layout, net = self.layout, self.net
        self.ca = CertificateAuthority(layout.pki)
        self.serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            server_ips=("127.0.0.1", net.kubernetes_service_ip, net.host_ip),
            server_dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            client=False,
        )
        self.sa = service_account_keys(layout.pki)
        self.rec.apiserver_url = self.server
        kubeconfig = self._client_kubeconfig
        self.admin = kubeconfig("admin", "localcluster-admin", "system:masters")
        self.kcm = kubeconfig("controller-manager", "system:kube-controller-manager", None)
        self.sched = kubeconfig("scheduler", "system:kube-scheduler", None)
        # kube-proxy runs inside the pod network, so it reaches the apiserver at the host end; the user
        # system:kube-proxy is bound to the built-in ClusterRole system:node-proxier.
        self.proxy_kcfg = kubeconfig("kube-proxy", "system:kube-proxy", None, at=self.server_in_net)
        # Traefik runs inside the pod network too (it must reach pod IPs, and pods must reach it): the user
        # localcluster-traefik, bound below to the rights its Gateway provider needs.
        self.traefik_kcfg = kubeconfig("traefik", "localcluster-traefik", None, at=self.server_in_net)
        self.dns_kcfg = kubeconfig("coredns", clusterdns.USER, None, at=self.server_in_net)
        self._check_binaries(("traefik", "versitygw", "coredns"))
        self.front_proxy_ca, self.proxy_client = _front_proxy(layout)
        if self.keda:
            self._check_binaries(("keda-operator", "keda-adapter", "keda-config"))
        # KEDA runs in the pod network too and authenticates as its ServiceAccount's user (a client
        # certificate for system:serviceaccount:keda:keda-operator), the subject of its own RBAC.
        self.keda_kcfg = kubeconfig("keda", config.KEDA_USER, "system:serviceaccounts", at=self.server_in_net)
        try:
            self.proxy_mode = config.proxy_mode(
                have_nft=shutil.which("nft") is not None, have_iptables=shutil.which("iptables") is not None
            )
        except ValueError as exc:
            raise ClusterError(str(exc)) from None
        self.prom_pair = self.ca.issue("prometheus", "localcluster-prometheus")
        self.kubelet_client = None
        if self.real_node:
            from .realnode import RealNode

            self.node = RealNode(self.starter, layout, self.bin_dir, net, self.ca, self.server_in_net)
            self.node.check_binaries()
            # the apiserver's client certificate for the kubelet's 10250 (logs, exec): system:masters, so
            # the kubelet's webhook authorization (a SubjectAccessReview) allows it
            self.kubelet_client = self.ca.issue(
                "apiserver-kubelet-client", "kube-apiserver-kubelet-client", org="system:masters"
            )

    # ----- the control plane ---------------------------------------------------------------------
    def start_etcd(self) -> None:
        ports = self.ports
        self.starter.start(
            "etcd", config.etcd_args(self.bin_dir, self.layout.etcd_data, ports["etcd"], ports["etcd_peer"])
        )
        self.starter.wait_for(
            "etcd",
            lambda: httpx.get(f"http://127.0.0.1:{ports['etcd']}/health", timeout=1).status_code == 200,
            self.left(),
        )

    def start_apiserver(self) -> None:
        """kube-apiserver (with the audit log when asked, and the aggregation layer), waited on until
        ready; then the admin API client the later steps use."""
        layout = self.layout
        audit_log = audit_policy = None
        if self.audit:
            audit_policy = layout.root / "audit-policy.yaml"
            audit_policy.write_text(yaml.safe_dump(config.AUDIT_POLICY))
            audit_log = layout.logs / "audit.log"
        self.starter.start(
            "kube-apiserver",
            config.apiserver_args(
                self.bin_dir,
                etcd_port=self.ports["etcd"],
                secure_port=self.ports["apiserver"],
                ca=self.ca.pair,
                serving=self.serving,
                sa=self.sa,
                service_cidr=self.net.service_cidr,
                audit_log=audit_log,
                audit_policy=audit_policy,
                kubelet_client=self.kubelet_client,
            )
            + config.aggregation_layer_args(
                front_proxy_ca=self.front_proxy_ca, proxy_client=self.proxy_client
            ),
        )
        admin_pair = KeyPair(layout.pki / "admin.crt", layout.pki / "admin.key")
        ctx = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        ctx.load_cert_chain(str(admin_pair.cert), str(admin_pair.key))
        with httpx.Client(verify=ctx) as c:
            self.starter.wait_for(
                "kube-apiserver",
                lambda: c.get(f"{self.server}/readyz", timeout=2).status_code == 200,
                self.left(),
            )
        self.api = KubeAPI(self.admin)

    def _grant(self, name: str, rules: list[dict[str, Any]], user: str) -> None:
        """A ClusterRole ``name`` with ``rules``, bound to ``user``."""
        self.api.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles", {"metadata": {"name": name}, "rules": rules}
        )
        self.api.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
            },
        )

    def grant_prometheus_and_traefik(self) -> None:
        # Prometheus reads pods through RBAC like any other client.
        self._grant(
            "localcluster:prometheus",
            [
                {
                    "apiGroups": [""],
                    "resources": ["pods", "nodes", "services", "endpoints"],
                    "verbs": ["get", "list", "watch"],
                }
            ],
            "localcluster-prometheus",
        )
        self._grant("localcluster:traefik", config.TRAEFIK_RULES, "localcluster-traefik")

    def start_coredns(self) -> None:
        for path, obj in clusterdns.rbac_objects():
            self.api.create(path, obj)
        corefile = self.layout.root / "Corefile"
        corefile.write_text(clusterdns.corefile(listen_ip=self.net.anchor_ip, kubeconfig=self.dns_kcfg))
        self.starter.start(
            "coredns", [*self.net.exec_prefix(), *clusterdns.args(self.bin_dir, corefile_path=corefile)]
        )

    def start_controllers(self) -> None:
        self.starter.start(
            "kube-controller-manager",
            config.controller_manager_args(
                self.bin_dir,
                kubeconfig_path=self.kcm,
                port=self.ports["controller_manager"],
                ca=self.ca.pair,
                sa=self.sa,
            ),
        )
        self.starter.start(
            "kube-scheduler",
            config.scheduler_args(self.bin_dir, kubeconfig_path=self.sched, port=self.ports["scheduler"]),
        )

    def start_kwok_and_agent(self) -> None:
        stage_file = self.layout.kwok_dir / "stages.yaml"
        stage_file.write_text(yaml.safe_dump_all(config.kwok_stages(self.bin_dir / "kwok-stages")))
        self.starter.start(
            "kwok",
            config.kwok_args(
                self.bin_dir,
                kubeconfig_path=self.admin,
                config_files=[stage_file],
                server_port=self.ports["kwok"],
                pod_cidr=self.net.kwok_cidr,
            ),
        )
        if self.real_node:
            return  # the real node runs every pod
        self.starter.start(
            "node-agent",
            [
                sys.executable,
                "-m",
                "localcluster",
                "agent",
                "--kubeconfig",
                str(self.admin),
                "--state-dir",
                str(self.layout.agent_dir),
                "--pod-network",
                str(self.net.index),
            ],
        )

    def start_prometheus(self) -> None:
        rec, net, ports = self.rec, self.net, self.ports
        prom_cfg = self.layout.prometheus_dir / "prometheus.yml"
        prom_cfg.write_text(
            yaml.safe_dump(
                config.prometheus_config(
                    apiserver=self.server,
                    ca=self.ca.pair.cert,
                    client=self.prom_pair,
                    pod_cidr=rnc.node_pod_cidr(net.index) if self.real_node else net.agent_cidr,
                )
            )
        )
        self.starter.start(
            "prometheus",
            config.prometheus_args(
                self.bin_dir,
                config=prom_cfg,
                data_dir=self.layout.prometheus_dir / "data",
                port=ports["prometheus"],
            ),
        )
        rec.prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"
        rec.prometheus_url_pods = f"http://{net.host_ip}:{ports['prometheus']}"
        rec.apiserver_url_pods = f"https://{net.host_ip}:{ports['apiserver']}"
        rec.save()

    def create_nodes(self) -> None:
        for node in config.default_nodes():
            if self.real_node:
                # kwok's nodes stay (for pods that tolerate them: scale tests) but nothing lands there
                # by accident: every other pod goes to the real node
                node["spec"]["taints"] = [rnc.KWOK_TAINT]
            self.api.create("/api/v1/nodes", node)
        self.api.create(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            config.kubernetes_endpointslice(host_ip=self.net.host_ip, port=self.ports["apiserver"]),
        )

    def start_real_node(self) -> None:
        """containerd (and the images), the kubelet, registered; then the device plugin."""
        node = self.node
        node.prepare_host()
        node.start_containerd(self.left())
        started = time.monotonic()
        self.notes += node.import_images()
        # a first import (3 GB of serving image: about a minute) is not the cluster being slow to start
        self.deadline += time.monotonic() - started
        node.start_kubelet()
        node.wait_registered(self.api, self.left())
        node.start_device_plugin()

    # ----- the data plane, inside the pod network ------------------------------------------------
    def start_kube_proxy(self) -> None:
        # After the nodes exist: kube-proxy waits for its Node object (up to 30 s) before it starts. One
        # kube-proxy serves both fake nodes (they are the same machine); it takes the GPU node's name.
        proxy_cfg = self.layout.root / "kube-proxy.yaml"
        proxy_cfg.write_text(
            yaml.safe_dump(
                config.kube_proxy_config(
                    kubeconfig_path=self.proxy_kcfg,
                    node_name=rnc.NODE_NAME if self.real_node else config.GPU_NODE,
                    bind_ip=self.net.anchor_ip,
                    cluster_cidr=rnc.node_pod_cidr(self.net.index) if self.real_node else self.net.agent_cidr,
                    mode=self.proxy_mode,
                    masquerade_all=self.real_node and self.node.masquerade_all,
                )
            )
        )
        self.starter.start(
            "kube-proxy",
            [*self.net.exec_prefix(), *config.kube_proxy_args(self.bin_dir, config_path=proxy_cfg)],
        )

    def start_object_store(self) -> None:
        # The object store, in the pod network like Traefik: one URL for the host and for pods.
        layout = self.layout
        creds = s3_credentials()
        layout.s3_credentials_file.touch(mode=0o600)
        layout.s3_credentials_file.write_text(json.dumps(creds) + "\n")
        layout.s3_data.mkdir(parents=True, exist_ok=True)
        self.starter.start(
            "versitygw",
            [
                *self.net.exec_prefix(),
                *config.versitygw_args(
                    self.bin_dir,
                    listen_ip=self.net.anchor_ip,
                    data_dir=layout.s3_data,
                    access_log=layout.s3_access_log,
                ),
            ],
            env={"ROOT_ACCESS_KEY_ID": creds["accessKey"], "ROOT_SECRET_ACCESS_KEY": creds["secretKey"]},
        )

    def create_gateway_crds(self) -> None:
        for f in sorted((self.bin_dir / "gateway-api-crds").glob("*.yaml")):
            for doc in yaml.safe_load_all(f.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition":
                    self.api.create(CRD_PATH, doc)
                    self.gateway_crds.append(doc["metadata"]["name"])

    def _nodes_ready(self) -> bool:
        """kwok's nodes Ready (the real node is waited on last)."""
        items = (self.api.get("/api/v1/nodes") or {}).get("items", [])
        kwok_names = {n["metadata"]["name"] for n in config.default_nodes()}
        ready = [
            n
            for n in items
            if n["metadata"]["name"] in kwok_names
            and any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in n.get("status", {}).get("conditions", [])
            )
        ]
        return len(ready) == len(config.default_nodes())

    def wait_for_control_plane(self) -> None:
        """The nodes Ready (kwok), the default ServiceAccount (the controllers), the scheduler healthy
        and the Gateway API CRDs established."""
        api, starter, ports = self.api, self.starter, self.ports
        starter.wait_for("kwok", self._nodes_ready, self.left())
        starter.wait_for(
            "kube-controller-manager",
            lambda: (
                api.get("/api/v1/namespaces/default/serviceaccounts/default", ok_missing=True) is not None
            ),
            self.left(),
        )
        starter.wait_for(
            "kube-scheduler",
            lambda: (
                httpx.get(
                    f"https://127.0.0.1:{ports['scheduler']}/healthz", verify=False, timeout=1
                ).status_code
                == 200
            ),
            self.left(),
        )
        starter.wait_for("kube-apiserver", lambda: api.crds_established(*self.gateway_crds), self.left())

    def start_gateway(self) -> None:
        # The Gateway API data plane: after the CRDs (its informers need them), in the pod network.
        for path, obj in config.gateway_objects():
            self.api.create(path, obj)
        self.starter.start(
            "traefik",
            [*self.net.exec_prefix(), *config.traefik_args(self.bin_dir, listen_ip=self.net.anchor_ip)],
            env={"KUBECONFIG": str(self.traefik_kcfg)},
        )

    def start_keda(self) -> str:
        """KEDA's CRDs, RBAC, Service, EndpointSlice and APIService (all from its module's ``config/``),
        then keda-operator and keda-adapter inside the pod network. Returns the APIService's path (to
        wait on)."""
        api, net, bin_dir, ca = self.api, self.net, self.bin_dir, self.ca
        kcfg = bin_dir / "keda-config"
        crds: list[str] = []
        for doc in config.keda_crds(kcfg / "crd"):
            api.create(CRD_PATH, doc)
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
        cert_dir = self.layout.pki / "keda-certs"
        cert_dir.mkdir(exist_ok=True)
        for src, name in ((ca.pair.cert, "ca.crt"), (pair.cert, "tls.crt"), (pair.key, "tls.key")):
            shutil.copyfile(src, cert_dir / name)
        (cert_dir / "tls.key").chmod(0o600)

        def established() -> bool:
            return api.crds_established(*crds)

        self.starter.wait_for(
            "kube-apiserver", established, self.left()
        )  # the operator's informers need them
        self._start_keda_processes(cert_dir)
        return f"/apis/apiregistration.k8s.io/v1/apiservices/{config.KEDA_APISERVICE}"

    def _start_keda_processes(self, cert_dir: Path) -> None:
        net, bin_dir = self.net, self.bin_dir
        env = config.keda_env(self.keda_kcfg)
        self.starter.start(
            "keda-operator",
            [
                *net.exec_prefix(),
                *config.keda_operator_args(bin_dir, listen_ip=net.anchor_ip, cert_dir=cert_dir),
            ],
            env=env,
        )
        self.starter.start(
            "keda-adapter",
            [
                *net.exec_prefix(),
                *config.keda_adapter_args(
                    bin_dir, listen_ip=net.anchor_ip, cert_dir=cert_dir, kubeconfig_path=self.keda_kcfg
                ),
            ],
            env=env,
        )

    def _wait_http_ok(self, name: str, url: str) -> None:
        self.starter.wait_for(name, lambda: httpx.get(url, timeout=1).status_code == 200, self.left())

    def wait_for_data_plane(self, keda_api_service: str | None) -> None:
        """kube-proxy, CoreDNS, Prometheus, the object store (its URL recorded) and Traefik answer, the
        Gateway is programmed and, with KEDA, its APIService is Available."""
        api, net, rec, starter = self.api, self.net, self.rec, self.starter
        self._wait_http_ok("kube-proxy", f"http://{net.anchor_ip}:{config.KUBE_PROXY_HEALTHZ_PORT}/healthz")
        self._wait_http_ok("coredns", clusterdns.ready_url(net.anchor_ip))
        self._wait_http_ok("prometheus", f"{rec.prometheus_url}/-/ready")
        s3_url = f"http://{net.anchor_ip}:{config.S3_PORT}"
        self._wait_http_ok("versitygw", f"{s3_url}{config.S3_HEALTH_PATH}")
        rec.s3_url = s3_url
        rec.save()
        self._wait_http_ok("traefik", f"http://{net.anchor_ip}:{config.TRAEFIK_PING_PORT}/ping")
        gw_ns, gw_name = config.GATEWAY_NAMESPACE, config.GATEWAY_NAME
        gateway = f"/apis/gateway.networking.k8s.io/v1/namespaces/{gw_ns}/gateways/{gw_name}"
        starter.wait_for("traefik", lambda: config.gateway_programmed(api.get(gateway)), self.left())
        if keda_api_service:
            # Available: the apiserver reached the adapter through the aggregation layer.
            starter.wait_for(
                "keda-adapter", lambda: config.api_service_available(api.get(keda_api_service)), self.left()
            )

    def publish_urls(self) -> None:
        rec, layout = self.rec, self.layout
        rec.gateway_url = f"http://{self.net.anchor_ip}:{config.GATEWAY_PORT}"
        rec.save()
        layout.prometheus_url_file.write_text(rec.prometheus_url + "\n")
        layout.gateway_url_file.write_text(rec.gateway_url + "\n")
        layout.s3_url_file.write_text(rec.s3_url + "\n")
        self.api.close()
