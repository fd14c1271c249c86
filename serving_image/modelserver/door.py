"""Shedding at the door (issue 26): the first thing the application does with an HTTP request.

Every request gets its arrival time (``time.monotonic()``, in ``scope[ARRIVAL]``) the moment the ASGI
application is called, before routing, middleware or any body is read: an infer request's deadline counts
from there (:meth:`modelserver.service.ModelService.infer`), so time spent reading, decoding and
tokenizing is part of it, not only the time in the batch queue.

Infer requests (``POST .../infer`` and ``/v1/embeddings``) are counted from that moment to their answer;
beyond ``max_concurrent_requests`` the door answers ``503`` with ``Retry-After`` and ``{"error": ...}``
itself, with two ASGI messages built from constants: no routing, no middleware, no JSON decoding -- a
refusal costs the event loop a few microseconds, so an overloaded server spends its CPU on the requests it
admitted.

The refusal still reads the request's body (and drops it, :func:`drain_body`) before it answers: answered
and closed before the body came, the server's kernel would answer the body with a reset, and behind
kube-proxy a reset leaves a conntrack entry that a new connection reusing the client's port follows to
this pod, even once the pod is gone (tests/integration/server/test_early_answers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.types import Receive, Scope, Send

#: the scope key of a request's arrival time (``time.monotonic()``)
ARRIVAL = "modelserver.arrival"
#: OpenAI's embeddings route (modelserver.openai_embeddings): counted and limited as infer requests are
EMBEDDINGS_PATH = "/v1/embeddings"
RID_OK = re.compile(r"^[\x21-\x7e]{1,128}$")


#: how long an answer that needs no body waits for the rest of it (then it answers anyway)
DRAIN_TIMEOUT_S = 1.0
#: the largest request body the server reads (beyond it: 413), and the most an early answer drops
MAX_BODY = 64 * 1024 * 1024


async def drain_body(receive: Receive, limit: int = MAX_BODY, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """Read and drop the request's body before an answer given without it (a refusal, an unknown model).

    Clients write a request's head and body in two writes; answered and closed (``Connection: close``)
    before the body arrived, the socket meets the body closed and the kernel resets the connection.
    Behind kube-proxy the reset leaves the connection's conntrack entry in CLOSE, which a new connection
    from the same client port does not reopen: it follows the entry's old translation to this pod, or to
    its address once the pod is gone (ENETUNREACH). Bounded, so a client that never sends its body (or
    sends too much) holds nothing: at most ``limit`` bytes, for at most ``timeout_s`` seconds. Only for a
    request whose body nothing has read yet (after the body, ``receive`` waits for the disconnect)."""

    async def drop() -> None:
        size = 0
        while size <= limit:
            msg = await receive()
            if msg["type"] != "http.request":
                return
            size += len(msg.get("body", b""))
            if not msg.get("more_body", False):
                return

    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):  # no task of its own: a body already there costs no loop turn
            await drop()


def request_id(scope: Scope) -> str:
    """The caller's ``X-Request-ID`` when it is printable ASCII of at most 128 characters, else a new one."""
    rid = None
    for k, v in scope["headers"]:
        if k == b"x-request-id":
            s = v.decode("latin-1")
            if RID_OK.match(s):
                rid = s
    return rid if rid is not None else uuid.uuid4().hex


def is_infer(scope: Scope) -> bool:
    path = scope["path"]
    return scope["method"] == "POST" and (path.endswith("/infer") or path == EMBEDDINGS_PATH)


def arrival(scope: Scope) -> float | None:
    """The request's arrival time, when the door saw it (None for a request that bypassed it)."""
    t = scope.get(ARRIVAL)
    return t if isinstance(t, float) else None


class Door:
    """The concurrency bound of the HTTP layer: at most ``limit`` infer requests inside the application.

    ``on_refused(seconds)`` is called for every refusal (the server counts it in its metrics);
    ``extra_headers`` are added to the refusal (the revision header). ``counts`` says which requests are
    bounded (the encoders' infer requests unless told) and ``body`` is the refusal's JSON, for a protocol
    with its own error shape (the generation server's OpenAI errors, modelserver.gen_app)."""

    def __init__(
        self,
        limit: int,
        on_refused: Callable[[], None] | None = None,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
        retry_after_s: int = 1,
        counts: Callable[[Scope], bool] = is_infer,
        body: bytes | None = None,
    ) -> None:
        self.limit = limit
        self.inside = 0  # infer requests admitted and not yet answered
        self.refused = 0
        self.on_refused = on_refused
        self.counts = counts
        self.clock: Callable[[], float] = time.monotonic
        if body is None:
            body = orjson.dumps({"error": f"{limit} requests in flight (max_concurrent_requests)"})
        self._body = body
        self._headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry_after_s).encode()),
            *(extra_headers or []),
        ]

    async def __call__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Stamp the arrival, then admit ``scope`` into ``app`` or refuse it at once."""
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        scope[ARRIVAL] = self.clock()
        if not self.counts(scope):
            await app(scope, receive, send)
            return
        if self.inside >= self.limit:
            await drain_body(receive)
            await self.refuse(scope, send)
            return
        self.inside += 1
        try:
            await app(scope, receive, send)
        finally:
            self.inside -= 1

    async def refuse(self, scope: Scope, send: Send) -> None:
        self.refused += 1
        if self.on_refused is not None:
            self.on_refused()
        headers: list[Any] = [*self._headers, (b"x-request-id", request_id(scope).encode())]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": self._body})
