"""HTTP: the Open Inference Protocol v2 REST API as a plain ASGI application (run by uvicorn).

A hand-rolled router instead of a web framework keeps the per-request CPU cost low (the server-overhead
target is <= 200 us of CPU per request); the OpenAPI document is served at ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import math
import os
import re
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from . import __version__
from .batching import BatchingError
from .errors import InvalidInput, NotFound, ServerError
from .logs import request_id_var
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .openapi import openapi_document
from .protocol import decode_request, encode_response
from .service import ModelService
from .shadow import ShadowMirror

log = logging.getLogger("modelserver.http")

MAX_BODY = 64 * 1024 * 1024
JSON = b"application/json"
_RID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: bytes = JSON
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: an answered infer request the shadow mirror may copy: (body, header length, outputs)
    shadow: tuple[bytes, str | None, dict[str, Any]] | None = None


def json_reply(status: int, doc: Any, headers: list[tuple[bytes, bytes]] | None = None) -> Reply:
    return Reply(status, orjson.dumps(doc), JSON, headers or [])


def error_reply(status: int, message: str, retry_after: float | None = None) -> Reply:
    headers = []
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    return Reply(status, orjson.dumps({"error": message}), JSON, headers)


#: the revision this server belongs to (the operator sets MODELDEPLOY_REVISION on the server container),
#: sent back on every response so a client behind a Service or a gateway can tell who answered
REVISION_HEADER = b"x-modeldeploy-revision"

_MODEL_RE = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(ready|infer|config|stats))?$")


class ModelServerApp:
    """ASGI application. ``service`` is created by the caller; ``startup`` loads it in the background."""

    def __init__(self, service: ModelService, mirror: ShadowMirror | None = None) -> None:
        self.service = service
        self.name = service.name
        self.version = service.version
        self.mirror = mirror
        self._openapi: bytes | None = None
        self.load_task: asyncio.Task[None] | None = None
        self.watch_task: asyncio.Task[None] | None = None
        self.on_load_failure: Callable[[BaseException], None] | None = None
        revision = os.environ.get("MODELDEPLOY_REVISION", "")
        self._revision = [(REVISION_HEADER, revision.encode())] if _RID_OK.match(revision) else []

    # -- ASGI -------------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t = scope["type"]
        if t == "http":
            await self._http(scope, receive, send)
        elif t == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                loop = asyncio.get_running_loop()
                self.load_task = loop.create_task(self._load())
                shadow_file = self.service.settings.shadow_file
                if self.mirror is not None and shadow_file:
                    self.watch_task = loop.create_task(self.mirror.watch(Path(shadow_file)))
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.service.drain()
                if self.watch_task is not None:
                    self.watch_task.cancel()
                if self.mirror is not None:
                    await self.mirror.drain()
                    await self.mirror.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

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

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        rid = None
        header_len = None
        encoding = None
        for k, v in scope["headers"]:
            if k == b"x-request-id":
                s = v.decode("latin-1")
                if _RID_OK.match(s):
                    rid = s
            elif k == b"inference-header-content-length":
                header_len = v.decode("latin-1")
            elif k == b"content-encoding":
                encoding = v.decode("latin-1").strip().lower()
        if rid is None:
            rid = uuid.uuid4().hex
        token = request_id_var.set(rid)
        method = scope["method"]
        path = scope["path"]
        is_infer = False
        try:
            if path.endswith("/infer") and method == "POST":
                is_infer = True
                reply = await self._infer(path, receive, header_len, encoding, rid)
            else:
                reply = await self._route(method, path, receive)
        except Exception:
            log.exception("unhandled error")
            reply = error_reply(500, "internal server error")
        finally:
            request_id_var.reset(token)
        headers = [
            (b"content-type", reply.content_type),
            (b"content-length", str(len(reply.body)).encode()),
            (b"x-request-id", rid.encode()),
            *self._revision,
            *reply.headers,
        ]
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": reply.body})
        if reply.shadow is not None and self.mirror is not None:
            self.mirror.offer(reply.shadow[0], reply.shadow[1], rid, reply.shadow[2])
        if is_infer:
            dt = time.perf_counter() - t0
            self.service.metrics.observe_request(reply.status, dt)
            if reply.status >= 400:
                log.info(
                    "infer failed",
                    extra={"request_id": rid, "status": reply.status, "seconds": round(dt, 6)},
                )
            elif log.isEnabledFor(logging.DEBUG):
                log.debug("infer", extra={"request_id": rid, "status": reply.status, "seconds": round(dt, 6)})

    async def _body(self, receive: Receive) -> bytes:
        chunks = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise asyncio.CancelledError("client disconnected")
            b = msg.get("body", b"")
            size += len(b)
            if size > MAX_BODY:
                raise ServerError(f"request body larger than {MAX_BODY} bytes")
            chunks.append(b)
            if not msg.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # -- routes -----------------------------------------------------------------------------------------
    def _check_model(self, name: str, version: str | None) -> None:
        if name != self.name:
            raise NotFound(f"unknown model '{name}'; this server serves '{self.name}'")
        if version is not None and version != self.version:
            raise NotFound(
                f"unknown version '{version}' of model '{name}'; this server serves '{self.version}'"
            )

    async def _infer(
        self, path: str, receive: Receive, header_len: str | None, encoding: str | None, rid: str
    ) -> Reply:
        svc = self.service
        try:
            m = _MODEL_RE.match(path)
            if m is None or m.group(3) != "infer":
                raise NotFound(f"no route for POST {path}")
            self._check_model(m.group(1), m.group(2))
            try:
                body = await self._body(receive)
            except ServerError as e:
                return error_reply(413, str(e))
            if encoding in ("gzip", "deflate"):
                try:
                    body = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
                except (OSError, zlib.error, EOFError) as e:
                    raise InvalidInput(f"cannot decode {encoding} body: {e}") from None
            elif encoding not in (None, "identity"):
                return error_reply(415, f"unsupported content-encoding {encoding}")
            svc.check_admitting()
            info = svc.model.info
            req = decode_request(body, header_len, {s.name: s for s in info.inputs})
            if req.outputs is not None:
                known = {s.name for s in info.outputs}
                for o in req.outputs:
                    if o not in known:
                        raise InvalidInput(f"unknown output '{o}'; the model has {sorted(known)}")
            outputs = await svc.infer(req.inputs, req.priority, req.timeout_ms, rid)
            payload, hlen = encode_response(self.name, self.version, req, outputs)
            shadow = None
            if self.mirror is not None and self.mirror.active:
                answered = outputs if req.outputs is None else {o: outputs[o] for o in req.outputs}
                shadow = (body, header_len, answered)
            if hlen is None:
                return Reply(200, payload, shadow=shadow)
            return Reply(
                200,
                payload,
                b"application/octet-stream",
                [(b"inference-header-content-length", str(hlen).encode())],
                shadow=shadow,
            )
        except (ServerError, BatchingError) as e:
            return error_reply(e.status, str(e), e.retry_after if e.status in (429, 503) else None)

    async def _route(self, method: str, path: str, receive: Receive) -> Reply:
        svc = self.service
        if path == "/v2/health/live":
            return self._only_get(method) or json_reply(200, {"live": True})
        if path == "/v2/health/ready":
            if bad := self._only_get(method):
                return bad
            if svc.ready:
                return json_reply(200, {"ready": True})
            return json_reply(503, {"ready": False, "error": f"not ready: {svc.state}"})
        if path == "/metrics":
            if bad := self._only_get(method):
                return bad
            return Reply(200, svc.metrics.exposition(), METRICS_CONTENT_TYPE.encode())
        if path in ("/v2", "/v2/"):
            if bad := self._only_get(method):
                return bad
            return json_reply(
                200, {"name": "modelserver", "version": __version__, "extensions": ["binary_tensor_data"]}
            )
        if path == "/openapi.json":
            if bad := self._only_get(method):
                return bad
            if self._openapi is None:
                self._openapi = orjson.dumps(openapi_document(svc))
            return Reply(200, self._openapi)
        m = _MODEL_RE.match(path)
        if m is None:
            return error_reply(404, f"no route for {method} {path}")
        name, version, action = m.group(1), m.group(2), m.group(3)
        if action == "infer":
            return error_reply(405, "use POST for infer")
        if bad := self._only_get(method):
            return bad
        try:
            self._check_model(name, version)
        except NotFound as e:
            return error_reply(404, str(e))
        if action == "ready":
            if svc.ready:
                return json_reply(200, {"name": self.name, "ready": True})
            return json_reply(503, {"name": self.name, "ready": False, "error": f"not ready: {svc.state}"})
        if not svc.ready and svc.state != "draining":
            return error_reply(503, f"model is not ready ({svc.state})", 5.0)
        info = svc.model.info
        if action == "config":
            return json_reply(200, self._triton_config())
        if action == "stats":
            return json_reply(200, self._stats())
        return json_reply(
            200,
            {
                "name": self.name,
                "versions": [self.version],
                "platform": info.platform,
                "inputs": [s.as_dict() for s in info.inputs],
                "outputs": [s.as_dict() for s in info.outputs],
                "parameters": {k: v for k, v in info.extra.items() if isinstance(v, (str, int, float, bool))},
            },
        )

    @staticmethod
    def _only_get(method: str) -> Reply | None:
        if method in ("GET", "HEAD"):
            return None
        r = error_reply(405, f"method {method} not allowed")
        r.headers.append((b"allow", b"GET"))
        return r

    def _triton_config(self) -> dict[str, Any]:
        s = self.service.settings
        info = self.service.model.info

        def dims(shape: list[int]) -> list[int]:
            return shape[1:]

        return {
            "name": self.name,
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
            "model": self.name,
            "version": self.version,
            "state": svc.state,
            "queue_depth": q.depth if q else 0,
            "buckets": q.buckets.bounds if q else [],
            "token_budget": q.budget if q else 0,
            "cost_model": [float(c) for c in q.cost.coef] if q else [],
            "batches": svc.worker.batches if svc.worker else 0,
            "cache_entries": len(svc.cache) if svc.cache else 0,
        }
