"""The pydantic API models: defaults, wire form, and the rules the CRD's CEL rules also enforce."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from md_cases import BAD_URLS, GOOD_URLS, invalid_manifests
from modeldeploy.api import HistoryEntry, ModelDeployment, ModelDeploymentSpec, parse_duration
from pydantic import ValidationError


def spec(**over):
    base = {"model": {"name": "minilm", "uri": "file:///m"}}
    base.update(over)
    return ModelDeploymentSpec.model_validate(base)


def test_defaults_fill_every_section():
    s = spec()
    assert s.replicas == 1
    assert s.image is None  # the operator's default, filled in when a live object is parsed
    assert s.resources.gpu == 0
    assert s.model.version == "1" and s.model.format == "auto"
    assert s.batching.buckets == [32, 64, 128, 256]
    assert s.batching.max_timeout_ms >= s.batching.default_timeout_ms
    assert s.rollout.steps == [5, 25, 50, 100]
    assert s.rollout.traffic_routing.mode == "replicas"
    assert s.rollout.analysis.on_no_data == "hold"
    assert s.rollout.keep_previous.replicas == 1
    assert s.rollout.paused is False


def test_wire_form_is_camel_case_and_round_trips():
    s = spec(
        rollout={"trafficRouting": {"mode": "gatewayAPI", "gatewayAPI": {"parentRefs": [{"name": "gw"}]}}}
    )
    wire = s.to_api()
    assert "maxBatchSize" in wire["batching"]
    assert wire["rollout"]["trafficRouting"]["gatewayAPI"]["parentRefs"][0]["name"] == "gw"
    assert ModelDeploymentSpec.model_validate(wire) == s


def test_python_names_are_accepted_too():
    s = ModelDeploymentSpec.model_validate(
        {"model": {"name": "m", "uri": "file:///m"}, "node_selector": {"a": "b"}}
    )
    assert s.node_selector == {"a": "b"}


# The Gateway API's duration format (GEP-2257): ^([0-9]{1,5}(h|m|s|ms)){1,4}$, parts add up.
@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1),
        ("0s", 0),
        ("500ms", 0.5),
        ("1m30s", 90),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1m500ms", 60.5),  # "1m" then "500ms", not "1ms"
        ("99999s", 99999),  # five digits
        ("1h1m1s1ms", 3661.001),  # four parts
        ("1s1s", 2),  # the format allows a unit twice; the parts add up
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1",
        "1d",
        "soon",
        "-1s",
        "1.5m",  # no fractions
        "100000s",  # six digits
        "1h1m1s1ms1s",  # five parts
        "1 s",
        " 1s",
        "1S",
        "1us",
        "1ns",
    ],
)
def test_parse_duration_refuses(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("text", ["1.5m", "100000s", "1h1m1s1ms1s", "1d"])
def test_the_crd_refuses_what_parse_duration_refuses(text):
    """The schema (and so the CRD) uses the same pattern: a spec field refuses the same strings."""
    from pydantic import ValidationError

    spec = {"model": {"name": "m", "uri": "file:///m"}, "rollout": {"interval": text}}
    with pytest.raises(ValidationError):
        ModelDeploymentSpec.model_validate(spec)
    spec["rollout"]["interval"] = "1m30s"
    assert ModelDeploymentSpec.model_validate(spec).rollout.interval == "1m30s"


def _path(field: str) -> list[str | int]:
    """``spec.rollout.steps[1]`` -> ``["spec", "rollout", "steps", 1]``."""
    out: list[str | int] = []
    for part in field.split("."):
        name, *idx = part.replace("]", "").split("[")
        out.append(name)
        out += [int(i) for i in idx]
    return out


def _names_the_field(error: dict[str, Any], field: str) -> bool:
    """The error is located at the field, or at an object holding it with a message naming it."""
    want = _path(field)
    loc = list(error["loc"])
    if loc == want:
        return True
    last_name = next(p for p in reversed(want) if isinstance(p, str))
    return want[: len(loc)] == loc and last_name in error["msg"]


@pytest.mark.parametrize(
    ("name", "manifest", "field", "mode"),
    [c for c in invalid_manifests() if c[3] == "refuse"],
    ids=[c[0] for c in invalid_manifests() if c[3] == "refuse"],
)
def test_models_refuse_every_invalid_manifest_naming_its_field(name, manifest, field, mode):
    """The same bad manifests the apiserver must refuse are refused by the models, and the error names
    the field the manifest's header expects."""
    with pytest.raises(ValidationError) as err:
        ModelDeployment.model_validate(manifest)
    errors = err.value.errors()
    assert any(_names_the_field(e, field) for e in errors), (field, errors)


def test_invalid_manifests_are_many_and_distinct():
    cases = invalid_manifests()
    assert len(cases) >= 12
    assert len({c[2] + repr(c[1]["spec"]) for c in cases}) == len(cases)


#: the good value of a field whose absence is the fault (or whose removal leaves a required field missing)
_REPAIRS: dict[str, Any] = {
    "spec.model.uri": "file:///models/minilm",
    "spec.model.handler": "handler.py:Model",
    "spec.rollout.trafficRouting.gatewayAPI": {"parentRefs": [{"name": "gw"}]},
    "spec.model.storage.secretRef.name": "s3-credentials",
    "spec.autoscaling.target": 0.8,
    "spec.rollout.notifications[0].url": "http://hooks.example.com:8080/rollouts",
    "spec.rollout.gates.beforeFirstStep.url": "https://gates.example.com/confirm",
}


def test_the_invalid_manifests_differ_from_a_valid_one_only_in_the_bad_part():
    """Each bad manifest becomes valid when the one field its header names is removed (or, where the
    field is required, set to a good value): nothing else in it is wrong."""
    for name, manifest, field, mode in invalid_manifests():
        if mode != "refuse":
            continue
        good = copy.deepcopy(manifest)
        *parents, last = _path(field)
        holder: Any = good
        for p in parents:
            holder = holder[p]
        if field in _REPAIRS:
            holder[last] = _REPAIRS[field]
        elif isinstance(last, int) or last in holder:
            del holder[last]
        else:
            raise AssertionError(f"{name}: {field} is absent and has no repair")
        try:
            ModelDeployment.model_validate(good)
        except ValidationError as e:
            raise AssertionError(f"{name}: still invalid without {field}: {e}") from e


def test_unset_buckets_are_the_defaults_that_fit_the_max_sequence_length():
    assert spec().batching.buckets == [32, 64, 128, 256]
    assert spec(batching={"maxSequenceLength": 512}).batching.buckets == [32, 64, 128, 256]
    # lowering maxSequenceLength alone is valid: no bucket the author never wrote is refused
    assert spec(batching={"maxSequenceLength": 128}).batching.buckets == [32, 64, 128]
    assert spec(batching={"maxSequenceLength": 100}).batching.buckets == [32, 64]
    # buckets the author wrote are checked as written
    with pytest.raises(ValidationError, match=r"spec\.batching\.buckets"):
        spec(batching={"maxSequenceLength": 128, "buckets": [64, 256]})
    assert spec(batching={"buckets": []}).batching.buckets == []  # empty: derived by the server


def test_gpu_must_be_an_integer_even_from_python():
    with pytest.raises(ValidationError):
        spec(resources={"gpu": 1.0})
    assert spec(resources={"gpu": 2}).resources.gpu == 2


@pytest.mark.parametrize("q", ["500m", "2", 2, "1.5Gi", "512Mi", "1e3"])
def test_quantities(q):
    assert spec(resources={"cpu": q}).resources.cpu == q


def test_from_api_tolerates_missing_or_null_status(md_body):
    md_body["status"] = None
    md = ModelDeployment.from_api(md_body)
    assert md.status.conditions == []
    assert md.name == "minilm" and md.namespace == "default" and md.uid == "md-uid-1"


def _live(spec_body: dict) -> dict:
    return {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": spec_body,
    }


def test_an_unset_image_is_the_operators_default_and_part_of_the_revision(monkeypatch):
    from modeldeploy import builders
    from modeldeploy.api import ModelDeployment

    body = {"model": {"name": "minilm", "uri": "file:///m"}}
    monkeypatch.delenv("MODELDEPLOY_DEFAULT_IMAGE", raising=False)
    plain = ModelDeployment.from_api(_live(body))
    assert plain.spec.image == "modeldeploy/modelserver:dev"
    explicit = ModelDeployment.from_api(_live({**body, "image": "modeldeploy/modelserver:dev"}))
    assert builders.revision_spec(plain.spec) == builders.revision_spec(explicit.spec)
    monkeypatch.setenv("MODELDEPLOY_DEFAULT_IMAGE", "registry.example/modelserver:2.0")
    other = ModelDeployment.from_api(_live(body))
    assert other.spec.image == "registry.example/modelserver:2.0"
    assert builders.revision_spec(other.spec) != builders.revision_spec(plain.spec)
    pinned = ModelDeployment.from_api(_live({**body, "image": "mine:1"}))
    assert pinned.spec.image == "mine:1"  # an explicit image always wins


@pytest.mark.parametrize(
    "outcome", ["Deployed", "Promoted", "RolledBack", "Aborted", "Superseded", "FailedBack"]
)
def test_a_history_entry_without_kind_is_read_as_its_outcome(outcome):
    # written by an operator that predates HistoryEntry.kind
    h = HistoryEntry.model_validate({"revision": "abc", "outcome": outcome, "time": "2026-01-01T00:00:00Z"})
    assert h.kind == outcome
    assert h.to_api()["kind"] == outcome


def test_a_history_entry_keeps_its_kind_and_an_expired_one_has_none():
    wire = {"revision": "abc", "outcome": "Promoted", "kind": "Deployed", "time": "2026-01-01T00:00:00Z"}
    assert HistoryEntry.model_validate(wire).kind == "Deployed"
    expired = HistoryEntry.model_validate(
        {"revision": "abc", "outcome": "Expired", "time": "2026-01-01T00:00:00Z"}
    )
    assert expired.kind is None and "kind" not in expired.to_api()
    with pytest.raises(ValidationError):
        HistoryEntry.model_validate({**wire, "kind": "Expired"})


def _with_urls(url: str) -> dict[str, Any]:
    return {
        "model": {"name": "m", "uri": "file:///m"},
        "rollout": {"notifications": [{"url": url}], "gates": {"beforePromotion": {"url": url}}},
    }


def test_webhook_and_gate_urls_are_refused_naming_the_field_exactly_when_the_client_cannot_take_them():
    for url in BAD_URLS:
        with pytest.raises(ValidationError) as err:
            ModelDeploymentSpec.model_validate(_with_urls(url))
        errors = err.value.errors()
        assert {tuple(e["loc"]) for e in errors} == {
            ("rollout", "notifications", 0, "url"),
            ("rollout", "gates", "beforePromotion", "url"),
        }, url
        assert all("must be an http(s) URL" in e["msg"] for e in errors), errors
    for url in GOOD_URLS:
        assert ModelDeploymentSpec.model_validate(_with_urls(url)).rollout.notifications[0].url == url
