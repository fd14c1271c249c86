"""The OpenAPI 3.0 document of the server (served at ``/openapi.json``, fuzzed by the tests)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import __version__

if TYPE_CHECKING:
    from .service import ModelService

DATATYPES = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BYTES",
]


def _err(desc: str) -> dict[str, Any]:
    return {
        "description": desc,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }


def _ok(desc: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": desc, "content": {"application/json": {"schema": schema}}}


def openapi_document(service: ModelService | None = None) -> dict[str, Any]:
    name = service.name if service else "model"
    version = service.version if service else "1"
    model_param = {
        "name": "model_name",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "example": name,
    }
    version_param = {
        "name": "model_version",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "example": version,
    }
    rid_header = {
        "name": "X-Request-ID",
        "in": "header",
        "required": False,
        "schema": {"type": "string", "maxLength": 128},
    }
    infer_responses = {
        "200": _ok("Inference result", {"$ref": "#/components/schemas/InferResponse"}),
        "400": _err("Invalid input"),
        "404": _err("Unknown model or version"),
        "413": _err("Input longer than the maximum sequence length, or body too large"),
        "415": _err("Unsupported content encoding"),
        "429": _err("The deadline cannot be met (Retry-After)"),
        "500": _err("The model failed on this input"),
        "503": _err("Queue full, not ready, or draining (Retry-After)"),
        "504": _err("The deadline expired while queued"),
    }
    infer_op = {
        "summary": "Run inference",
        "parameters": [rid_header],
        "responses": infer_responses,
    }
    meta_responses = {
        "200": _ok("Model metadata", {"$ref": "#/components/schemas/ModelMetadata"}),
        "404": _err("Unknown model or version"),
        "503": _err("Model not loaded yet"),
    }
    ready_responses = {
        "200": _ok("Ready", {"type": "object"}),
        "404": _err("Unknown model or version"),
        "503": _ok("Not ready", {"type": "object"}),
    }
    paths: dict[str, Any] = {
        "/v2/health/live": {
            "get": {"summary": "Liveness", "responses": {"200": _ok("Live", {"type": "object"})}}
        },
        "/v2/health/ready": {
            "get": {
                "summary": "Readiness",
                "responses": {
                    "200": _ok("Ready", {"type": "object"}),
                    "503": _ok("Not ready", {"type": "object"}),
                },
            }
        },
        "/v2": {
            "get": {
                "summary": "Server metadata",
                "responses": {"200": _ok("Server metadata", {"$ref": "#/components/schemas/ServerMetadata"})},
            }
        },
        "/v2/models/{model_name}": {
            "get": {"summary": "Model metadata", "parameters": [model_param], "responses": meta_responses}
        },
        "/v2/models/{model_name}/ready": {
            "get": {"summary": "Model readiness", "parameters": [model_param], "responses": ready_responses}
        },
        "/v2/models/{model_name}/infer": {"post": {**infer_op, "parameters": [model_param, rid_header]}},
        "/v2/models/{model_name}/config": {
            "get": {
                "summary": "Triton-style model configuration",
                "parameters": [model_param],
                "responses": {
                    "200": _ok("Model configuration", {"type": "object"}),
                    "404": _err("Unknown model"),
                },
            }
        },
        "/v2/models/{model_name}/stats": {
            "get": {
                "summary": "Batching state: queue depth, buckets, token budget, cost model",
                "parameters": [model_param],
                "responses": {"200": _ok("Statistics", {"type": "object"}), "404": _err("Unknown model")},
            }
        },
        "/v2/models/{model_name}/versions/{model_version}": {
            "get": {
                "summary": "Model version metadata",
                "parameters": [model_param, version_param],
                "responses": meta_responses,
            }
        },
        "/v2/models/{model_name}/versions/{model_version}/ready": {
            "get": {
                "summary": "Model version readiness",
                "parameters": [model_param, version_param],
                "responses": ready_responses,
            }
        },
        "/v2/models/{model_name}/versions/{model_version}/infer": {
            "post": {**infer_op, "parameters": [model_param, version_param, rid_header]}
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {
                    "200": {
                        "description": "Prometheus text format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
    tensor_in = {
        "type": "object",
        "required": ["name", "shape", "datatype", "data"],
        "properties": {
            "name": {"type": "string"},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": {"type": "string", "enum": DATATYPES},
            "parameters": {"type": "object"},
            "data": {"type": "array"},
        },
    }
    request_output = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "parameters": {"type": "object"}},
    }
    schemas: dict[str, Any] = {
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "TensorMetadata": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {
                "name": {"type": "string"},
                "datatype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
            },
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/TensorMetadata"}},
                "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/TensorMetadata"}},
            },
        },
        "RequestInput": tensor_in,
        "RequestOutput": request_output,
        "InferRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": {
                    "type": "object",
                    "properties": {
                        "priority": {"type": "integer", "minimum": 0},
                        "timeout_ms": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                        "binary_data_output": {"type": "boolean"},
                    },
                },
                "inputs": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"$ref": "#/components/schemas/RequestInput"},
                },
                "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/RequestOutput"}},
            },
        },
        "InferResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "outputs": {"type": "array", "items": {"type": "object"}},
            },
        },
    }
    # The request body is inlined (schemathesis cannot generate from a top-level $ref here).
    for p in ("/v2/models/{model_name}/infer", "/v2/models/{model_name}/versions/{model_version}/infer"):
        paths[p]["post"]["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schemas["InferRequest"]}},
        }
    return {
        "openapi": "3.0.3",
        "info": {"title": "modelserver (Open Inference Protocol v2)", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }
