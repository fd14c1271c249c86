"""The HTTP app of a generation server: OpenAI-compatible ``/v1/completions``, ``/v1/chat/completions``
(``stream: true`` as server-sent events) and ``/v1/models``, with the health, readiness and metrics
endpoints every serving pod has (``/v2/health/live``, ``/v2/health/ready``, ``/metrics``).

Every answer and refusal is counted in ``modelserver_requests_total{code}`` and the request latency, as for
encoders, so the operator's error-rate analysis reads generation pods unchanged; a stream that fails after
its 200 was sent is counted as 500 (the client saw it cut). Errors are ``{"error": message}`` with the
status of :mod:`modelserver.errors` (``Retry-After`` on 429/503). Streams are sent with
``Cache-Control: no-cache`` and ``X-Accel-Buffering: no`` so proxies pass each event at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import gen_openai as oa
from .errors import InvalidInput, NotFound, ServerError
from .gen_engine import GenerationEngine, GenerationUnavailable, Sampling, Step, schedule_of
from .gen_metrics import GenerationMetrics
from .gen_shadow import GenerationMirror
from .metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("modelserver.generation")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: as on encoder servers (modelserver.app): who answered, and the request's id
REVISION_HEADER = b"x-modeldeploy-revision"
_ID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")


def _body_doc(kind: type) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its JSON body itself: the body's schema by reference."""
    ref = {"$ref": f"#/components/schemas/{kind.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


class ResponseIds:
    """Pure ASGI middleware: every answer carries the revision header (``MODELDEPLOY_REVISION``, set by the
    operator) and ``x-request-id`` (the caller's when printable ASCII of at most 128 characters)."""

    def __init__(self, app: ASGIApp, revision: str) -> None:
        self.app = app
        self.revision = [(REVISION_HEADER, revision.encode())] if _ID_OK.match(revision) else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next(
            (v for k, v in scope["headers"] if k == b"x-request-id" and _ID_OK.match(v.decode("latin-1"))),
            uuid.uuid4().hex.encode(),
        )
        added = [(b"x-request-id", rid), *self.revision]
        scope.setdefault("state", {})["request_id"] = rid.decode("latin-1")  # the shadow copy carries it

        async def send_with_ids(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message["headers"], *added]
            await send(message)

        await self.app(scope, receive, send_with_ids)


def _json(status: int, doc: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json", headers=headers)


def _error(e: ServerError) -> Response:
    headers = {"Retry-After": str(max(1, round(e.retry_after)))} if e.retry_after else None
    return _json(e.status, {"error": str(e)}, headers)


def _sse(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


class GenerationApp(FastAPI):
    def __init__(
        self,
        engine: GenerationEngine,
        tokenizer: Any,
        model_name: str,
        model_version: str,
        metrics: Metrics,
        mirror: GenerationMirror | None = None,
        shadow_file: str = "",
    ) -> None:
        super().__init__(title="modelserver (generation)", version=model_version, lifespan=self._lifespan)
        self.mirror = mirror
        self.shadow_file = shadow_file
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_version = model_version
        self.metrics = metrics
        self.gen = GenerationMetrics(
            metrics,
            lambda: engine.waiting,
            lambda: engine.running,
            engine.kv_cache_usage,
        )
        engine.gate.on_preemption = self.gen.preemptions.inc
        self.draining = False
        self.add_middleware(ResponseIds, revision=os.environ.get("MODELDEPLOY_REVISION", ""))
        self.post(
            "/v1/completions",
            summary="OpenAI completions (stream: server-sent events)",
            openapi_extra=_body_doc(oa.CompletionRequest),
        )(self.completions)
        self.post(
            "/v1/chat/completions",
            summary="OpenAI chat completions (stream: server-sent events)",
            openapi_extra=_body_doc(oa.ChatRequest),
        )(self.chat_completions)
        self.get("/v1/models", summary="The served model")(self.models)
        self.get("/v2/health/live")(self.live)
        self.get("/v2/health/ready")(self.ready)
        self.get("/metrics")(self.metrics_text)

    def openapi(self) -> dict[str, Any]:
        """FastAPI's document plus the request schemas the generation routes refer to (they read their body
        themselves, so FastAPI has not collected the models)."""
        if self.openapi_schema is None:
            doc = super().openapi()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for kind in (oa.CompletionRequest, oa.ChatRequest):
                body = kind.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(body.pop("$defs", {}))
                schemas[kind.__name__] = body
        return self.openapi_schema  # type: ignore[return-value]

    # -- plain endpoints ------------------------------------------------------------------------------
    async def live(self) -> Response:
        return _json(200, {"live": True})

    async def ready(self) -> Response:
        ok = not self.draining and self.engine.manager.is_running()
        return _json(200 if ok else 503, {"ready": ok})

    async def metrics_text(self) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def models(self) -> Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "owned_by": "modeldeploy",
            "version": self.model_version,
        }
        return _json(200, {"object": "list", "data": [card]})

    @asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        """Follow the shadow file while serving (modelserver.gen_shadow); send what is queued at the end."""
        task = None
        if self.mirror is not None and self.shadow_file:
            task = asyncio.get_running_loop().create_task(self.mirror.watch(Path(self.shadow_file)))
        yield
        if task is not None:
            task.cancel()
        if self.mirror is not None:
            await self.mirror.drain()
            await self.mirror.close()

    def _shadow_offer(self, request: Request, req: Any, sampling: Sampling) -> Callable[[str], None] | None:
        """What to call with a complete answer to copy it to the shadow, if this request is copied."""
        mirror = self.mirror
        if mirror is None or not mirror.active or not sampling.greedy:
            return None
        path, doc, n = request.url.path, req.model_dump(), sampling.max_tokens
        rid = str(getattr(request.state, "request_id", ""))
        return lambda text: mirror.offer_answer(path, doc, n, text, rid)

    # -- generation ----------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._serve(request, oa.CompletionRequest, self._completion_prompt, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, oa.ChatRequest, self._chat_prompt, chat=True)

    def _completion_prompt(self, req: Any) -> list[int]:
        return list(self.tokenizer(req.prompt)["input_ids"])

    def _chat_prompt(self, req: Any) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidInput(f"model {self.model_name} has no chat template: use /v1/completions")
        msgs = [m.model_dump() for m in req.messages]
        enc = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = enc["input_ids"] if not isinstance(enc, list) else enc
        return list(ids)

    async def _serve(
        self, request: Request, kind: type, prompt_of: Callable[[Any], list[int]], chat: bool
    ) -> Response:
        t0 = time.monotonic()
        try:
            if self.draining:
                raise GenerationUnavailable("the server is draining: retry on another replica")
            try:
                doc = orjson.loads(await request.body())
            except orjson.JSONDecodeError as e:
                raise InvalidInput(f"the body is not JSON: {e}") from None
            req = oa.parse(kind, doc)
            if req.model != self.model_name:
                raise NotFound(
                    f"model {req.model!r} is not served here (this server serves {self.model_name!r})"
                )
            prompt = await asyncio.to_thread(prompt_of, req)
            wanted = req.wanted_tokens if chat else req.max_tokens
            limits = self.engine.limits
            max_tokens = wanted or (
                min(limits.max_tokens, max(1, limits.context - len(prompt)))
                if chat
                else oa.DEFAULT_MAX_TOKENS
            )
            sampling = req.sampling(max_tokens)
            priority, timeout_s = schedule_of(limits, req.priority, req.timeout_ms)
            steps = self.engine.stream(prompt, sampling, priority, timeout_s)
            first = await anext(steps)  # admission errors surface here, before any byte is sent
        except ServerError as e:
            if e.status == 503 and e.retry_after is None:
                e.retry_after = 5.0
            self.metrics.observe_request(e.status, time.monotonic() - t0)
            return _error(e)
        self.gen.ttft.observe(time.monotonic() - t0)
        self.gen.prompt_tokens.inc(len(prompt))
        run = _Run(self, t0, prompt, sampling, req.stops(), first, steps)
        run.on_answer = self._shadow_offer(request, req, sampling)
        rid = oa.new_id("chatcmpl" if chat else "cmpl")
        if not req.stream:
            text, reason, n = await run.collect()
            use = oa.usage(len(prompt), n)
            body = (oa.chat if chat else oa.completion)(rid, self.model_name, text, reason, use)
            return _json(200, body)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return StreamingResponse(
            run.events(rid, chat, include_usage), media_type="text/event-stream", headers=SSE_HEADERS
        )


class _Run:
    """One admitted sequence: its steps turned into text, timed and counted."""

    def __init__(
        self, app: GenerationApp, t0: float, prompt: list[int], sampling: Sampling, stops: list[str],
        first: Step, steps: AsyncGenerator[Step, None],
    ) -> None:  # fmt: skip
        self.app, self.t0, self.prompt, self.sampling = app, t0, prompt, sampling
        self.first, self.steps = first, steps
        self.text = oa.TextAssembler(lambda ids: app.tokenizer.decode(ids, skip_special_tokens=True), stops)
        self.generated = 0
        self.reason: str | None = None
        self.on_answer: Callable[[str], None] | None = None  # given the whole text of a complete answer
        self._last = time.monotonic()

    async def pieces(self) -> AsyncIterator[str]:
        """Text to send, step by step; sets :attr:`reason` at the end."""
        gen = self.app.gen
        step: Step | None = self.first
        try:
            while step is not None:
                now = time.monotonic()
                if self.generated and step.tokens:
                    gen.tpot.observe((now - self._last) / len(step.tokens))
                self._last = now
                self.generated += len(step.tokens)
                gen.generation_tokens.inc(len(step.tokens))
                piece = self.text.feed(step.tokens, final=step.finished)
                if piece:
                    yield piece
                if self.text.stopped:
                    self.reason = "stop"
                    break
                if step.finished:
                    self.reason = step.reason
                    break
                step = await anext(self.steps, None)
            if self.reason is not None and self.on_answer is not None:
                self.on_answer(self.text.sent)
        finally:
            await self.steps.aclose()  # an early end cancels the sequence (frees its cache blocks)
            gen.finished[self.reason or "abort"].inc()
            gen.e2e.observe(time.monotonic() - self.t0)

    async def collect(self) -> tuple[str, str | None, int]:
        parts = [p async for p in self.pieces()]
        self.app.metrics.observe_request(200, time.monotonic() - self.t0)
        return "".join(parts), self.reason, self.generated

    async def events(self, rid: str, chat: bool, include_usage: bool) -> AsyncIterator[bytes]:
        name, code = self.app.model_name, 499  # unless it ends: the client went away mid-stream
        try:
            if chat:
                yield _sse(oa.chat_chunk(rid, name, {"role": "assistant"}, None))
            async for piece in self.pieces():
                if chat:
                    yield _sse(oa.chat_chunk(rid, name, {"content": piece}, None))
                else:
                    yield _sse(oa.completion(rid, name, piece, None, None))
            last = (
                oa.chat_chunk(rid, name, {}, self.reason)
                if chat
                else oa.completion(rid, name, "", self.reason, None)
            )
            yield _sse(last)
            if include_usage:
                use = oa.usage(len(self.prompt), self.generated)
                doc = {"id": rid, "object": last["object"], "model": name, "choices": [], "usage": use}
                yield _sse(doc)
            yield b"data: [DONE]\n\n"
            code = 200
        except ServerError as e:
            code = 500  # after the 200: the client sees the stream end with an error event
            log.warning("stream %s failed: %s", rid, e)
            yield _sse({"error": str(e)})
        finally:
            # 499 (nginx's "client closed request"): not the server's failure, but counted
            self.app.metrics.observe_request(code, time.monotonic() - self.t0)
