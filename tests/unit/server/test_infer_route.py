"""The infer route past Starlette's stack (modelserver.infer_route) answers every request exactly as the
declared FastAPI route does: each request below is sent both ways to one application and the status, the
headers (but the request id, which the request sets) and the body must be the same."""

from __future__ import annotations

import gzip

import httpx
import orjson
import pytest
from fastapi import FastAPI
from modelserver.app import ModelServerApp
from modelserver.config import load_settings
from modelserver.infer_route import infer_target
from modelserver.loader import create_model
from modelserver.service import ModelService
from starlette.types import Receive, Scope, Send


def body(texts: list[str], **extra: object) -> bytes:
    doc = {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}], **extra}
    return orjson.dumps(doc)


OK = body(["hello world", "a second text"])
#: (method, path, headers, body): every kind of answer the infer operations give
REQUESTS = [
    ("POST", "/v2/models/echo/infer", {}, OK),
    ("POST", "/v2/models/echo/versions/3/infer", {}, OK),
    ("POST", "/v2/models/echo/infer", {"content-encoding": "gzip"}, gzip.compress(OK)),
    ("POST", "/v2/models/echo/infer", {}, body(["x"], outputs=[{"name": "echo"}])),
    ("POST", "/v2/models/echo/infer", {}, body(["x"], parameters={"priority": 1, "timeout_ms": 5000})),
    ("POST", "/v2/models/echo/infer", {}, b"{"),  # 400: not JSON
    ("POST", "/v2/models/echo/infer", {}, body(["x"], outputs=[{"name": "nope"}])),  # 400: unknown output
    ("POST", "/v2/models/echo/infer", {}, body(["x"], parameters={"priority": 99})),  # 400: priority
    ("POST", "/v2/models/other/infer", {}, OK),  # 404: unknown model
    ("POST", "/v2/models/echo/versions/9/infer", {}, OK),  # 404: unknown version
    ("POST", "/v2/models/echo/infer", {}, body(["x"] * 5000)),  # 413: more items than the queue holds
    ("POST", "/v2/models/echo/infer", {"content-encoding": "br-nope"}, OK),  # 415
    ("POST", "/v2/models/echo/infer", {"x-request-id": "caller-7"}, OK),  # the caller's request id
    ("GET", "/v2/models/echo/infer", {}, b""),  # 405: not this route, the usual way both times
    ("POST", "/v2/models/echo/infer/", {}, OK),  # 404: no redirect of slashes
]


@pytest.fixture
async def app():
    args = ["--model-name", "echo", "--model-version", "3", "--model-uri", "noop://"]
    settings = load_settings(args, environ={})
    service = ModelService(settings, create_model(settings))
    app = ModelServerApp(service)
    await service.start()
    yield app
    await service.drain()


def through_starlette(app: ModelServerApp):
    """The same application, every request through Starlette's stack and the declared route."""

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        await app.door(lambda s, r, w: FastAPI.__call__(app, s, r, w), scope, receive, send)

    return asgi


def seen(r: httpx.Response) -> tuple[int, dict[str, str], bytes]:
    headers = {k: v for k, v in r.headers.items() if k != "x-request-id" or r.request.headers.get(k)}
    return r.status_code, headers, r.content


async def test_every_infer_answer_is_the_declared_routes(app):
    taken = []  # the requests the infer route served
    route = app._infer_route

    async def counted(scope: Scope, receive: Receive, send: Send) -> None:
        taken.append(scope["path"])
        await route(scope, receive, send)

    app._infer_route = counted
    fast = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    slow = httpx.AsyncClient(transport=httpx.ASGITransport(app=through_starlette(app)), base_url="http://t")
    statuses = []
    for method, path, headers, content in REQUESTS:
        a = await fast.request(method, path, headers=headers, content=content)
        b = await slow.request(method, path, headers=headers, content=content)
        assert seen(a) == seen(b), (method, path, content[:60])
        statuses.append(a.status_code)
    # the list plays every kind of answer: were one of them to change, this says which
    assert statuses == [200, 200, 200, 200, 200, 400, 400, 400, 404, 404, 413, 415, 200, 405, 404]
    assert len(taken) == 13  # all but the GET and the trailing slash went past Starlette's stack
    assert (await fast.post("/v2/models/echo/infer", content=OK)).headers["x-request-id"]  # a new one


def test_only_the_two_infer_paths_take_the_route():
    def scope(method: str, path: str, root_path: str = "") -> dict[str, object]:
        return {"type": "http", "method": method, "path": path, "root_path": root_path}

    assert infer_target(scope("POST", "/v2/models/m/infer")) == ("m", None)
    assert infer_target(scope("POST", "/v2/models/m/versions/2/infer")) == ("m", "2")
    assert infer_target(scope("GET", "/v2/models/m/infer")) is None
    assert infer_target(scope("POST", "/v2/models/m/infer/")) is None
    assert infer_target(scope("POST", "/v2/models/a/b/infer")) is None
    assert infer_target(scope("POST", "/v1/embeddings")) is None
    assert infer_target(scope("POST", "/v2/models/m/infer", root_path="/api")) is None
    assert infer_target({"type": "lifespan"}) is None


async def test_an_unexpected_error_is_the_same_500_both_ways(app, monkeypatch):
    async def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(app.service, "infer", broken)
    fast = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    slow = httpx.AsyncClient(transport=httpx.ASGITransport(app=through_starlette(app)), base_url="http://t")
    a = await fast.post("/v2/models/echo/infer", content=OK)
    b = await slow.post("/v2/models/echo/infer", content=OK)
    assert seen(a) == seen(b)
    assert (a.status_code, a.json()) == (500, {"error": "internal server error"})
