"""HTTP: the Open Inference Protocol v2 REST API on FastAPI (served by uvicorn, see server.py).

FastAPI routes the requests, generates the OpenAPI document (``/openapi.json``) from the pydantic models of
:mod:`modelserver.protocol`, and its exception handlers turn every error into ``{"error": "..."}`` (4xx for
bad input, 503 + ``Retry-After`` on overload). The infer routes are raw (:class:`RawRoute`): FastAPI
documents them, Starlette hands them the ``Request`` and sends the ``Response`` they return, and the body
is decoded and the answer encoded by :mod:`modelserver.protocol` with orjson -- no dependency solving and no
model validation per request (server CPU target: <= 200 us per request, ``bench/serving_cpu.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from fastapi.routing import APIRoute
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import __version__
from . import gen_openai as oa
from . import openai_embeddings as oai_emb
from .batching import BatchingError
from .door import EMBEDDINGS_PATH, MAX_BODY, RID_OK, Door, arrival, drain_body, is_infer, request_id
from .errors import (
    InvalidInput,
    NotFound,
    NotReady,
    PayloadTooLarge,
    ServerError,
    UnsupportedEncoding,
)
from .infer_route import TARGET as INFER_TARGET
from .infer_route import InferRoute, infer_target
from .inflate import ENCODINGS, inflate
from .logs import request_id_var
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .protocol import (
    ErrorResponse,
    InferenceRequest,
    InferenceResponse,
    LiveResponse,
    ModelMetadataResponse,
    ModelReadyResponse,
    ModelStatistics,
    ReadyResponse,
    ServerMetadataResponse,
    decode_request,
    encode_response,
)
from .service import ModelService
from .shadow import ShadowMirror

log = logging.getLogger("modelserver.http")

JSON = "application/json"

#: the revision this server belongs to (the operator sets MODELDEPLOY_REVISION on the server container),
#: sent back on every response so a client behind a Service or a gateway can tell who answered
REVISION_HEADER = b"x-modeldeploy-revision"


def json_response(status: int, doc: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers, JSON)


def _retry_headers(retry_after: float | None) -> dict[str, str] | None:
    return None if retry_after is None else {"retry-after": str(max(1, math.ceil(retry_after)))}


def error_response(status: int, message: str, retry_after: float | None = None) -> Response:
    return json_response(status, {"error": message}, _retry_headers(retry_after))


# -- the {"error": ...} contract: FastAPI's exception handlers -----------------------------------------------


def _openai_route(request: Request) -> bool:
    """Whether the refusal answers an OpenAI route (``/v1/...``), whose clients read OpenAI's error
    shape (modelserver.gen_openai.error_fields); the OIP routes keep ``{"error": "..."}``."""
    return str(request.scope.get("path", "")).startswith("/v1/")


async def _server_error(request: Request, exc: ServerError | BatchingError) -> Response:
    """A :class:`ServerError` or a :class:`BatchingError`: its status, ``Retry-After`` on 429, 503 and 504."""
    retry_after = exc.retry_after if exc.status in (429, 503, 504) else None
    if _openai_route(request):
        param = oa.param_of(exc) if isinstance(exc, ServerError) else None
        doc = oa.error_fields(exc.status, str(exc), param, getattr(exc, "code", None) or exc.reason)
        return json_response(exc.status, doc, _retry_headers(retry_after))
    return error_response(exc.status, str(exc), retry_after)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    """Routing's own errors: no route (404), a wrong method (405, with ``Allow``)."""
    method, path = request.scope["method"], request.scope["path"]
    if exc.status_code == 404:
        message = f"no route for {method} {path}"
    elif exc.status_code == 405:
        message = "use POST for infer" if path.endswith("/infer") else f"method {method} not allowed"
    else:
        message = str(exc.detail)
    doc = oa.error_fields(exc.status_code, message) if _openai_route(request) else {"error": message}
    return json_response(exc.status_code, doc, exc.headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """A parameter FastAPI validated and refused: 400 with ``{"error": ...}`` like every other bad input,
    not FastAPI's 422 ``{"detail": ...}``. No route declares such a parameter today (the infer routes are
    raw, every path parameter a string); this keeps the error contract for the first one that does
    (unit test ``test_a_parameter_fastapi_refuses_is_a_400_with_an_error``)."""
    parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
    return error_response(400, "; ".join(parts) or "invalid request")


EXCEPTION_HANDLERS: dict[Any, Callable[[Request, Any], Any]] = {
    ServerError: _server_error,
    BatchingError: _server_error,
    HTTPException: _http_error,
    RequestValidationError: _invalid_request,
}

_ERRORS: dict[int | str, str] = {
    400: "Invalid input",
    404: "Unknown model or version",
    413: "Input longer than the maximum sequence length, or body too large",
    415: "Unsupported content encoding",
    429: "The deadline cannot be met (Retry-After)",
    500: "The model failed on this input",
    503: "Queue full, not ready, or draining (Retry-After)",
    504: "The deadline (counted from the request's arrival) passed before it ran (Retry-After)",
    "4XX": "Any other client error, e.g. 405 for a wrong method",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses: these errors and every other 4xx, all ``{"error": ...}``."""
    keys: tuple[int | str, ...] = (*codes, "4XX")
    return {c: {"model": ErrorResponse, "description": _ERRORS[c]} for c in keys}


# -- request context: request id, revision header, infer metrics ---------------------------------------------


class RequestContext:
    """Pure ASGI middleware around every HTTP request: the request id (the caller's ``X-Request-ID`` when it
    is printable ASCII of at most 128 characters, else a new one) in the logging context and on the
    response, with the revision header; the request metrics and the failure log of infer requests; HEAD
    served as GET. An unexpected exception is logged and answered 500, never passed on to uvicorn."""

    def __init__(self, app: ASGIApp, server: ModelServerApp) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        rid = request_id(scope)
        added = [(b"x-request-id", rid.encode()), *self.server.revision_header]
        status = 0

        async def send_with_ids(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message["headers"], *added]
            await send(message)

        method = scope["method"]
        if method == "HEAD":
            scope = {**scope, "method": "GET"}
        infer = is_infer(scope)
        inflight = self.server.service.metrics.inflight
        if infer:
            inflight.inc()
        token = request_id_var.set(rid)
        try:
            await self.app(scope, receive, send_with_ids)
        except ClientDisconnect:
            return  # nobody to answer
        except Exception:
            log.exception("unhandled error")
            if not status:
                await error_response(500, "internal server error")(scope, receive, send_with_ids)
        finally:
            request_id_var.reset(token)
            if infer:
                inflight.dec()
        if infer:
            dt = time.perf_counter() - t0
            self.server.service.metrics.observe_request(status, dt)
            if status >= 400:
                log.info("infer failed", extra={"request_id": rid, "status": status, "seconds": round(dt, 6)})
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("infer", extra={"request_id": rid, "status": status, "seconds": round(dt, 6)})


# -- the raw route -------------------------------------------------------------------------------------------


class RawRoute(APIRoute):
    """A path operation FastAPI documents from its declaration (the endpoint's path parameters,
    ``openapi_extra``, ``response_model``, ``responses``) and Starlette serves raw: the endpoint is called
    with the ``Request`` and its path parameters and returns the ``Response`` it built; FastAPI solves no
    dependencies, validates nothing and serialises nothing on the way. Exceptions still go to the
    application's exception handlers."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)

        async def serve(request: Request) -> Response:
            return await endpoint(request, **request.path_params)

        self.app = request_response(serve)


async def read_body(receive: Receive) -> bytes:
    chunks = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientDisconnect()
        b = msg.get("body", b"")
        size += len(b)
        if size > MAX_BODY:
            raise PayloadTooLarge(f"request body larger than {MAX_BODY} bytes")
        chunks.append(b)
        if not msg.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _offer(mirror: ShadowMirror, body: bytes, header_len: str | None, rid: str, outputs: Any) -> None:
    mirror.offer(body, header_len, rid, outputs)


#: the infer operations' request: the raw route reads the body itself, so it is documented here
INFER_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "X-Request-ID",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "maxLength": 128},
        },
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "description": "binary tensor extension: the length of the JSON part of the body",
            "schema": {"type": "integer", "minimum": 0},
        },
    ],
    "requestBody": {
        "required": True,
        "content": {JSON: {"schema": {"$ref": "#/components/schemas/InferenceRequest"}}},
    },
}


# -- the application -----------------------------------------------------------------------------------------


class ModelServerApp(FastAPI):
    """The server's FastAPI application. ``service`` is created by the caller; the lifespan's startup loads
    it in the background (liveness answers at once, readiness once the model is warm)."""

    def __init__(self, service: ModelService, mirror: ShadowMirror | None = None) -> None:
        super().__init__(
            title="modelserver (Open Inference Protocol v2)",
            version=__version__,
            openapi_url="/openapi.json",
            docs_url=None,
            redoc_url=None,
            redirect_slashes=False,
            lifespan=self._lifespan,
            exception_handlers=EXCEPTION_HANDLERS,
            # FastAPI's OpenTelemetry hooks are off: the server's metrics are its own Prometheus ones, and
            # the per-request check for a configured provider alone costs CPU on the hot path
            telemetry={"tracing": False, "metrics": False, "logs": False},
        )
        self.service = service
        self.model_name = service.name  # (FastAPI's own ``version`` is the API's)
        self.model_version = service.version
        self.mirror = mirror
        # compressed bodies are inflated on this one thread, one at a time
        self._inflater = ThreadPoolExecutor(1, thread_name_prefix="inflate")
        self.load_task: asyncio.Task[None] | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.on_load_failure: Callable[[BaseException], None] | None = None
        revision = os.environ.get("MODELDEPLOY_REVISION", "")
        self.revision_header = [(REVISION_HEADER, revision.encode())] if RID_OK.match(revision) else []
        # infer requests from their arrival at the application to their answer (max_concurrent_requests)
        self.door = Door(service.settings.max_concurrent_requests, self._on_refused, self.revision_header)
        self.add_middleware(RequestContext, server=self)
        self._infer_route = RequestContext(InferRoute(self, self._infer, EXCEPTION_HANDLERS), server=self)
        self._add_routes()

    def _add_routes(self) -> None:
        model, version = "/v2/models/{model_name}", "/v2/models/{model_name}/versions/{model_version}"
        infer_errors = errors(400, 404, 413, 415, 429, 500, 503, 504)
        for path, endpoint in ((model, self.infer), (version, self.infer_version)):  # first: the hot path
            self.router.add_api_route(
                path + "/infer",
                endpoint,
                methods=["POST"],
                summary="Run inference",
                response_model=InferenceResponse,
                responses=infer_errors,
                openapi_extra=INFER_OPENAPI,
                route_class_override=RawRoute,
            )
        self.router.add_api_route(
            EMBEDDINGS_PATH,
            self.embeddings,
            methods=["POST"],
            summary="OpenAI-compatible embeddings (embedding models)",
            responses=infer_errors,
            openapi_extra={
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/EmbeddingRequest"}}
                    },
                }
            },
            route_class_override=RawRoute,
        )
        get = self.add_api_route
        get("/v2/health/live", self.live, summary="Liveness", response_model=LiveResponse, responses=errors())
        get(
            "/v2/health/ready",
            self.ready,
            summary="Readiness",
            response_model=ReadyResponse,
            responses={503: {"model": ReadyResponse, "description": "Not ready"}, **errors()},
        )
        get("/v2", self.server_metadata, summary="Server metadata", response_model=ServerMetadataResponse)
        get("/v2/", self.server_metadata, include_in_schema=False)
        metadata: dict[str, Any] = {"response_model": ModelMetadataResponse, "responses": errors(404, 503)}
        get(model, self.model_metadata, summary="Model metadata", **metadata)
        get(version, self.model_version_metadata, summary="Model version metadata", **metadata)
        readiness: dict[str, Any] = {
            "response_model": ModelReadyResponse,
            "responses": {503: {"model": ModelReadyResponse, "description": "Not ready"}, **errors(404)},
        }
        get(model + "/ready", self.model_ready, summary="Model readiness", **readiness)
        get(version + "/ready", self.model_version_ready, summary="Model version readiness", **readiness)
        config: dict[str, Any] = {"response_model": dict[str, Any], "responses": errors(404, 503)}
        get(model + "/config", self.model_configuration, summary="Triton-style model configuration", **config)
        get(version + "/config", self.model_version_configuration, include_in_schema=False, **config)
        stats: dict[str, Any] = {"response_model": ModelStatistics, "responses": errors(404, 503)}
        summary = "Batching state: queue depth, buckets, token budget, cost model"
        get(model + "/stats", self.model_stats, summary=summary, **stats)
        get(version + "/stats", self.model_version_stats, include_in_schema=False, **stats)
        get(
            "/metrics",
            self.metrics,
            summary="Prometheus metrics",
            response_class=PlainTextResponse,
            responses={200: {"description": "Prometheus text format"}},
        )

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document plus the infer request's schema (the raw routes read their body themselves,
        so FastAPI has not collected its model; ``INFER_OPENAPI`` refers to it)."""
        if self.openapi_schema is None:
            doc = super().openapi()
            body = InferenceRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            schemas.update(body.pop("$defs", {}))
            schemas["InferenceRequest"] = body
            schemas["EmbeddingRequest"] = oai_emb.EmbeddingRequest.model_json_schema()
        return self.openapi_schema  # type: ignore[return-value]

    # -- lifespan ---------------------------------------------------------------------------------------
    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        self.load_task = loop.create_task(self._load())
        shadow_file = self.service.settings.shadow_file
        if self.mirror is not None and shadow_file:
            self.watch_task = loop.create_task(self.mirror.watch(Path(shadow_file)))
        yield
        await self.service.drain()
        self._inflater.shutdown(wait=False)
        if self.watch_task is not None:
            self.watch_task.cancel()
        if self.mirror is not None:
            await self.mirror.drain()
            await self.mirror.close()

    async def _load(self) -> None:
        try:
            await self.service.start()
            if self.mirror is not None:  # the model's own comparison rules are known once it is loaded
                model = self.service.model
                self.mirror.classification = model.info.extra.get("task") == "classification"
                self.mirror.custom = model.compare()
        except Exception as e:
            self.service.state = "failed"
            self.service.error = f"{type(e).__name__}: {e}"
            log.exception("model failed to load")
            if self.on_load_failure is not None:
                self.on_load_failure(e)

    # -- infer (raw) ------------------------------------------------------------------------------------
    async def infer(self, request: Request, model_name: str) -> Response:
        return await self._infer(request, model_name, None)

    async def infer_version(self, request: Request, model_name: str, model_version: str) -> Response:
        return await self._infer(request, model_name, model_version)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The door first (modelserver.door): the arrival time, and the in-flight bound of infer requests."""
        await self.door(self._serve, scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An infer request on its own route (modelserver.infer_route), anything else through Starlette."""
        target = infer_target(scope)
        if target is not None:
            scope[INFER_TARGET] = target  # matched once: the route reads it from the scope
            await self._infer_route(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    def _on_refused(self) -> None:
        m = self.service.metrics
        m.on_reject("overloaded")
        m.observe_request(503, 0.0)

    async def _infer(self, request: Request, name: str, version: str | None) -> Response:
        return await self._infer_admitted(request, name, version)

    async def _infer_admitted(self, request: Request, name: str, version: str | None) -> Response:
        svc = self.service
        try:
            self._check_model(name, version)
        except NotFound:
            await drain_body(request.receive)  # answered from the path alone: no reset to the body
            raise
        header_len = encoding = None
        for k, v in request.scope["headers"]:
            if k == b"inference-header-content-length":
                header_len = v.decode("latin-1")
            elif k == b"content-encoding":
                encoding = v.decode("latin-1").strip().lower()
        body = await read_body(request.receive)
        if encoding in ENCODINGS:
            # capped and off the event loop: a compression bomb is a 413, never an OOM or a stall
            # on the one inflate thread: however many bombs arrive at once, one inflated buffer is held
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._inflater, inflate, body, encoding, MAX_BODY)
        elif encoding not in (None, "identity"):
            raise UnsupportedEncoding(f"unsupported content-encoding {encoding}")
        svc.check_admitting()
        info = svc.model.info
        req = decode_request(body, header_len, {s.name: s for s in info.inputs})
        if req.outputs is not None:
            known = {s.name for s in info.outputs}
            for o in req.outputs:
                if o not in known:
                    raise InvalidInput(f"unknown output '{o}'; the model has {sorted(known)}")
        rid = request_id_var.get() or ""  # set by RequestContext
        outputs = await svc.infer(
            req.inputs, req.priority, req.timeout_ms, rid, arrival=arrival(request.scope)
        )
        payload, hlen = encode_response(self.model_name, self.model_version, req, outputs)
        copy = None  # the shadow copy, offered once the answer is sent
        mirror = self.mirror
        if mirror is not None and mirror.active:
            answered = outputs if req.outputs is None else {o: outputs[o] for o in req.outputs}
            copy = BackgroundTask(_offer, mirror, body, header_len, rid, answered)
        if hlen is None:
            return Response(payload, 200, None, JSON, copy)
        headers = {"inference-header-content-length": str(hlen)}
        return Response(payload, 200, headers, "application/octet-stream", copy)

    async def embeddings(self, request: Request) -> Response:
        """OpenAI ``/v1/embeddings``: the texts as one infer request of the model's ``text`` input, under the
        same in-flight limit, queue and batching (modelserver.openai_embeddings)."""
        try:
            doc = orjson.loads(await read_body(request.receive))
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"the body is not JSON: {e}") from None
        req = oai_emb.parse(doc)
        self._check_model(req.model, None)
        svc = self.service
        svc.check_admitting()
        info = svc.model.info
        if "embedding" not in {o.name for o in info.outputs} or "text" not in {i.name for i in info.inputs}:
            raise NotFound(
                f"model '{self.model_name}' gives no embeddings: /v1/embeddings serves embedding models"
            )
        texts = np.array(req.texts(), dtype=object)
        counts: list[int] = []
        rid = request_id_var.get() or ""
        at = arrival(request.scope)
        outputs = await svc.infer({"text": texts}, 0, None, rid, token_counts=counts, arrival=at)
        body = oai_emb.answer(self.model_name, outputs["embedding"], req.encoding_format, sum(counts))
        return json_response(200, body)

    # -- typed routes -----------------------------------------------------------------------------------
    async def live(self) -> Response:
        return json_response(200, {"live": True})

    async def ready(self) -> Response:
        svc = self.service
        if svc.ready:
            return json_response(200, {"ready": True})
        return json_response(503, {"ready": False, "error": f"not ready: {svc.state}"})

    async def server_metadata(self) -> Response:
        return json_response(
            200, {"name": "modelserver", "version": __version__, "extensions": ["binary_tensor_data"]}
        )

    async def metrics(self) -> Response:
        return Response(self.service.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    async def model_metadata(self, model_name: str) -> Response:
        return self._metadata(model_name, None)

    async def model_version_metadata(self, model_name: str, model_version: str) -> Response:
        return self._metadata(model_name, model_version)

    async def model_ready(self, model_name: str) -> Response:
        return self._model_ready(model_name, None)

    async def model_version_ready(self, model_name: str, model_version: str) -> Response:
        return self._model_ready(model_name, model_version)

    async def model_configuration(self, model_name: str) -> Response:
        self._check_loaded(model_name, None)
        return json_response(200, self._triton_config())

    async def model_version_configuration(self, model_name: str, model_version: str) -> Response:
        self._check_loaded(model_name, model_version)
        return json_response(200, self._triton_config())

    async def model_stats(self, model_name: str) -> Response:
        self._check_loaded(model_name, None)
        return json_response(200, self._stats())

    async def model_version_stats(self, model_name: str, model_version: str) -> Response:
        self._check_loaded(model_name, model_version)
        return json_response(200, self._stats())

    def _check_model(self, name: str, version: str | None) -> None:
        if name != self.model_name:
            raise NotFound(f"unknown model '{name}'; this server serves '{self.model_name}'")
        if version is not None and version != self.model_version:
            raise NotFound(
                f"unknown version '{version}' of model '{name}'; this server serves '{self.model_version}'"
            )

    def _check_loaded(self, name: str, version: str | None) -> None:
        self._check_model(name, version)
        svc = self.service
        if not svc.ready and svc.state != "draining":
            raise NotReady(f"model is not ready ({svc.state})", retry_after=5.0)

    def _model_ready(self, name: str, version: str | None) -> Response:
        self._check_model(name, version)
        if self.service.ready:
            return json_response(200, {"name": self.model_name, "ready": True})
        state = self.service.state
        return json_response(503, {"name": self.model_name, "ready": False, "error": f"not ready: {state}"})

    def _metadata(self, name: str, version: str | None) -> Response:
        self._check_loaded(name, version)
        info = self.service.model.info
        return json_response(
            200,
            {
                "name": self.model_name,
                "versions": [self.model_version],
                "platform": info.platform,
                "inputs": [s.as_dict() for s in info.inputs],
                "outputs": [s.as_dict() for s in info.outputs],
                "parameters": {k: v for k, v in info.extra.items() if isinstance(v, (str, int, float, bool))},
            },
        )

    def _triton_config(self) -> dict[str, Any]:
        s = self.service.settings
        info = self.service.model.info

        def dims(shape: list[int]) -> list[int]:
            return shape[1:]

        return {
            "name": self.model_name,
            "platform": info.platform,
            "max_batch_size": s.max_batch_size,
            "input": [
                {
                    "name": t.name,
                    "data_type": "TYPE_" + ("STRING" if t.datatype == "BYTES" else t.datatype),
                    "dims": dims(t.shape),
                }
                for t in info.inputs
            ],
            "output": [
                {
                    "name": t.name,
                    "data_type": "TYPE_" + ("STRING" if t.datatype == "BYTES" else t.datatype),
                    "dims": dims(t.shape),
                }
                for t in info.outputs
            ],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(s.max_queue_delay_ms * 1000),
                "priority_levels": s.priority_levels,
                "default_priority_level": s.default_priority,
                "default_queue_policy": {
                    "default_timeout_microseconds": int(s.default_timeout_ms * 1000),
                    "max_queue_size": s.max_queue_size,
                },
            },
        }

    def _stats(self) -> dict[str, Any]:
        svc = self.service
        q = svc.queue
        return {
            "model": self.model_name,
            "version": self.model_version,
            "state": svc.state,
            "queue_depth": q.depth if q else 0,
            "buckets": q.buckets.bounds if q else [],
            "token_budget": q.budget if q else 0,
            "cost_model": [float(c) for c in q.cost.coef] if q else [],
            "batches": svc.worker.batches if svc.worker else 0,
            "cache_entries": len(svc.cache) if svc.cache else 0,
        }
