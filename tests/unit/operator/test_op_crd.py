"""The CRD generated from the models: drift, structural-schema rules, and the API surface."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from md_cases import BAD_URLS, GOOD_URLS
from modeldeploy import crdgen
from modeldeploy.api import ModelDeploymentSpec
from yarl import URL

REPO = Path(__file__).resolve().parents[3]


def walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for key, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_committed_crd_matches_the_models():
    committed = (REPO / "crds" / "modeldeployment.yaml").read_text()
    assert committed == crdgen.render(), (
        "crds/modeldeployment.yaml drifted: run `python -m modeldeploy.crdgen > crds/modeldeployment.yaml`"
    )


def test_committed_peering_crds_match():
    committed = (REPO / "crds" / "kopfpeering.yaml").read_text()
    assert committed == crdgen.render(peering=True)
    kinds = {d["spec"]["names"]["kind"] for d in yaml.safe_load_all(committed)}
    assert kinds == {"ClusterKopfPeering", "KopfPeering"}


def test_names_and_surface():
    crd = crdgen.modeldeployment_crd()
    assert crd["metadata"]["name"] == "modeldeployments.modeldeploy.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "ModelDeployment",
        "modeldeployments",
        ["md"],
        ["modeldeploy"],
    )
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["storage"] and version["served"]
    assert version["subresources"] == {
        "status": {},
        # what an HPA or a KEDA ScaledObject targets
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.servingReplicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    cols = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
    assert cols == ["Model", "Stable", "Canary", "Weight", "Phase", "Ready", "Age"]


def test_schema_is_structural():
    schema = crdgen.crd_schema()
    for path, node in walk(schema):
        assert "$ref" not in node and "title" not in node and "allOf" not in node, path
        assert "const" not in node and "nullable" not in node, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in {"object", "array", "string", "integer", "number", "boolean"}, path
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for req in node.get("required", []):
            assert req in node["properties"], (path, req)


def test_cel_cost_is_bounded():
    """Every list and map carries maxItems/maxProperties and every string under a list a maxLength,
    so the apiserver's CEL cost estimate stays finite."""
    for path, node in walk(crdgen.crd_schema()):
        if path in ("", ".metadata") or (path.startswith(".status") and node.get("type") == "object"):
            continue
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path
        if node.get("type") == "string" and "[]" in path and node.get("format") != "date-time":
            assert "maxLength" in node or "enum" in node, path


def test_defaults_are_present_and_valid_for_the_models():
    spec = crdgen.crd_schema()["properties"]["spec"]["properties"]
    assert spec["replicas"]["default"] == 1
    # whole objects: the apiserver checks a default against the CEL rules without filling nested defaults
    assert spec["rollout"]["default"]["trafficRouting"] == {"mode": "replicas"}
    assert spec["batching"]["default"]["maxTimeoutMs"] >= spec["batching"]["default"]["defaultTimeoutMs"]
    for name in ("resources", "batching", "rollout"):
        assert spec[name]["default"] == ModelDeploymentSpec.model_fields[name].default_factory().to_api()
    assert spec["rollout"]["properties"]["steps"]["default"] == [5, 25, 50, 100]
    # no default for buckets alone: the apiserver would refuse a spec that only lowers maxSequenceLength
    assert "default" not in spec["batching"]["properties"]["buckets"]
    assert spec["resources"]["properties"]["gpu"]["type"] == "integer"
    assert spec["resources"]["properties"]["gpu"]["minimum"] == 0
    assert spec["model"]["properties"]["format"]["enum"][0] == "auto"


def test_cel_rules_name_their_field():
    rules = []
    for path, node in walk(crdgen.crd_schema()):
        for r in node.get("x-kubernetes-validations", []):
            rules.append((path, r))
    texts = {r["rule"] for _, r in rules}
    assert "self.maxTimeoutMs >= self.defaultTimeoutMs" in texts
    assert "self.isSorted()" in texts
    assert "self[size(self) - 1] == 100" in texts
    for path, r in rules:
        assert r["message"], path
        assert (
            "fieldPath" in r
            or path.endswith(
                ("steps", "buckets", "interval", "sampleInterval", "timeout", "duration", "url", "[]")
            )
            or path == ""
        ), (
            path,
            r,
        )


def test_conditions_and_revisions_are_map_lists():
    status = crdgen.crd_schema()["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["revisions"]["x-kubernetes-list-map-keys"] == ["revision"]
    cond = status["conditions"]["items"]
    assert set(cond["required"]) == {"type", "status", "lastTransitionTime", "reason", "message"}


def test_status_holds_the_rollout_fields_of_progressive_delivery():
    status = crdgen.crd_schema()["properties"]["status"]["properties"]
    for f in (
        "phase",
        "stableRevision",
        "canaryRevision",
        "previousRevision",
        "canaryWeight",
        "step",
        "stepStartedAt",
        "conditions",
        "observedGeneration",
        "revisions",
        "analysis",
        "history",
    ):
        assert f in status, f
    rollout = crdgen.crd_schema()["properties"]["spec"]["properties"]["rollout"]["properties"]
    for f in ("steps", "interval", "trafficRouting", "analysis", "bakeTime", "keepPrevious", "paused"):
        assert f in rollout, f


def test_main_prints_the_crd(capsys):
    assert crdgen.main([]) == 0
    assert capsys.readouterr().out == crdgen.render()


#: the URLs the operator POSTs to: a webhook's, and each gate's
URL_FIELDS = (
    ".spec.rollout.notifications[].url",
    ".spec.rollout.gates.beforeFirstStep.url",
    ".spec.rollout.gates.beforePromotion.url",
)


def url_schemas() -> dict[str, dict[str, Any]]:
    nodes = dict(walk(crdgen.crd_schema()))
    return {path: nodes[path] for path in URL_FIELDS}


def test_the_crd_refuses_webhook_and_gate_urls_exactly_when_the_client_cannot_take_them():
    """The apiserver's pattern (RE2; explicit ASCII classes read alike by Python's re) refuses them, and a
    CEL rule of the URL library, whose message one can read, stands beside it (both checked against
    kube-apiserver 1.37's own validators when written)."""
    for path, node in url_schemas().items():
        for url in BAD_URLS:
            assert re.fullmatch(node["pattern"], url) is None, (path, url)
        for url in GOOD_URLS:
            assert re.fullmatch(node["pattern"], url), (path, url)
        (rule,) = node["x-kubernetes-validations"]
        assert "isURL(self)" in rule["rule"] and "int(url(self).getPort()) <= 65535" in rule["rule"], path
        assert rule["message"].endswith(
            "must be an http(s) URL with a host, no user info, and a port from 1 to 65535"
        )
    assert len({node["pattern"] for node in url_schemas().values()}) == 1


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.from_regex(url_schemas()[URL_FIELDS[0]]["pattern"], fullmatch=True))
def test_every_url_the_crd_admits_is_one_urllib_and_yarl_parse_with_a_host_and_a_port(url):
    """What the apiserver admits never raises where the operator reads it: urllib.parse (the host
    allow-list, status and logs) and yarl (aiohttp, which POSTs) take it, host and port."""
    parts, parsed = urlsplit(url), URL(url)
    assert parts.hostname and parsed.host, url
    assert parsed.port == (parts.port or {"http": 80, "https": 443}[parts.scheme]), url
    assert parsed.port is not None and 1 <= parsed.port <= 65535, url
    ModelDeploymentSpec.model_validate(
        {"model": {"name": "m", "uri": "file:///m"}, "rollout": {"notifications": [{"url": url}]}}
    )
