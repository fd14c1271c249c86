"""Open Inference Protocol v2 (KServe / Triton): its documents as pydantic models, and the request decoder
and response encoder the infer route uses.

The models describe the protocol in the OpenAPI document FastAPI generates (``/openapi.json``); the infer
route does not validate with them per request: :func:`decode_request` parses the body straight into numpy
arrays and :func:`encode_response` writes the answer with orjson.

Supports JSON tensors and Triton's binary tensor data extension: a request whose header
``Inference-Header-Content-Length`` is N carries N bytes of JSON followed by the raw bytes of every input that
has ``parameters.binary_data_size``; outputs requested with ``parameters.binary_data`` (or the request
parameter ``binary_data_output``) are returned the same way. BYTES tensors in binary form are a sequence of
4-byte little-endian lengths each followed by that many bytes.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt
from pydantic.json_schema import SkipJsonSchema

from .errors import InvalidInput
from .models.base import DTYPES, TensorSpec, datatype_of

# -- the protocol's documents (OpenAPI only; never validated per request) ------------------------------------

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
    "BYTES",
]  # fmt: skip


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def optional(description: str | None = None, **constraints: Any) -> Any:
    """A field that may be left out (documented without a ``null`` default)."""
    return Field(None, description=description, json_schema_extra=_no_default, **constraints)


#: free-form parameters (an object; may be left out)
Parameters = dict[str, Any] | SkipJsonSchema[None]


class RequestInput(BaseModel):
    """One input tensor: `data` flat or nested in row-major order, or `parameters.binary_data_size` bytes of
    the body's binary part (binary tensor extension)."""

    name: str
    shape: list[NonNegativeInt]
    datatype: Datatype
    parameters: Parameters = optional()
    data: list[Any]


class RequestOutput(BaseModel):
    """A requested output (`parameters.binary_data`: answer it as binary data)."""

    name: str
    parameters: Parameters = optional()


class InferenceParameters(BaseModel):
    """Request parameters: the server's own, and any others (ignored)."""

    model_config = ConfigDict(extra="allow")

    priority: NonNegativeInt | SkipJsonSchema[None] = optional("0 = the server's default; 1 is the highest")
    timeout_ms: float | SkipJsonSchema[None] = optional(
        "deadline in milliseconds (capped by the server)", gt=0
    )
    binary_data_output: bool | SkipJsonSchema[None] = optional("every output as binary data")


class InferenceRequest(BaseModel):
    """The inference request (`$inference_request`)."""

    id: str | SkipJsonSchema[None] = optional()
    parameters: InferenceParameters | SkipJsonSchema[None] = optional()
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | SkipJsonSchema[None] = optional("the outputs to answer, in this order")


class ResponseOutput(BaseModel):
    """One output tensor: `data` (flat, row-major) or `parameters.binary_data_size` binary bytes."""

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: Parameters = optional()
    data: list[Any] | SkipJsonSchema[None] = optional()


class InferenceResponse(BaseModel):
    """The inference response (`$inference_response`); with binary outputs the body is this JSON followed by
    their bytes, and `Inference-Header-Content-Length` is the JSON's length."""

    model_name: str
    model_version: str
    id: str | SkipJsonSchema[None] = optional()
    outputs: list[ResponseOutput]


class MetadataTensor(BaseModel):
    """A tensor of the model (`$metadata_tensor`): -1 is a variable dimension; the first is the batch."""

    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadataResponse(BaseModel):
    """The model's metadata (`$metadata_model_response`)."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]
    parameters: dict[str, str | int | float | bool]


class ServerMetadataResponse(BaseModel):
    """The server's metadata (`$metadata_server_response`)."""

    name: str
    version: str
    extensions: list[str]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool
    error: str | SkipJsonSchema[None] = optional()


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool
    error: str | SkipJsonSchema[None] = optional()


class ModelStatistics(BaseModel):
    """The batching state (not part of the protocol)."""

    model: str
    version: str
    state: str
    queue_depth: int
    buckets: list[int]
    token_budget: int
    cost_model: list[float]
    batches: int
    cache_entries: int


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer."""

    error: str


# -- the infer route's decoder and encoder -------------------------------------------------------------------

MAX_PRIORITY = 1 << 16


@dataclass
class InferRequest:
    inputs: dict[str, np.ndarray]
    id: str | None = None
    priority: int = 0  # 0 = the server's default
    timeout_ms: float | None = None
    outputs: list[str] | None = None  # requested output names (None = all)
    binary_outputs: set[str] = field(default_factory=set)
    binary_all: bool = False


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise InvalidInput("'data' must be a list")
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []
    stack: list[Any] = [iter(data)]
    while stack:
        for x in stack[-1]:
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def _decode_bytes_binary(raw: bytes, count: int, name: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    off, n = 0, len(raw)
    for i in range(count):
        if off + 4 > n:
            raise InvalidInput(f"input '{name}': binary BYTES data is truncated")
        (ln,) = struct.unpack_from("<I", raw, off)
        off += 4
        if off + ln > n:
            raise InvalidInput(f"input '{name}': binary BYTES data is truncated")
        b = raw[off : off + ln]
        off += ln
        try:
            out[i] = b.decode("utf-8")
        except UnicodeDecodeError:
            out[i] = b
    if off != n:
        raise InvalidInput(f"input '{name}': binary BYTES data has {n - off} extra bytes")
    return out


def _number(value: Any, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInput(f"parameter '{what}' must be a number")
    if not math.isfinite(value):
        raise InvalidInput(f"parameter '{what}' must be finite")
    return float(value)


def _binary_tensor(raw: bytes, dt: str, shape: list[int], what: str, name: str) -> np.ndarray:
    """The flat array of one tensor sent as binary data (Triton's binary tensor extension)."""
    count = math.prod(shape)
    if dt == "BYTES":
        return _decode_bytes_binary(raw, count, name)
    dtype = np.dtype(DTYPES[dt]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(f"{what}: {len(raw)} bytes do not match shape {shape} of {dt}")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="), copy=False)


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary tensor data after it (``Inference-Header-Content-Length``)."""
    if header_length is None:
        return body, b""
    try:
        hl = int(header_length)
    except ValueError:
        raise InvalidInput("Inference-Header-Content-Length must be an integer") from None
    if not 0 <= hl <= len(body):
        raise InvalidInput("Inference-Header-Content-Length is larger than the body")
    return body[:hl], body[hl:]


def _json_tensor(flat: list[Any], dt: str, count: int, what: str, *, strict: bool) -> np.ndarray:
    """The flat array of one tensor's JSON ``data``. ``strict`` (a request): each value must be of the
    datatype's JSON type and BYTES stay strings; else (a response) BYTES become bytes."""
    if dt == "BYTES":
        if strict and not all(isinstance(v, str) for v in flat):
            raise InvalidInput(f"{what}: BYTES data must be strings")
        arr = np.empty(count, dtype=object)
        arr[:] = flat if strict else [v.encode("utf-8") if isinstance(v, str) else v for v in flat]
        return arr
    if strict:
        kinds: tuple[type, ...] = (int,) if dt.startswith(("INT", "UINT")) else (int, float)
        if dt == "BOOL":
            kinds = (bool,)
        if not all(isinstance(v, kinds) and (dt == "BOOL" or not isinstance(v, bool)) for v in flat):
            raise InvalidInput(f"{what}: {dt} data must be {'integers' if kinds == (int,) else 'numbers'}")
    try:
        return np.asarray(flat, dtype=DTYPES[dt])
    except (ValueError, TypeError, OverflowError) as e:
        raise InvalidInput(
            f"{what}: cannot convert data to {dt}: {e}" if strict else f"{what}: {e}"
        ) from None


def decode_tensor(
    t: dict[str, Any], dt: str, shape: list[int], binary: bytes, offset: int, *, strict: bool
) -> tuple[np.ndarray, int]:
    """One tensor of a request (``strict``) or a response: from the binary data at ``offset`` when it
    says ``binary_data_size``, else from its JSON ``data``. Returns the array, shaped, and the offset
    after it."""
    name = t["name"]
    what = f"{'input' if strict else 'output'} '{name}'"
    count = math.prod(shape)
    size = (t.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if strict and (isinstance(size, bool) or not isinstance(size, int) or size < 0):
            raise InvalidInput(f"{what}: binary_data_size must be a non-negative integer")
        if not isinstance(size, int) or size < 0 or offset + size > len(binary):
            raise InvalidInput(f"{what}: binary data is shorter than binary_data_size")
        raw = binary[offset : offset + size]
        return _binary_tensor(raw, dt, shape, what, name).reshape(shape), offset + size
    if strict and "data" not in t:
        raise InvalidInput(f"{what} has no 'data'")
    flat = _flatten(t.get("data"))
    if len(flat) != count:
        raise InvalidInput(f"{what}: {len(flat)} values do not match shape {shape}")
    return _json_tensor(flat, dt, count, what, strict=strict).reshape(shape), offset


def _request_parameters(doc: dict[str, Any], req: InferRequest) -> None:
    """The request's id and parameters (priority, timeout, binary_data_output) into ``req``."""
    rid = doc.get("id")
    if rid is not None:
        if not isinstance(rid, str):
            raise InvalidInput("'id' must be a string")
        req.id = rid
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise InvalidInput("'parameters' must be an object")
    if "priority" in params:
        p = params["priority"]
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= MAX_PRIORITY:
            raise InvalidInput("parameter 'priority' must be a non-negative integer")
        req.priority = p
    if "timeout_ms" in params:
        req.timeout_ms = _number(params["timeout_ms"], "", "timeout_ms")
    elif "timeout" in params:  # Triton: microseconds
        req.timeout_ms = _number(params["timeout"], "", "timeout") / 1000.0
    if req.timeout_ms is not None and req.timeout_ms <= 0:
        raise InvalidInput("the timeout must be > 0")
    bdo = params.get("binary_data_output", False)
    if not isinstance(bdo, bool):
        raise InvalidInput("parameter 'binary_data_output' must be a boolean")
    req.binary_all = bdo


def _input_header(
    inp: Any, seen: dict[str, np.ndarray], specs: dict[str, TensorSpec]
) -> tuple[str, list[int]]:
    """One input's checked datatype and shape (its name known, not given twice, of the model's type)."""
    if not isinstance(inp, dict):
        raise InvalidInput("each input must be an object")
    name = inp.get("name")
    if not isinstance(name, str):
        raise InvalidInput("each input needs a string 'name'")
    if name in seen:
        raise InvalidInput(f"input '{name}' given twice")
    spec = specs.get(name)
    if spec is None:
        raise InvalidInput(f"unknown input '{name}'; the model takes {sorted(specs)}")
    dt = inp.get("datatype")
    if dt not in DTYPES:
        raise InvalidInput(f"input '{name}': unknown datatype {dt!r}")
    if dt != spec.datatype:
        raise InvalidInput(f"input '{name}' must have datatype {spec.datatype}, got {dt}")
    shape = inp.get("shape")
    if (
        not isinstance(shape, list)
        or not shape
        or any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape)
    ):
        raise InvalidInput(f"input '{name}': 'shape' must be a non-empty list of non-negative integers")
    count = math.prod(shape)
    if count > 1 << 26:
        raise InvalidInput(f"input '{name}' is too large ({count} elements)")
    if not isinstance(inp.get("parameters") or {}, dict):
        raise InvalidInput(f"input '{name}': 'parameters' must be an object")
    return dt, shape


def _requested_outputs(doc: dict[str, Any], req: InferRequest) -> None:
    outs = doc.get("outputs")
    if outs is None:
        return
    if not isinstance(outs, list):
        raise InvalidInput("'outputs' must be a list")
    req.outputs = []
    for o in outs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidInput("each requested output needs a string 'name'")
        req.outputs.append(o["name"])
        op = o.get("parameters") or {}
        if not isinstance(op, dict):
            raise InvalidInput("output 'parameters' must be an object")
        bd = op.get("binary_data", False)
        if not isinstance(bd, bool):
            raise InvalidInput("output parameter 'binary_data' must be a boolean")
        if bd:
            req.binary_outputs.add(o["name"])


def decode_request(body: bytes, header_length: str | None, specs: dict[str, TensorSpec]) -> InferRequest:
    """Parse and validate an infer request against the model's input specs."""
    body, binary = split_body(body, header_length)
    if not body:
        raise InvalidInput("empty request body")
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object")
    req = InferRequest(inputs={})
    _request_parameters(doc, req)
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidInput("'inputs' must be a non-empty list")
    offset = 0
    for inp in inputs:
        dt, shape = _input_header(inp, req.inputs, specs)
        req.inputs[inp["name"]], offset = decode_tensor(inp, dt, shape, binary, offset, strict=True)
    if offset != len(binary):
        raise InvalidInput("the request has binary data not claimed by any input")
    _requested_outputs(doc, req)
    return req


def _bytes_element(v: Any) -> bytes:
    if isinstance(v, bytes):
        return v
    return str(v).encode("utf-8")


def _json_data(arr: np.ndarray) -> Any:
    if arr.dtype == np.object_:
        return [
            v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1).tolist()
        ]
    return arr.reshape(-1)


def encode_response(
    model_name: str,
    model_version: str,
    req: InferRequest,
    outputs: dict[str, np.ndarray],
) -> tuple[bytes, int | None]:
    """Response body, and the JSON header length when binary data is appended (else None)."""
    names = req.outputs if req.outputs is not None else list(outputs)
    out_docs = []
    blobs: list[bytes] = []
    for name in names:
        arr = outputs[name]
        doc: dict[str, Any] = {"name": name, "datatype": datatype_of(arr), "shape": list(arr.shape)}
        if req.binary_all or name in req.binary_outputs:
            if arr.dtype == np.object_:
                parts = []
                for v in arr.reshape(-1).tolist():
                    b = _bytes_element(v)
                    parts.append(struct.pack("<I", len(b)))
                    parts.append(b)
                blob = b"".join(parts)
            else:
                blob = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            doc["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            doc["data"] = _json_data(arr)
        out_docs.append(doc)
    resp: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": out_docs}
    if req.id is not None:
        resp["id"] = req.id
    header = orjson.dumps(resp, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return header + b"".join(blobs), len(header)


def decode_response(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """The outputs of an infer response (JSON or binary tensor data), as numpy arrays.

    Used by the shadow mirror to read the shadow revision's answer; raises :class:`InvalidInput` on a
    response it cannot read (the mirror counts that as the shadow's error).
    """
    body, binary = split_body(body, header_length)
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise InvalidInput(f"malformed JSON response: {e}") from None
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if not isinstance(outputs, list):
        raise InvalidInput("the response has no 'outputs' list")
    out: dict[str, np.ndarray] = {}
    offset = 0
    for o in outputs:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise InvalidInput("each output needs a string 'name'")
        name, dt, shape = o["name"], o.get("datatype"), o.get("shape")
        if dt not in DTYPES or not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise InvalidInput(f"output '{name}': bad datatype or shape")
        out[name], offset = decode_tensor(o, dt, shape, binary, offset, strict=False)
    return out
