"""``helm template`` of charts/modeldeploy: RBAC is exactly what the operator uses, the pod is restricted, the
operator's settings reach it, and the values schema refuses what it should."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from chart_render import CHART, CI_VALUES, by_kind, helm, one, render, rule_table, template_text

# What the operator calls in a watched namespace (see operator/modeldeploy/{reconciler,operator,kube}.py and
# kopf's watches). Any change here is a deliberate change of the operator's rights.
NAMESPACED_RULES = {
    ("modeldeploy.io", "modeldeployments"): {"get", "list", "watch", "patch"},
    ("modeldeploy.io", "modeldeployments/status"): {"patch"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"list", "watch", "patch"},
    ("", "pods/status"): {"patch"},
    ("", "events"): {"create", "patch"},
}
CRD_WATCH = {("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"}}
NEVER = {
    "secrets",
    "configmaps",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "serviceaccounts/token",
    "roles",
    "rolebindings",
    "clusterroles",
    "clusterrolebindings",
    "nodes",
    "*",
}


CW = "--set=rbac.clusterWide=true"  # cluster mode (the default is namespaced)


def rbac_objects(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("ClusterRole", "Role")]


def test_the_default_is_namespaced_mode_in_the_release_namespace_only() -> None:
    docs = render()
    assert not by_kind(docs, "ClusterRoleBinding") or all(
        b["roleRef"]["name"].endswith("-discovery") for b in by_kind(docs, "ClusterRoleBinding")
    )
    (role,) = by_kind(docs, "Role")
    assert role["metadata"]["namespace"] == "md-system"
    assert rule_table(role["rules"]) == {
        **NAMESPACED_RULES,
        ("kopf.dev", "kopfpeerings:md-modeldeploy"): {"get", "patch"},
        ("kopf.dev", "kopfpeerings"): {"list", "watch"},
    }
    (cr,) = by_kind(docs, "ClusterRole")  # kopf's discovery only: names, no namespaced object
    assert rule_table(cr["rules"]) == {**CRD_WATCH, ("", "namespaces"): {"list", "watch"}}
    assert env_of(docs)["MODELDEPLOY_NAMESPACES"] == "md-system"
    assert [p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")] == ["md-system"]


def test_cluster_wide_with_a_namespace_list_is_refused_by_name() -> None:
    res = helm(
        "template", "md", str(CHART), "--namespace", "md-system",
        "--set", "rbac.clusterWide=true", "--set", "watchNamespaces={team-a}", check=False,
    )  # fmt: skip
    assert res.returncode != 0
    assert "rbac.clusterWide=true manages every namespace: leave watchNamespaces empty" in res.stderr


def test_cluster_mode_rbac_is_exactly_what_the_operator_uses() -> None:
    docs = render("--set", "rbac.clusterWide=true")
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    role = one(docs, "ClusterRole")
    assert rule_table(role["rules"]) == {
        **NAMESPACED_RULES,
        **CRD_WATCH,
        # the chart creates the peering object; the operator only reads it and patches keep-alives into it
        ("kopf.dev", "clusterkopfpeerings:md-modeldeploy"): {"get", "patch"},
        ("kopf.dev", "clusterkopfpeerings"): {"list", "watch"},
    }
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "md-modeldeploy", "namespace": "md-system"}
    ]
    peering = one(docs, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "md-modeldeploy"


def test_namespaced_mode_has_a_role_per_watched_namespace_and_nothing_namespaced_cluster_wide() -> None:
    docs = render("--set", "watchNamespaces={team-a,team-b}")
    roles = by_kind(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for r in roles:
        assert rule_table(r["rules"]) == {
            **NAMESPACED_RULES,
            ("kopf.dev", "kopfpeerings:md-modeldeploy"): {"get", "patch"},
            ("kopf.dev", "kopfpeerings"): {"list", "watch"},
        }
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "md-modeldeploy", "namespace": "md-system"}
        ]
    # the only cluster-wide rights: kopf's discovery of CRDs and namespaces (names only)
    (cr,) = by_kind(docs, "ClusterRole")
    assert rule_table(cr["rules"]) == {**CRD_WATCH, ("", "namespaces"): {"list", "watch"}}
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == ["team-a", "team-b"]
    assert not by_kind(docs, "ClusterKopfPeering")
    env = env_of(docs)
    assert env["MODELDEPLOY_NAMESPACES"] == "team-a,team-b"


def test_namespaced_mode_without_discovery_has_nothing_cluster_scoped() -> None:
    docs = render("--set", "watchNamespaces={team-a}", "--set", "rbac.clusterDiscovery=false")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert len(by_kind(docs, "Role")) == 1


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: "defaults" if v is None else v.name)
def test_no_rule_grants_secrets_wildcards_or_escalation(values: Any) -> None:
    docs = render(*(["-f", str(values)] if values else []))
    for role in rbac_objects(docs):
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule.get("apiGroups", [])
            assert not set(rule["resources"]) & NEVER, f"{role['metadata']['name']}: {rule}"
            assert not {"escalate", "bind", "impersonate", "update", "deletecollection"} & set(rule["verbs"])
            if "modeldeployments" in rule["resources"]:
                assert "delete" not in rule["verbs"] and "create" not in rule["verbs"]


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: "defaults" if v is None else v.name)
def test_every_rendered_rbac_rule_has_a_comment(values: Any) -> None:
    """A comment line right above every rule (``- apiGroups:``) of every Role and ClusterRole rendered."""
    text = template_text(*(["-f", str(values)] if values else []))
    checked = 0
    for doc in text.split("\n---\n"):
        if not re.search(r"^kind: (Cluster)?Role$", doc, flags=re.M):
            continue
        lines = doc.splitlines()
        for i, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                checked += 1
                assert lines[i - 1].strip().startswith("#"), f"rule without a comment:\n{line}\n{doc}"
    assert checked


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return one(docs, "Deployment")


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    return c


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


def test_deployment_is_recreate_restricted_probed_and_bounded() -> None:
    docs = render()
    dep = deployment(docs)
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    assert dep["spec"]["replicas"] == 1
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert c["image"] == "modeldeploy/operator:dev"
    probe = c["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert probe["port"] == "health" and ports == {"metrics": 8480, "health": 8481}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]


def chart_settings(docs: list[dict[str, Any]]) -> Any:
    """The chart's env and args, read by the operator's own settings model (the pod IP stands in for the
    downward API's value)."""
    from modeldeploy.settings import load_settings

    env = {k: v for k, v in env_of(docs).items() if isinstance(v, str)}
    return load_settings(container(docs)["args"], {**env, "MODELDEPLOY_BIND_HOST": "10.0.0.7"})


def test_operator_understands_the_settings_the_chart_passes() -> None:
    docs = render(
        "--set", "watchNamespaces={team-a,team-b}",
        "--set", "operator.prometheusUrl=http://prom.example:9090",
        "--set", "operator.workers=7",
        "--set", "operator.peering.priority=42",
        "--set", "operator.debug=true",
        "--set", "operator.prometheusInsecureSkipVerify=true",
    )  # fmt: skip
    args = chart_settings(docs)
    assert args.namespace == ["team-a", "team-b"]
    assert args.prometheus_url == "http://prom.example:9090"
    assert args.workers == 7
    assert args.priority == 42
    assert args.peering_name == "md-modeldeploy"
    assert args.create_peering is False  # the chart made the peering objects
    assert args.standalone is False
    assert args.verbose is True and args.prometheus_insecure_skip_verify is True
    assert (args.metrics_port, args.health_port) == (8480, 8481)
    assert env_of(docs)["MODELDEPLOY_BIND_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_notifications_reach_the_operator_with_their_signing_key_mounted_from_a_secret() -> None:
    docs = render(
        "--set", "operator.notifications.url=https://hooks.example/rollouts",
        "--set", "operator.notifications.format=slack",
        "--set", "operator.notifications.signingKeySecret=rollout-signing",
        "--set", "operator.notifications.allowedHosts={hooks.example,*.slack.com}",
    )  # fmt: skip
    args = chart_settings(docs)
    assert (args.notification_url, args.notification_format) == ("https://hooks.example/rollouts", "slack")
    assert args.notification_allowed_hosts == ["hooks.example", "*.slack.com"]
    key_file = args.notification_signing_key_file
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "notification-key")
    assert key_file == mount["mountPath"] + "/key" and mount["readOnly"] is True
    volume = next(
        v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "notification-key"
    )
    assert volume["secret"] == {"secretName": "rollout-signing", "items": [{"key": "key", "path": "key"}]}
    off = chart_settings(render())
    assert off.notification_url is None and off.notification_signing_key_file is None
    assert off.notification_allowed_hosts == []


def test_the_charts_defaults_are_valid_operator_settings() -> None:
    """Priority 0 in the values means random: the chart leaves the variable out (the operator reads 0 as
    kopf's priority 0); no namespaces listed and cluster-wide rights mean the variable is empty."""
    args = chart_settings(render("--set", "rbac.clusterWide=true"))
    assert args.namespace == [] and args.watch_httproutes is False and args.verbose is False
    assert 1 <= args.priority <= 2**30
    standalone = chart_settings(render("--set", "operator.peering.enabled=false"))
    assert standalone.standalone is True


def test_the_operator_builds_shadow_targets_in_the_charts_cluster_domain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from modeldeploy import builders

    env = env_of(render("--set", "operator.clusterDomain=corp.internal"))
    monkeypatch.setenv("MODELDEPLOY_CLUSTER_DOMAIN", env["MODELDEPLOY_CLUSTER_DOMAIN"])
    assert builders.cluster_domain() == "corp.internal"
    assert env_of(render())["MODELDEPLOY_CLUSTER_DOMAIN"] == "cluster.local"


def test_the_serving_pods_network_policy_is_off_by_default_and_per_watched_namespace() -> None:
    assert not by_kind(render(), "NetworkPolicy")
    docs = render("--set", "networkPolicy.enabled=true", "--set", "watchNamespaces={team-a,team-b}")
    policies = by_kind(docs, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    serving = {"matchExpressions": [{"key": "modeldeploy.io/name", "operator": "Exists"}]}
    for p in policies:
        spec = p["spec"]
        assert spec["podSelector"] == serving and spec["policyTypes"] == ["Ingress", "Egress"]
        (ingress,) = spec["ingress"]
        assert ingress["ports"] == [{"port": 8080, "protocol": "TCP"}]
        assert ingress["from"] == [
            {"podSelector": {}},
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "md-system"}},
                "podSelector": {"matchLabels": container_selector(docs)},
            },
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway-system"}}},
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        ]
        # egress: sibling serving pods on the server port and the cluster DNS, nothing else by default
        assert spec["egress"] == [
            {"ports": [{"port": 8080, "protocol": "TCP"}], "to": [{"podSelector": serving}]},
            {
                "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
                "to": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}
                ],
            },
        ]
    extra = render(
        "--set", "networkPolicy.enabled=true",
        "--set", "rbac.clusterWide=true",
        "--set", "networkPolicy.namespaces={ml}",
        "--set", "networkPolicy.extraEgress[0].to[0].ipBlock.cidr=10.0.12.0/24",
    )  # fmt: skip
    (p,) = by_kind(extra, "NetworkPolicy")
    assert p["metadata"]["namespace"] == "ml"
    assert p["spec"]["egress"][2] == {"to": [{"ipBlock": {"cidr": "10.0.12.0/24"}}]}


def container_selector(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The operator pods' labels that its Deployment selects on."""
    return one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def test_peering_off_means_standalone_and_no_peering_rights() -> None:
    docs = render("--set", "operator.peering.enabled=false")
    assert env_of(docs)["MODELDEPLOY_STANDALONE"] == "1"
    assert not by_kind(docs, "ClusterKopfPeering")
    assert not any(g == "kopf.dev" for g, _ in rule_table(one(docs, "ClusterRole")["rules"]))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--set", "replicaCount=2", "--set", "operator.peering.enabled=false"],
            "needs operator.peering.enabled",
        ),
        (["--set", "bogus=1"], "additional properties 'bogus' not allowed"),
        (["--set", "replicaCount=-1"], "replicaCount"),
        (["--set", "operator.prometheusUrl=prom:9090"], "prometheusUrl"),
        (["--set", "watchNamespaces={Bad_Name}"], "watchNamespaces"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "operator.clusterDomain=Cluster_Local"], "clusterDomain"),
        (
            ["--set", "networkPolicy.enabled=true", "--set", "rbac.clusterWide=true"],
            "needs networkPolicy.namespaces",
        ),
    ],
)
def test_bad_values_are_refused(flags: list[str], message: str) -> None:
    res = helm("template", "md", str(CHART), *flags, check=False)
    assert res.returncode != 0
    assert message in res.stderr


