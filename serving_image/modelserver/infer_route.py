"""The infer operations served past Starlette's stack (issue 26: the request path's own cost).

``POST /v2/models/{name}/infer`` and ``.../versions/{version}/infer`` are declared in FastAPI (so OpenAPI
documents them, :class:`modelserver.app.RawRoute`), but a request for them does not walk Starlette's
middleware stack and router -- ServerErrorMiddleware, ExceptionMiddleware, AsyncExitStackMiddleware, the
route table, ``request_response``'s wrappers, about a dozen coroutine layers per request. :class:`InferRoute`
matches the path once and calls the same endpoint inside the same request context
(:class:`modelserver.app.RequestContext`), mapping its exceptions through the application's own exception
handlers, looked up along the exception's MRO as Starlette does: the same answers, bytes and headers
(``tests/unit/server/test_infer_route.py`` sends each kind of request both ways and compares).

Anything else -- another method, a path with a ``root_path``, a trailing slash -- goes the usual way.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: the two infer paths, as the router's ``{model_name}`` and ``{model_version}`` (one path segment each)
INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer$")

Endpoint = Callable[[Request, str, "str | None"], Awaitable[Response]]
Handler = Callable[[Request, Any], Awaitable[Response]]


#: the scope key of the (model name, version or None) that :func:`infer_target` matched
TARGET = "modelserver.infer_target"


def infer_target(scope: Scope) -> tuple[str, str | None] | None:
    """(model name, version or None) of an infer request this route serves, else None."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    m = INFER_PATH.match(scope["path"])
    return None if m is None else (m["name"], m["version"])


class InferRoute:
    """``endpoint(request, name, version)`` as a plain ASGI app, its exceptions answered by ``handlers``
    (exception type -> handler, the application's ``exception_handlers``); one it has no handler for
    propagates (the request context logs it and answers 500)."""

    def __init__(self, app: ASGIApp, endpoint: Endpoint, handlers: Mapping[Any, Handler]) -> None:
        self.app = app  # Starlette's scope["app"]
        self.endpoint = endpoint
        self.handlers = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request whose ``scope[TARGET]`` the caller set from :func:`infer_target` (matched once)."""
        scope["app"] = self.app
        request = Request(scope, receive, send)
        try:
            response = await self.endpoint(request, *scope[TARGET])
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        for cls in type(exc).__mro__:
            if cls in self.handlers:
                return self.handlers[cls]
        return None
