"""Generate the CRDs from the pydantic models (the single source of truth).

    python -m modeldeploy.crdgen > crds/modeldeployment.yaml
    python -m modeldeploy.crdgen --peering > crds/kopfpeering.yaml

The pydantic JSON schema (draft 2020-12) is converted into a Kubernetes *structural* schema:
``$ref`` inlined, ``Optional[X]`` reduced to ``X`` (absent rather than null), ``int | str`` turned into
``x-kubernetes-int-or-string``, numeric ``exclusiveMinimum`` into the OpenAPI v3.0 boolean form, titles
dropped, and the ``x-kubernetes-*`` extensions carried over from ``json_schema_extra``.
A unit test fails when the committed YAML differs from what this module prints.
"""

from __future__ import annotations

import argparse
import copy
import sys
from typing import Any

import yaml

from . import api

_KEEP = {
    "type",
    "description",
    "default",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "items",
    "properties",
    "required",
    "additionalProperties",
    "nullable",
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        target = copy.deepcopy(defs[name])
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**target, **siblings}
    return node


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        inner = _resolve(node["allOf"][0], defs)
        node = {**inner, **{k: v for k, v in node.items() if k != "allOf"}}
    if "anyOf" in node:
        options = [_resolve(o, defs) for o in node["anyOf"]]
        non_null = [o for o in options if o.get("type") != "null"]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if rest.get("default", 0) is None:
            del rest["default"]
        types = sorted(o.get("type", "") for o in non_null)
        if len(non_null) == 1:
            node = {**non_null[0], **rest}
            if "anyOf" in node:  # Optional[int | str], e.g. an optional Quantity
                return _convert(node, defs)
        elif types == ["integer", "string"]:
            # the form controller-gen emits for resource.Quantity / IntOrString
            node = {**rest, "x-kubernetes-int-or-string": True}
            return {
                **{k: v for k, v in node.items() if k in _KEEP or k.startswith("x-kubernetes-")},
                "anyOf": [{"type": "integer"}, {"type": "string"}],
            }
        else:  # pragma: no cover - guarded by the drift test
            raise ValueError(f"cannot express anyOf {types} in a structural schema")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-"):
            out[key] = value
        elif key not in _KEEP:
            continue
        elif key == "properties":
            out[key] = {k: _convert(v, defs) for k, v in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out[key] = _convert(value, defs)
        elif key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"] = value
            out["exclusiveMinimum"] = True
        elif key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"] = value
            out["exclusiveMaximum"] = True
        else:
            out[key] = value
    if "properties" in out:
        out["type"] = "object"
        out.pop("additionalProperties", None)
    if out.get("type") == "string" and out.get("format") == "date-time":
        out.pop("pattern", None)
    if "required" in out and not out["required"]:
        del out["required"]
    return out


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def model_schema(model: type[api.BaseModel]) -> dict[str, Any]:
    """The structural OpenAPI v3 schema of a pydantic model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _convert(raw, defs)


def crd_schema() -> dict[str, Any]:
    spec = model_schema(api.ModelDeploymentSpec)
    status = model_schema(api.ModelDeploymentStatus)
    return {
        "type": "object",
        "description": "A model served by the modelserver inference server, rolled out progressively.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {api.MAX_NAME_LENGTH}",
                "message": f"metadata.name must be at most {api.MAX_NAME_LENGTH} characters "
                "(it prefixes the per-revision Service names)",
                "reason": "FieldValueInvalid",
            },
            {
                # a generation server compares answers (modelserver.gen_shadow), an encoder tensors
                "rule": "!(has(self.spec.rollout) && has(self.spec.rollout.shadow)"
                " && has(self.spec.rollout.shadow.compare) && has(self.spec.rollout.shadow.compare.method)"
                " && has(self.spec.model.task) && self.spec.model.task == 'generation')"
                " || self.spec.rollout.shadow.compare.method in " + _cel_list(api.GENERATION_COMPARE_METHODS),
                "message": "spec.rollout.shadow.compare.method: cosine, argmax and allclose compare tensors; "
                + api.GEN_COMPARE_HINT,
                "reason": "FieldValueForbidden",
            },
            {
                "rule": "!(has(self.spec.rollout) && has(self.spec.rollout.shadow)"
                " && has(self.spec.rollout.shadow.compare) && has(self.spec.rollout.shadow.compare.method)"
                " && self.spec.rollout.shadow.compare.method == 'tokenAgreement')"
                " || (has(self.spec.model.task) && self.spec.model.task == 'generation')",
                "message": "spec.rollout.shadow.compare.method: tokenAgreement only for spec.model.task "
                "generation",
                "reason": "FieldValueForbidden",
            },
            {
                "rule": "!(has(self.spec.autoscaling) && has(self.spec.autoscaling.metric)"
                " && self.spec.autoscaling.metric in " + _cel_list(api.ENCODER_AUTOSCALING_METRICS) + ")"
                " || !has(self.spec.model.task) || self.spec.model.task != 'generation'",
                "message": "spec.autoscaling.metric: queueWaitP90 and queueDepth are an encoder's batching "
                "queue; " + api.GEN_METRICS_HINT,
                "reason": "FieldValueForbidden",
            },
            {
                "rule": "!(has(self.spec.autoscaling) && has(self.spec.autoscaling.metric)"
                " && self.spec.autoscaling.metric in " + _cel_list(api.GENERATION_AUTOSCALING_METRICS) + ")"
                " || (has(self.spec.model.task) && self.spec.model.task == 'generation')",
                "message": "spec.autoscaling.metric: waitingSequences and kvCacheUsage only for "
                "spec.model.task generation",
                "reason": "FieldValueForbidden",
            },
            {
                "rule": "!has(self.spec.generation) || (has(self.spec.model.task)"
                " && self.spec.model.task == 'generation')",
                "message": "spec.generation: only for spec.model.task generation",
                "reason": "FieldValueForbidden",
            },
        ],
    }


PRINTER_COLUMNS = [
    {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
    {"name": "Version", "type": "string", "jsonPath": ".spec.model.version", "priority": 1},
    {"name": "Stable", "type": "string", "jsonPath": ".status.stableRevision"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canaryRevision"},
    {"name": "Weight", "type": "integer", "jsonPath": ".status.canaryWeight"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def modeldeployment_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "modeldeploy", "app.kubernetes.io/part-of": "modeldeploy"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": list(api.CATEGORIES),
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {
                        "status": {},
                        # HPAs and KEDA ScaledObjects target the ModelDeployment itself
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.servingReplicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": crd_schema()},
                }
            ],
        },
    }


def _peering_crd(kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.kopf.dev"},
        "spec": {
            "scope": scope,
            "group": "kopf.dev",
            "names": {"kind": kind, "plural": plural, "singular": plural[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "kopf's peering: which operator replicas are alive "
                            "(keys: identities; values: priority, lifetime, lastseen).",
                            "properties": {
                                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                            },
                        }
                    },
                }
            ],
        },
    }


def peering_crds() -> list[dict[str, Any]]:
    """kopf's peering CRDs (cluster-wide and namespaced), needed for operator replicas to coordinate."""
    return [
        _peering_crd("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        _peering_crd("KopfPeering", "kopfpeerings", "Namespaced"),
    ]


HEADER = (
    "# Generated by `python -m modeldeploy.crdgen{args}` from operator/modeldeploy/api.py. Do not edit.\n"
)


def render(peering: bool = False) -> str:
    if peering:
        docs = peering_crds()
        return HEADER.format(args=" --peering") + yaml.safe_dump_all(docs, sort_keys=False, width=110)
    return HEADER.format(args="") + yaml.safe_dump(modeldeployment_crd(), sort_keys=False, width=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peering", action="store_true", help="print kopf's peering CRDs instead")
    args = parser.parse_args(argv)
    sys.stdout.write(render(peering=args.peering))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
