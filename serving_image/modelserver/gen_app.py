"""The HTTP app of a generation server: OpenAI-compatible ``/v1/completions``, ``/v1/chat/completions``
(``stream: true`` as server-sent events), ``/v1/models`` and ``/v1/models/{id}``, with the health, readiness
and metrics endpoints every serving pod has (``/v2/health/live``, ``/v2/health/ready``, ``/metrics``).

Every answer and refusal is counted in ``modelserver_requests_total{code}`` and the request latency, as for
encoders, so the operator's error-rate analysis reads generation pods unchanged; a stream that fails after
its 200 was sent is counted as 500 (the client saw it cut), a client that goes away before its answer as
499. Streams are sent with ``Cache-Control: no-cache`` and ``X-Accel-Buffering: no`` so proxies pass each
event at once.

**Errors** on the /v1 routes have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, also
inside a stream (its error event) and from the door: the status is the error's class in
:mod:`modelserver.errors` (``Retry-After`` on 429/503), the rest :func:`modelserver.gen_openai.error_doc`.
The encoders' OIP routes keep their own ``{"error": "..."}``: each protocol its own shape.

**What one request may cost before it is refused** (the encoder server's bounds, modelserver.door, for
generation too):

* at most ``max_concurrent_requests`` generation requests inside the app at once, from their arrival to
  their answer (streams included): beyond, the door answers 503 with ``Retry-After`` at once
  (:class:`modelserver.door.Door`), before any body is read into memory or any prompt tokenized. Not
  uvicorn's ``limit_concurrency``: that counts health probes and metric scrapes too, so an overloaded pod
  would fail its readiness probe, and it answers in no protocol's shape;
* a body of at most 64 MiB (``modelserver.door.MAX_BODY``, the encoders' limit): one that says it is
  larger is refused 413 before any of it is read, one that grows past it while read (in the server's
  chunks) is refused as soon as it does, the rest never read by the app;
* a prompt too long for the context is refused 400 *before it is tokenized*
  (:func:`modelserver.gen_openai.check_length`: words and characters against the context, a cost bounded
  by the context, not by the prompt).

**A client that goes away** stops its sequence at once, streamed or not: a stream when its next event
cannot be sent, a whole answer when the server's receive channel says ``http.disconnect`` while the answer
is collected (:meth:`GenerationApp._whole`); either way the engine frees its place and cache.

**Priority belongs to the gateway, not to the body.** The engine preempts a running sequence for a
newcomer of a higher priority, so a body's ``priority: 1`` would let any caller push everyone else's
streams aside. A request's level is the ``x-modeldeploy-priority`` header (1 the highest) when present,
else ``--default-priority``; the body's ``priority`` may only *lower* it (a number at or past that level;
a higher one is clamped to the level, not refused, so clients that send it keep working). The header is
trusted as it arrives: whoever sets it is the trust boundary -- the gateway in front of the pods must set
it per route or caller, and remove it from what clients send; a caller that reaches the pods past the
gateway (inside the cluster) is trusted as much as the gateway. Chosen over a cap per caller because the
server cannot tell callers apart (no authentication here), and the gateway can.

**Special tokens in chat messages**: a message's text that spells a special token (``<|user|>``, the EOS)
is tokenized as text, not turned into that token, so a message cannot fake a role or end a turn
(:class:`modelserver.gen_openai.ChatPrompts`); ``--special-tokens-in-chat parse`` restores the old
behaviour. ``/v1/completions`` keeps parsing them: its caller writes the whole prompt, markers included.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import gen_openai as oa
from .app import read_body
from .door import MAX_BODY, Door, arrival
from .errors import InvalidInput, Overloaded, PayloadTooLarge, ServerError
from .gen_engine import GenerationEngine, GenerationUnavailable, Sampling, Step, check, schedule_of
from .gen_metrics import GenerationMetrics
from .gen_shadow import GenerationMirror
from .gen_text import TextAssembler
from .metrics import CONTENT_TYPE, Metrics

log = logging.getLogger("modelserver.generation")

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: as on encoder servers (modelserver.app): who answered, and the request's id
REVISION_HEADER = b"x-modeldeploy-revision"
#: the request's priority level, set by the gateway (see the module doc)
PRIORITY_HEADER = "x-modeldeploy-priority"
#: the routes that generate: counted and bounded by the door
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
_ID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")


def is_generation(scope: Scope) -> bool:
    return scope["method"] == "POST" and scope["path"] in GENERATION_PATHS


def _revision_headers(revision: str) -> list[tuple[bytes, bytes]]:
    return [(REVISION_HEADER, revision.encode())] if _ID_OK.match(revision) else []


def _body_doc(kind: type) -> dict[str, Any]:
    """``openapi_extra`` of a route that reads its JSON body itself: the body's schema by reference."""
    ref = {"$ref": f"#/components/schemas/{kind.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


class ResponseIds:
    """Pure ASGI middleware: every answer carries the revision header (``MODELDEPLOY_REVISION``, set by the
    operator) and ``x-request-id`` (the caller's when printable ASCII of at most 128 characters)."""

    def __init__(self, app: ASGIApp, revision: str) -> None:
        self.app = app
        self.revision = _revision_headers(revision)

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
    return _json(e.status, oa.error_doc(e), headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route 404, a wrong method 405): OpenAI's shape on /v1, the
    ``{"error"}`` of the other servers' routes elsewhere."""
    assert isinstance(exc, HTTPException)
    status, message = exc.status_code, str(exc.detail)
    if request.url.path.startswith("/v1/"):
        return _json(status, oa.error_fields(status, message), dict(exc.headers or {}))
    return _json(status, {"error": message}, dict(exc.headers or {}))


def _sse(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (``http.disconnect``); for a request whose body was read whole,
    after which the server's receive channel has nothing else to say."""
    while (await receive())["type"] != "http.disconnect":
        pass


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
        max_concurrent_requests: int = 128,
        special_tokens_in_chat: str = "text",
    ) -> None:
        super().__init__(title="modelserver (generation)", version=model_version, lifespan=self._lifespan)
        self.mirror = mirror
        self.shadow_file = shadow_file
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.model_version = model_version
        self.created = int(time.time())  # the models' ``created``: when this server began serving it
        self.longest_token = oa.longest_token(tokenizer)
        self.chat_prompts = oa.ChatPrompts(tokenizer, parse_specials=special_tokens_in_chat == "parse")
        self.metrics = metrics
        self.gen = GenerationMetrics(
            metrics,
            lambda: engine.waiting,
            lambda: engine.running,
            engine.kv_cache_usage,
        )
        engine.gate.on_preemption = self.gen.preemptions.inc
        self.draining = False
        revision = os.environ.get("MODELDEPLOY_REVISION", "")
        self.add_middleware(ResponseIds, revision=revision)
        busy = Overloaded(f"{max_concurrent_requests} requests in flight (max_concurrent_requests)")
        self.door = Door(
            max_concurrent_requests,
            self._on_refused,
            _revision_headers(revision),
            counts=is_generation,
            body=orjson.dumps(oa.error_doc(busy)),
        )
        self.add_exception_handler(HTTPException, _http_error)
        self._add_routes()

    def _add_routes(self) -> None:
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
        self.get("/v1/models/{model_id:path}", summary="One served model (404 for another)")(self.model)
        self.get("/v2/health/live")(self.live)
        self.get("/v2/health/ready")(self.ready)
        self.get("/metrics")(self.metrics_text)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The door first (modelserver.door): the arrival time, and the in-flight bound of generation
        requests, refused before routing, middleware or reading the body."""
        await self.door(super().__call__, scope, receive, send)

    def _on_refused(self) -> None:
        self.metrics.on_reject("overloaded")
        self.metrics.observe_request(503, 0.0)

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

    def _card(self) -> dict[str, Any]:
        return oa.model_card(self.model_name, self.model_version, self.created)

    async def models(self) -> Response:
        return _json(200, {"object": "list", "data": [self._card()]})

    async def model(self, model_id: str) -> Response:
        if model_id != self.model_name:
            return _error(self._not_served(model_id))
        return _json(200, self._card())

    def _not_served(self, model: str) -> ServerError:
        return oa.ModelNotFound(
            f"model {model!r} is not served here (this server serves {self.model_name!r})"
        )

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
        return await self._serve(request, oa.CompletionRequest, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, oa.ChatRequest, chat=True)

    def _completion_prompt(self, req: Any) -> list[int]:
        return list(self.tokenizer(req.prompt)["input_ids"])

    def _chat_prompt(self, req: Any) -> list[int]:
        return self.chat_prompts([m.model_dump() for m in req.messages])

    def _refuse(self, e: ServerError, t0: float) -> Response:
        if e.status == 503 and e.retry_after is None:
            e.retry_after = 5.0
        self.metrics.observe_request(e.status, time.monotonic() - t0)
        return _error(e)

    async def _serve(self, request: Request, kind: type, chat: bool) -> Response:
        t0 = arrival(request.scope) or time.monotonic()
        try:
            req, prompt, sampling, first, steps = await self._admit(request, kind, chat)
        except ClientDisconnect:  # gone while its body came: nobody to answer
            self.metrics.observe_request(499, time.monotonic() - t0)
            return Response(status_code=499)
        except ServerError as e:
            return self._refuse(e, t0)
        except Exception:  # a bug: still an answer in the protocol's shape, and the trace in the log
            log.exception("generation request failed before its answer began")
            return self._refuse(ServerError("internal error"), t0)
        self.gen.ttft.observe(time.monotonic() - t0)
        self.gen.prompt_tokens.inc(len(prompt))
        run = _Run(self, t0, prompt, sampling, req.stops(), first, steps)
        run.on_answer = self._shadow_offer(request, req, sampling)
        rid = oa.new_id("chatcmpl" if chat else "cmpl")
        if not req.stream:
            return await self._whole(request, run, rid, chat)
        include_usage, continuous = req.usage_options
        return StreamingResponse(
            run.events(rid, chat, include_usage, continuous),
            media_type="text/event-stream",
            headers=SSE_HEADERS,
        )

    async def _admit(
        self, request: Request, kind: type, chat: bool
    ) -> tuple[Any, list[int], Sampling, Step, AsyncGenerator[Step, None]]:
        """The request read, checked (the cheap checks before tokenizing), tokenized and admitted to the
        engine, with its first step (admission errors surface here, before any byte is sent)."""
        if self.draining:
            raise GenerationUnavailable("the server is draining: retry on another replica")
        req = oa.parse(kind, await self._body(request))
        if req.model != self.model_name:
            raise self._not_served(req.model)
        limits = self.engine.limits
        wanted = req.wanted_tokens
        if wanted is not None and wanted > limits.max_tokens:
            field = req.tokens_field
            raise oa.FieldError(field, f"{field} {wanted} is over this server's limit of {limits.max_tokens}")
        priority, timeout_s = self._schedule(request, req)
        least = wanted or (1 if chat else oa.DEFAULT_MAX_TOKENS)  # chat's default: the rest of the context
        oa.check_length(req.prompt_field, req.text(), limits.context, least, self.longest_token)
        prompt = await asyncio.to_thread(self._chat_prompt if chat else self._completion_prompt, req)
        max_tokens = wanted or (
            min(limits.max_tokens, max(1, limits.context - len(prompt))) if chat else oa.DEFAULT_MAX_TOKENS
        )
        self._check(req, len(prompt), max_tokens)
        sampling = req.sampling(max_tokens)
        steps = self.engine.stream(prompt, sampling, priority, timeout_s)
        return req, prompt, sampling, await anext(steps), steps

    async def _body(self, request: Request) -> Any:
        """The JSON body, read in the server's chunks up to the 64 MiB limit: a body that says it is larger
        is refused before any of it is read, one that grows larger as soon as it does (413)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            raise PayloadTooLarge(f"request body of {declared} bytes is larger than {MAX_BODY} bytes")
        body = await read_body(request.receive)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"the body is not JSON: {e}") from None

    def _check(self, req: Any, prompt_tokens: int, max_tokens: int) -> None:
        """The engine's limits (modelserver.gen_engine.check), the refusal naming the field at fault."""
        try:
            check(self.engine.limits, prompt_tokens, max_tokens)
        except InvalidInput as e:
            if not 1 <= max_tokens <= self.engine.limits.max_tokens:
                raise oa.FieldError(req.tokens_field, f"{req.tokens_field}: {e}") from None
            code = "context_length_exceeded" if prompt_tokens else None
            raise oa.FieldError(req.prompt_field, f"{req.prompt_field}: {e}", code) from None

    def _schedule(self, request: Request, req: Any) -> tuple[int, float | None]:
        """(priority, seconds to wait for a place): the caller's level is the gateway's
        ``x-modeldeploy-priority`` header, else the server's default; the body may only lower it (the
        module doc says why)."""
        limits = self.engine.limits
        level = limits.default_priority
        given = request.headers.get(PRIORITY_HEADER)
        if given is not None:
            if not given.strip().isdigit() or not 1 <= int(given) <= limits.priority_levels:
                raise oa.FieldError(
                    PRIORITY_HEADER,
                    f"{PRIORITY_HEADER}: 1 (the highest) .. {limits.priority_levels}, got {given!r}",
                )
            level = int(given)
        priority, timeout_s = schedule_of(limits, req.priority, req.timeout_ms)  # 400 naming priority
        return (level if req.priority == 0 else max(priority, level)), timeout_s

    async def _whole(self, request: Request, run: _Run, rid: str, chat: bool) -> Response:
        """The whole answer -- unless the client goes away first: then the sequence is cancelled (its
        place and cache freed at once, not after ``max_tokens``) and the request counted as 499."""
        collect = asyncio.ensure_future(run.collect())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait((collect, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not collect.done():
                collect.cancel()
        if collect.cancelled() or not collect.done():
            with contextlib.suppress(asyncio.CancelledError):
                await collect  # its cleanup cancels the sequence in the engine
            self.metrics.observe_request(499, time.monotonic() - run.t0)
            return Response(status_code=499)
        try:
            text, reason, n = collect.result()
        except ServerError as e:
            return self._refuse(e, run.t0)
        except Exception:  # a bug: still an answer in the protocol's shape, and the trace in the log
            log.exception("generation request failed before its answer was sent")
            return self._refuse(ServerError("internal error"), run.t0)
        use = oa.usage(len(run.prompt), n)
        return _json(200, (oa.chat if chat else oa.completion)(rid, self.model_name, text, reason, use))


class _Run:
    """One admitted sequence: its steps turned into text, timed and counted."""

    def __init__(
        self, app: GenerationApp, t0: float, prompt: list[int], sampling: Sampling, stops: list[str],
        first: Step, steps: AsyncGenerator[Step, None],
    ) -> None:  # fmt: skip
        self.app, self.t0, self.prompt, self.sampling = app, t0, prompt, sampling
        self.first, self.steps = first, steps
        self.text = TextAssembler(app.tokenizer, stops)
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

    async def events(
        self, rid: str, chat: bool, include_usage: bool, continuous: bool
    ) -> AsyncIterator[bytes]:
        """The answer as server-sent events; ``continuous`` (vLLM's ``continuous_usage_stats``): every
        chunk carries the usage so far."""
        name, code = self.app.model_name, 499  # unless it ends: the client went away mid-stream

        def event(doc: dict[str, Any]) -> bytes:
            if continuous:
                doc["usage"] = oa.usage(len(self.prompt), self.generated)
            return _sse(doc)

        try:
            if chat:
                yield event(oa.chat_chunk(rid, name, {"role": "assistant"}, None))
            async for piece in self.pieces():
                if chat:
                    yield event(oa.chat_chunk(rid, name, {"content": piece}, None))
                else:
                    yield event(oa.completion(rid, name, piece, None, None))
            last = (
                oa.chat_chunk(rid, name, {}, self.reason)
                if chat
                else oa.completion(rid, name, "", self.reason, None)
            )
            yield event(last)
            if include_usage:
                use = oa.usage(len(self.prompt), self.generated)
                yield _sse(oa.usage_chunk(rid, name, last["object"], use))
            yield b"data: [DONE]\n\n"
            code = 200
        except Exception as e:  # after the 200: the stream ends with an error event
            code = 500  # the client sees it cut
            if not isinstance(e, ServerError):
                log.exception("stream %s failed", rid)
                e = ServerError("internal error")
            log.warning("stream %s failed: %s", rid, e)
            yield _sse(oa.error_doc(e))
        finally:
            # 499 (nginx's "client closed request"): not the server's failure, but counted
            self.app.metrics.observe_request(code, time.monotonic() - self.t0)
