"""KEDA and the aggregation layer in the local cluster: command lines, the apiserver's flags, and the
objects ``up`` takes from KEDA's module ``config/`` (pure builders in localcluster.config)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from localcluster import config, podnet
from localcluster.pki import KeyPair


def test_the_aggregation_layer_uses_the_front_proxy_ca_and_client() -> None:
    pair = KeyPair(Path("/p/front-proxy-client.crt"), Path("/p/front-proxy-client.key"))
    args = config.aggregation_layer_args(front_proxy_ca=Path("/p/front-proxy/ca.crt"), proxy_client=pair)
    assert "--requestheader-client-ca-file=/p/front-proxy/ca.crt" in args
    assert f"--requestheader-allowed-names={config.FRONT_PROXY_CLIENT}" in args
    assert "--proxy-client-cert-file=/p/front-proxy-client.crt" in args
    assert "--proxy-client-key-file=/p/front-proxy-client.key" in args
    assert "--requestheader-username-headers=X-Remote-User" in args
    assert "--requestheader-group-headers=X-Remote-Group" in args
    assert "--requestheader-extra-headers-prefix=X-Remote-Extra-" in args
    assert "--enable-aggregator-routing=true" in args


def test_the_hpa_controller_syncs_often(tmp_path: Path) -> None:
    pair = KeyPair(tmp_path / "a", tmp_path / "b")
    args = config.controller_manager_args(tmp_path, kubeconfig_path=tmp_path / "k", port=1, ca=pair, sa=pair)
    assert "--horizontal-pod-autoscaler-sync-period=5s" in args
    assert "--controllers=*" in args  # the HPA controller among them


def test_keda_binds_only_the_anchor_and_ports_clear_of_the_namespaces_other_listeners(tmp_path: Path) -> None:
    net = podnet.PodNetwork(3)
    certs = tmp_path / "certs"
    op = config.keda_operator_args(tmp_path, listen_ip=net.anchor_ip, cert_dir=certs)
    ad = config.keda_adapter_args(
        tmp_path, listen_ip=net.anchor_ip, cert_dir=certs, kubeconfig_path=tmp_path / "k"
    )
    assert op[0] == str(tmp_path / "keda-operator") and ad[0] == str(tmp_path / "keda-adapter")
    for flag in ("--metrics-bind-address", "--health-probe-bind-address", "--metrics-service-bind-address"):
        assert any(a.startswith(f"{flag}=10.244.3.254:") for a in op), flag
    assert "--enable-cert-rotation=false" in op and f"--cert-dir={certs}" in op
    assert "--bind-address=10.244.3.254" in ad
    assert f"--metrics-service-address=10.244.3.254:{config.KEDA_GRPC_PORT}" in ad
    assert f"--tls-cert-file={certs / 'tls.crt'}" in ad and f"--cert-dir={certs}" in ad
    for flag in ("--lister-kubeconfig", "--authentication-kubeconfig", "--authorization-kubeconfig"):
        assert f"{flag}={tmp_path / 'k'}" in ad
    keda_ports = {
        config.KEDA_GRPC_PORT,
        config.KEDA_OPERATOR_METRICS_PORT,
        config.KEDA_OPERATOR_PROBE_PORT,
        config.KEDA_ADAPTER_PORT,
        config.KEDA_ADAPTER_METRICS_PORT,
    }
    assert len(keda_ports) == 5
    assert keda_ports.isdisjoint(
        {
            config.GATEWAY_PORT,
            config.TRAEFIK_PING_PORT,
            config.KUBE_PROXY_HEALTHZ_PORT,
            config.KUBE_PROXY_METRICS_PORT,
            8080,  # the test app's and the serving image's port in pods
        }
    )
    env = config.keda_env(tmp_path / "k")
    assert env["WATCH_NAMESPACE"] == "" and env["POD_NAMESPACE"] == config.KEDA_NAMESPACE


def test_json_patch_adds_appends_removes_and_replaces() -> None:
    doc = {"a": {"b": [1, 2], "c": 1, "d/e": 0}}
    out = config.json_patch(
        doc,
        [
            {"op": "add", "path": "/a/b/-", "value": 3},
            {"op": "add", "path": "/a/b/0", "value": 0},
            {"op": "add", "path": "/a/x", "value": {"y": 1}},
            {"op": "remove", "path": "/a/c"},
            {"op": "replace", "path": "/a/d~1e", "value": 9},
        ],
    )
    assert out == {"a": {"b": [0, 1, 2, 3], "x": {"y": 1}, "d/e": 9}}
    assert doc == {"a": {"b": [1, 2], "c": 1, "d/e": 0}}  # the input is left alone
    with pytest.raises(KeyError):
        config.json_patch(doc, [{"op": "replace", "path": "/a/zz", "value": 1}])
    with pytest.raises(ValueError):
        config.json_patch(doc, [{"op": "move", "from": "/a", "path": "/b"}])


def _crd(name: str) -> dict[str, object]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {"versions": [{"name": "v1alpha1", "schema": {"openAPIV3Schema": {"properties": {}}}}]},
    }


def test_keda_crds_are_its_kustomizations_bases_with_its_patches(tmp_path: Path) -> None:
    (tmp_path / "bases").mkdir()
    (tmp_path / "patches").mkdir()
    (tmp_path / "bases" / "so.yaml").write_text(yaml.safe_dump(_crd("scaledobjects.keda.sh")))
    (tmp_path / "bases" / "sj.yaml").write_text(yaml.safe_dump(_crd("scaledjobs.keda.sh")))
    (tmp_path / "bases" / "unlisted.yaml").write_text(yaml.safe_dump(_crd("other.keda.sh")))
    patch = [{"op": "add", "path": "/spec/versions/0/schema/openAPIV3Schema/properties/x", "value": 1}]
    (tmp_path / "patches" / "so.yaml").write_text(yaml.safe_dump(patch))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["bases/so.yaml", "bases/sj.yaml"],
                "patches": [{"path": "patches/so.yaml", "target": {"name": "scaledobjects.keda.sh"}}],
            }
        )
    )
    crds = {c["metadata"]["name"]: c for c in config.keda_crds(tmp_path)}
    assert set(crds) == {"scaledobjects.keda.sh", "scaledjobs.keda.sh"}
    props = lambda c: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]  # noqa: E731
    assert props(crds["scaledobjects.keda.sh"]) == {"x": 1}
    assert props(crds["scaledjobs.keda.sh"]) == {}


def _keda_config(root: Path) -> Path:
    (root / "rbac").mkdir(parents=True)
    (root / "metrics-server").mkdir()
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}}
    ns_role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"}}
    (root / "rbac" / "role.yaml").write_text(yaml.safe_dump_all([role, ns_role]))
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "auth-reader", "namespace": "kube-system"},
    }
    (root / "rbac" / "role_binding.yaml").write_text(yaml.safe_dump(binding))
    (root / "rbac" / "aggregate_cluster_roles.yaml").write_text("")
    (root / "metrics-server" / "role.yaml").write_text("")
    (root / "metrics-server" / "role_binding.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ignored"}})
    )
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": config.KEDA_APISERVICE},
        "spec": {
            "service": {"name": config.KEDA_METRICS_SERVICE, "namespace": config.KEDA_NAMESPACE},
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "insecureSkipTLSVerify": True,
        },
    }
    (root / "metrics-server" / "api_service.yaml").write_text(yaml.safe_dump(api_service))
    return root


def test_keda_rbac_goes_to_its_namespace_unless_it_names_one(tmp_path: Path) -> None:
    objs = config.keda_rbac(_keda_config(tmp_path))
    paths = sorted(p for p, _ in objs)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    assert paths == sorted(
        [
            f"{rbac}/clusterroles",
            f"{rbac}/namespaces/{config.KEDA_NAMESPACE}/roles",
            f"{rbac}/namespaces/kube-system/rolebindings",
        ]
    )


def test_the_api_service_trusts_the_cluster_ca_and_its_service_reaches_the_adapter(tmp_path: Path) -> None:
    objs = config.keda_metrics_objects(_keda_config(tmp_path), ca_bundle=b"PEM", endpoint_ip="10.244.3.254")
    kinds = [o["kind"] for _, o in objs]
    assert kinds[0] == "Namespace"  # first: the rest lives in it
    by_kind = {o["kind"]: o for _, o in objs}
    api_service = by_kind["APIService"]
    assert base64.b64decode(api_service["spec"]["caBundle"]) == b"PEM"
    assert "insecureSkipTLSVerify" not in api_service["spec"]
    svc, eps = by_kind["Service"], by_kind["EndpointSlice"]
    assert "selector" not in svc["spec"]  # no pod: the EndpointSlice is written by up
    assert svc["metadata"]["name"] == api_service["spec"]["service"]["name"]
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
    # the aggregator picks the endpoint port by the Service port's name
    assert svc["spec"]["ports"][0]["name"] == eps["ports"][0]["name"] == "https"
    assert eps["ports"][0]["port"] == svc["spec"]["ports"][0]["targetPort"] == config.KEDA_ADAPTER_PORT
    assert eps["endpoints"] == [{"addresses": ["10.244.3.254"], "conditions": {"ready": True}}]
    assert by_kind["ServiceAccount"]["metadata"]["name"] == config.KEDA_SERVICE_ACCOUNT
    assert config.KEDA_USER == "system:serviceaccount:keda:keda-operator"


def test_api_service_available_reads_the_condition() -> None:
    assert not config.api_service_available(None)
    assert not config.api_service_available(
        {"status": {"conditions": [{"type": "Available", "status": "False"}]}}
    )
    assert config.api_service_available({"status": {"conditions": [{"type": "Available", "status": "True"}]}})