def test_monitoring_objects_and_dashboard_only_when_enabled() -> None:
    plain = render("--set", "rbac.clusterWide=true")
    for kind in ("ServiceMonitor", "PodMonitor", "ConfigMap"):
        assert not by_kind(plain, kind)
    docs = render("-f", str(CHART / "ci" / "monitoring-values.yaml"), "--set", "rbac.clusterWide=true")
    sm = one(docs, "ServiceMonitor")
    svc = next(d for d in by_kind(docs, "Service") if d["metadata"]["name"].endswith("-metrics"))
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    pm = one(docs, "PodMonitor")
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"  # the serving container's port name
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    dash = json.loads(one(docs, "ConfigMap")["data"]["modeldeploy.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in (
        "modelserver_requests_total",
        "modelserver_request_duration_seconds_bucket",
        "modelserver_batch_size",
        "modelserver_queue_wait_seconds_bucket",
        "modeldeploy_canary_weight",
        "modeldeploy_analysis_value",
    ):
        assert metric in exprs, metric
    assert "modeldeploy_io_revision" in exprs  # per revision, from the pod label
    assert len(by_kind(docs, "Deployment")) == 1 and deployment(docs)["spec"]["replicas"] == 2


def test_dashboard_queries_use_only_metrics_that_exist_or_are_announced() -> None:
    """Every modelserver_* metric in the dashboard is in the server's metrics module."""
    from modelserver import metrics as server_metrics

    source = Path(server_metrics.__file__).read_text()
    dash = json.loads((CHART / "dashboards" / "modeldeploy.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in set(re.findall(r"modelserver_[a-z_]+", exprs)):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        assert f'"{base}"' in source or f'"{base}_seconds"' in source, name


def test_template_output_has_no_empty_or_duplicate_objects() -> None:
    for values in CI_VALUES:
        text = template_text("-f", str(values))
        docs = render("-f", str(values))
        keys = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
        assert len(keys) == len(set(keys)), f"{values.name}: duplicates"
        assert "\n---\n---" not in text


def test_gateway_api_rights_only_when_enabled() -> None:
    key = ("gateway.networking.k8s.io", "httproutes")
    assert key not in rule_table(one(render(CW), "ClusterRole")["rules"])
    assert ("discovery.k8s.io", "endpointslices") not in rule_table(one(render(CW), "ClusterRole")["rules"])
    rules = rule_table(one(render(CW, "--set", "rbac.gatewayAPI=true"), "ClusterRole")["rules"])
    assert rules[key] == {"get", "list", "watch", "create", "patch", "delete"}
    # the canary's weight waits for a ready endpoint in its Service's EndpointSlices: read-only
    assert rules[("discovery.k8s.io", "endpointslices")] == {"get", "list", "watch"}


def test_keda_rights_only_when_enabled() -> None:
    key = ("keda.sh", "scaledobjects")
    assert key not in rule_table(one(render(CW), "ClusterRole")["rules"])
    rules = rule_table(one(render(CW, "--set", "rbac.keda=true"), "ClusterRole")["rules"])
    assert rules[key] == {"get", "list", "create", "patch", "delete"}


def test_httproutes_are_watched_only_with_the_rights_to() -> None:
    def env(*args: str) -> dict[str, str]:
        (dep,) = [d for d in render(*args) if d["kind"] == "Deployment"]
        return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert env()["MODELDEPLOY_WATCH_HTTPROUTES"] == "0"
    assert env("--set", "rbac.gatewayAPI=true")["MODELDEPLOY_WATCH_HTTPROUTES"] == "1"


def test_the_service_monitor_keeps_the_operators_own_namespace_label() -> None:
    docs = render("--set", "metrics.serviceMonitor.enabled=true")
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    endpoints = monitor["spec"]["endpoints"]
    assert endpoints and all(ep.get("honorLabels") is True for ep in endpoints), endpoints


def named(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    """The one object of ``kind`` whose name ends with ``suffix`` (the chart has two admission policies)."""
    (found,) = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)]
    return found


def authors(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    """The ModelDeployment authors' policy (or its binding): templates/admission-policy.yaml."""
    return named(docs, kind, "-authors")


def test_the_admission_policy_is_on_by_default_and_bound_to_the_watched_namespaces_only() -> None:
    """Issue 24, finding 3: the policy's CEL carries the platform team's lists; its binding covers every
    namespace in cluster mode and only the watched ones in namespaced mode; it can be turned off."""
    policy = authors(render(), "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["images"]) == [] and json.loads(variables["tolerationKeys"]) == [
        "nvidia.com/gpu"
    ]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "matchResources" not in authors(render(CW), "ValidatingAdmissionPolicyBinding")["spec"]
    default = authors(render(), "ValidatingAdmissionPolicyBinding")["spec"]["matchResources"]
    assert default["namespaceSelector"]["matchExpressions"][0]["values"] == ["md-system"]
    docs = render(
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "admissionPolicy.allowedImagePrefixes={registry.example.com/ml/}",
    )
    policy = authors(docs, "ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert json.loads(variables["images"]) == ["registry.example.com/ml/"]
    binding = authors(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expr,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr["values"] == ["team-a", "team-b"]
    off = render("--set", "admissionPolicy.enabled=false")
    assert not by_kind(off, "ValidatingAdmissionPolicy") and not by_kind(
        off, "ValidatingAdmissionPolicyBinding"
    )


#: the authors' policy's image rule as its CEL reads; the test below holds the chart to it
IMAGE_RULE = (
    "size(variables.images) == 0 || !has(object.spec.image) || object.spec.image in variables.imageNames "
    "|| variables.imageStarts.exists(p, object.spec.image.startsWith(p))"
)


def test_an_allowed_image_prefix_ends_where_a_part_of_the_image_reference_ends() -> None:
    """A plain startsWith let the prefix registry.example.com admit registry.example.com.evil.io/x. A host
    prefix admits the images under it ('/'), not another port of the host nor the host alone (a Docker
    Hub name); a repository prefix admits itself, its tags, digests and the repositories under it, not a
    longer name; a prefix that ends in '/', ':' or '@' is taken as written. The rendered CEL is checked
    to be IMAGE_RULE and evaluated here by its two operations (in, startsWith);
    tests/security/test_admission_policy.py asks the apiserver."""
    prefixes = ["registry.example.com", "mirror.example.com/ml/modelserver", "ports.example.com:"]
    docs = render("--set-json", f"admissionPolicy.allowedImagePrefixes={json.dumps(prefixes)}")
    policy = authors(docs, "ValidatingAdmissionPolicy")
    (rule,) = [v for v in policy["spec"]["validations"] if v["messageExpression"].startswith("'spec.image: ")]
    assert rule["expression"] == IMAGE_RULE
    lists = ("images", "imageStarts", "imageNames")  # CEL list literals written as JSON
    variables = {
        v["name"]: json.loads(v["expression"]) for v in policy["spec"]["variables"] if v["name"] in lists
    }
    assert variables["images"] == prefixes  # the message lists them as given

    def admitted(image: str) -> bool:
        starts, names = variables["imageStarts"], variables["imageNames"]
        return image in names or any(image.startswith(p) for p in starts)

    cases = {
        "registry.example.com/x": True,
        "registry.example.com/ml/modelserver:1.2": True,
        "registry.example.com.evil.io/x": False,
        "registry.example.comx/y": False,
        "registry.example.com:5000/x": False,  # another port is another registry: list it
        "registry.example.com": False,  # read as docker.io/library/registry.example.com
        "mirror.example.com/ml/modelserver": True,
        "mirror.example.com/ml/modelserver:1.2": True,
        "mirror.example.com/ml/modelserver@sha256:" + "0" * 64: True,
        "mirror.example.com/ml/modelserver/cpu:1": True,
        "mirror.example.com/ml/modelserver-evil:1": False,
        "mirror.example.com/ml/other:1": False,
        "ports.example.com:5000/x": True,  # ends in ':': as written
        "ports.example.com/x": False,
    }
    assert {image: admitted(image) for image in cases} == cases


def pods_policy(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return named(docs, "ValidatingAdmissionPolicy", "-pods")


def test_the_operator_pods_policy_binds_the_operators_own_service_account_where_it_watches() -> None:
    docs = render("--set", "watchNamespaces={team-a,team-b}")
    policy = [
        d for d in by_kind(docs, "ValidatingAdmissionPolicy") if d["metadata"]["name"].endswith("-pods")
    ]
    (policy,) = policy
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["pods", "pods/status"],
        }
    ]
    (cond,) = policy["spec"]["matchConditions"]
    assert (
        cond["expression"] == "request.userInfo.username == 'system:serviceaccount:md-system:md-modeldeploy'"
    )
    assert policy["spec"]["failurePolicy"] == "Fail"
    (binding,) = [
        d
        for d in by_kind(docs, "ValidatingAdmissionPolicyBinding")
        if d["spec"]["policyName"].endswith("-pods")
    ]
    expr = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]
    assert expr["values"] == ["team-a", "team-b"]
    custom = render("--set", "serviceAccount.name=ops-bot")
    (cond,) = pods_policy(custom)["spec"]["matchConditions"]
    assert cond["expression"].endswith("'system:serviceaccount:md-system:ops-bot'")
    for off in ("admissionPolicy.operatorPods=false", "admissionPolicy.enabled=false"):
        names = [d["metadata"]["name"] for d in by_kind(render("--set", off), "ValidatingAdmissionPolicy")]
        assert not any(n.endswith("-pods") for n in names), off
