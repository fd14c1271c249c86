"""The HTTP layer in-process (ASGI), with the built-in noop model: protocol, errors, metrics, drain."""

from __future__ import annotations

import asyncio
import gzip
import struct

import httpx
import orjson
import pytest
from fastapi import FastAPI
from modelserver.app import EXCEPTION_HANDLERS, ModelServerApp
from modelserver.config import load_settings
from modelserver.loader import create_model
from modelserver.service import ModelService


async def make_client(*args: str) -> tuple[httpx.AsyncClient, ModelService]:
    settings = load_settings(
        ["--model-name", "echo", "--model-version", "3", "--model-uri", "noop://", *args], environ={}
    )
    service = ModelService(settings, create_model(settings))
    app = ModelServerApp(service)
    await service.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
    return client, service


@pytest.fixture
async def client():
    c, svc = await make_client()
    yield c
    await c.aclose()
    await svc.drain()


def body(texts, **extra):
    return {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}], **extra}


async def test_health_and_metadata(client):
    assert (await client.get("/v2/health/live")).status_code == 200
    assert (await client.get("/v2/health/ready")).json() == {"ready": True}
    meta = (await client.get("/v2/models/echo")).json()
    assert meta["name"] == "echo" and meta["versions"] == ["3"]
    assert meta["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
    assert (await client.get("/v2/models/echo/versions/3")).status_code == 200
    assert (await client.get("/v2/models/echo/versions/3/ready")).json()["ready"] is True
    server = (await client.get("/v2")).json()
    assert server["name"] == "modelserver" and "binary_tensor_data" in server["extensions"]
    assert (await client.get("/openapi.json")).json()["openapi"].startswith("3.")


async def test_infer_json_roundtrip_and_request_id(client):
    r = await client.post(
        "/v2/models/echo/infer", json=body(["hello world", "x"], id="abc"), headers={"X-Request-ID": "rid-1"}
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "rid-1"
    doc = r.json()
    assert doc["id"] == "abc" and doc["model_version"] == "3"
    out = {o["name"]: o for o in doc["outputs"]}
    assert out["echo"]["data"] == ["hello world", "x"] and out["echo"]["shape"] == [2]
    assert out["length"]["data"] == [4, 3] and out["length"]["datatype"] == "INT64"
    r2 = await client.post("/v2/models/echo/versions/3/infer", json=body(["a"]))
    assert r2.status_code == 200 and len(r2.headers["x-request-id"]) == 32  # generated


async def test_requested_outputs_and_nested_data(client):
    req = {
        "inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [["a b"], ["c"]]}],
        "outputs": [{"name": "length"}],
    }
    doc = (await client.post("/v2/models/echo/infer", json=req)).json()
    assert [o["name"] for o in doc["outputs"]] == ["length"]
    assert doc["outputs"][0]["data"] == [4, 3]


async def test_binary_tensor_extension(client):
    texts = [b"hello", "\u00e9t\u00e9".encode()]
    raw = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "shape": [2],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "outputs": [{"name": "length", "parameters": {"binary_data": True}}, {"name": "echo"}],
        }
    )
    r = await client.post(
        "/v2/models/echo/infer",
        content=header + raw,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 200
    hl = int(r.headers["inference-header-content-length"])
    doc = orjson.loads(r.content[:hl])
    out = {o["name"]: o for o in doc["outputs"]}
    assert out["length"]["parameters"]["binary_data_size"] == 16
    assert struct.unpack("<2q", r.content[hl:]) == (3, 3)
    assert out["echo"]["data"] == ["hello", "\u00e9t\u00e9"]


async def test_gzip_request_body(client):
    r = await client.post(
        "/v2/models/echo/infer",
        content=gzip.compress(orjson.dumps(body(["zipped"]))),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == ["zipped"]


def one(name="text", shape=(1,), datatype="BYTES", data=("a",)):
    return orjson.dumps(
        {"inputs": [{"name": name, "shape": list(shape), "datatype": datatype, "data": list(data)}]}
    )


BAD = [
    ("malformed json", b"{not json", 400),
    ("empty body", b"", 400),
    ("not an object", b"[1,2]", 400),
    ("no inputs", orjson.dumps({"inputs": []}), 400),
    ("wrong datatype", one(datatype="FP32", data=[1]), 400),
    ("shape mismatch", one(shape=[3]), 400),
    ("empty batch", one(shape=[0], data=[]), 400),
    ("numbers as BYTES", one(data=[1]), 400),
    ("unknown input", one(name="x"), 400),
    ("unknown output", orjson.dumps({**body(["a"]), "outputs": [{"name": "nope"}]}), 400),
    ("bad priority", orjson.dumps({**body(["a"]), "parameters": {"priority": 99}}), 400),
    ("negative timeout", orjson.dumps({**body(["a"]), "parameters": {"timeout_ms": -5}}), 400),
    ("3-d text", one(shape=[1, 1, 1]), 400),
]


@pytest.mark.parametrize(("case", "payload", "status"), BAD, ids=[b[0] for b in BAD])
async def test_bad_inputs_give_4xx_json_error(client, case, payload, status):
    r = await client.post("/v2/models/echo/infer", content=payload)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["error"], str) and r.json()["error"]


async def test_unknown_model_version_route_method(client):
    for path in ("/v2/models/other/infer", "/v2/models/echo/versions/9/infer"):
        r = await client.post(path, json=body(["a"]))
        assert r.status_code == 404 and "error" in r.json()
    assert (await client.get("/v2/models/other")).status_code == 404
    assert (await client.get("/nope")).json()["error"]
    r = await client.delete("/v2/health/live")
    assert r.status_code == 405 and "error" in r.json()


async def test_metrics_contract(client):
    await client.post("/v2/models/echo/infer", json=body(["a", "b c"]))
    await client.post("/v2/models/echo/infer", content=b"{")
    text = (await client.get("/metrics")).text
    lbl = 'model="echo",version="3"'
    for needle in (
        f'modelserver_requests_total{{code="200",{lbl}}} 1.0',
        f'modelserver_requests_total{{code="400",{lbl}}} 1.0',
        f"modelserver_request_duration_seconds_count{{{lbl}}} 2.0",
        f"modelserver_queue_wait_seconds_count{{{lbl}}} 2.0",
        f"modelserver_batch_size_count{{{lbl}}}",
        f"modelserver_inference_duration_seconds_count{{{lbl}}}",
        f"modelserver_queue_depth{{{lbl}}} 0.0",
        'modelserver_rejected_total{model="echo",reason="queue_full",version="3"} 0.0',
        f"modelserver_padding_ratio_count{{{lbl}}}",
        "process_cpu_seconds_total",
    ):
        assert needle in text, needle


async def test_inflight_counts_infer_requests_until_answered():
    """The concurrency an autoscaler scales on: requests in the server (queued or running), back to 0."""
    c, svc = await make_client("--model-uri", "noop://?delay_ms=300", "--max-batch-size", "1")
    try:
        gauge = svc.metrics.inflight
        reqs = [asyncio.create_task(c.post("/v2/models/echo/infer", json=body([t]))) for t in "abc"]
        for _ in range(200):
            if gauge._value.get() == 3:
                break
            await asyncio.sleep(0.005)
        assert gauge._value.get() == 3
        await c.get("/v2/health/ready")  # not an infer request: not counted
        assert gauge._value.get() == 3
        assert [r.status_code for r in await asyncio.gather(*reqs)] == [200, 200, 200]
        await c.post("/v2/models/echo/infer", content=b"{")  # refused: counted while it was in, then out
        assert gauge._value.get() == 0
        assert 'modelserver_inflight_requests{model="echo",version="3"} 0.0' in (await c.get("/metrics")).text
    finally:
        await c.aclose()
        await svc.drain()


async def test_cache_serves_repeats_without_the_model():
    c, svc = await make_client("--cache-size", "16")
    try:
        await c.post("/v2/models/echo/infer", json=body(["same"]))
        batches = svc.worker.batches
        r = await c.post("/v2/models/echo/infer", json=body(["same"]))
        assert r.json()["outputs"][0]["data"] == ["same"]
        assert svc.worker.batches == batches and svc.cache.hits == 1
    finally:
        await c.aclose()
        await svc.drain()


async def test_failing_item_errors_alone_and_server_stays_up():
    c, svc = await make_client(
        "--model-uri", "noop://?fail_text=poison&delay_ms=20", "--max-queue-delay-ms", "50"
    )
    try:
        reqs = [c.post("/v2/models/echo/infer", json=body([t])) for t in ("a", "poison", "b", "c")]
        rs = await asyncio.gather(*reqs)
        assert [r.status_code for r in rs] == [200, 500, 200, 200]
        assert "model error" in rs[1].json()["error"]
        assert (await c.post("/v2/models/echo/infer", json=body(["d"]))).status_code == 200
    finally:
        await c.aclose()
        await svc.drain()


async def test_too_long_input_413_names_the_limit():
    c, svc = await make_client("--max-sequence-length", "8")
    try:
        r = await c.post("/v2/models/echo/infer", json=body(["fits", "w " * 50]))
        assert r.status_code == 413
        assert "52 tokens" in r.json()["error"] and "maximum sequence length 8" in r.json()["error"]
        assert (await c.post("/v2/models/echo/infer", json=body(["w " * 6]))).status_code == 200
    finally:
        await c.aclose()
        await svc.drain()


async def test_queue_full_and_draining_are_503_with_retry_after():
    c, svc = await make_client(
        "--model-uri", "noop://?delay_ms=300", "--max-queue-size", "2", "--max-batch-size", "1"
    )
    try:
        first = asyncio.ensure_future(c.post("/v2/models/echo/infer", json=body(["a", "b"])))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if svc.worker.batches or svc.queue.in_flight_s:
                break
        r = await c.post("/v2/models/echo/infer", json=body(["c", "d"]))
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert "queue full" in r.json()["error"]
        drain = asyncio.ensure_future(svc.drain())
        await asyncio.sleep(0)
        r = await c.post("/v2/models/echo/infer", json=body(["e"]))
        assert r.status_code == 503 and "retry-after" in r.headers
        assert (await c.get("/v2/health/ready")).status_code == 503
        assert (await first).status_code == 200  # accepted before the drain: finished
        await drain
    finally:
        await c.aclose()


async def test_deadline_504_and_429():
    c, svc = await make_client("--model-uri", "noop://?delay_ms=200", "--max-batch-size", "1")
    try:
        slow = asyncio.ensure_future(c.post("/v2/models/echo/infer", json=body(["a"])))
        for _ in range(200):
            await asyncio.sleep(0.005)
            if svc.queue.in_flight_s:
                break
        # queued behind a running 200 ms batch with a 50 ms deadline: either rejected up front (429,
        # the cost model knows the batch takes ~200 ms) or expired in the queue (504)
        r = await c.post("/v2/models/echo/infer", json=body(["b"], parameters={"timeout_ms": 50}))
        assert r.status_code in (429, 504), r.text
        assert "deadline" in r.json()["error"]
        assert (await slow).status_code == 200
    finally:
        await c.aclose()
        await svc.drain()


async def test_openapi_is_generated_from_the_protocol_models(client):
    doc = (await client.get("/openapi.json")).json()
    schemas = doc["components"]["schemas"]
    ops = {f"{m.upper()} {p}": op for p, item in doc["paths"].items() for m, op in item.items()}
    assert len(ops) == 13  # the hidden aliases (/v2/, versions/{v}/config|stats) are not documented
    embeddings = ops["POST /v1/embeddings"]["requestBody"]["content"]["application/json"]["schema"]
    assert embeddings == {"$ref": "#/components/schemas/EmbeddingRequest"}
    assert schemas["EmbeddingRequest"]["required"] == ["model", "input"]  # as OpenAI requires them
    infer = ops["POST /v2/models/{model_name}/infer"]
    body = infer["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/InferenceRequest"}
    assert schemas["InferenceRequest"]["required"] == ["inputs"]
    assert "BYTES" in schemas["RequestInput"]["properties"]["datatype"]["enum"]
    assert infer["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/InferenceResponse"
    )
    assert {"400", "404", "413", "415", "429", "500", "503", "504"} <= set(infer["responses"])
    assert all("422" not in op["responses"] for op in ops.values())  # bad input is 400, not FastAPI's 422

    def refs(node):
        if isinstance(node, dict):
            yield from (v for k, v in node.items() if k == "$ref")
            for v in node.values():
                yield from refs(v)
        elif isinstance(node, list):
            for v in node:
                yield from refs(v)

    assert all(r.removeprefix("#/components/schemas/") in schemas for r in refs(doc))


async def test_head_is_served_as_get_and_a_wrong_method_names_the_allowed_one(client):
    r = await client.head("/v2/health/ready")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    r = await client.post("/v2/models/echo/ready")
    assert r.status_code == 405 and r.headers["allow"] == "GET" and r.json()["error"]
    r = await client.get("/v2/models/echo/infer")
    assert r.status_code == 405 and r.json() == {"error": "use POST for infer"}
    assert (await client.get("/v2/")).json()["name"] == "modelserver"
    assert (await client.get("/v2/models/echo/versions/3/stats")).json()["model"] == "echo"


async def test_a_gzip_bomb_is_a_413_with_an_error_body(client, monkeypatch):
    """64 MiB of zeros compressed to about 64 KiB: refused with 413 once the inflated size passes the
    body cap (lowered here to keep the test small), never inflated whole."""
    import modelserver.app as app_module

    monkeypatch.setattr(app_module, "MAX_BODY", 1024 * 1024)
    r = await client.post(
        "/v2/models/echo/infer",
        content=gzip.compress(bytes(64 * 1024 * 1024), compresslevel=1),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 413 and "inflates to more than" in r.json()["error"]
    ok = await client.post("/v2/models/echo/infer", json=body(["after"]))
    assert ok.status_code == 200  # the server is unharmed


async def test_a_request_with_more_items_than_the_queue_holds_is_a_413_before_preprocessing():
    """Never admissible whatever the load: refused at once, nothing of it tokenized."""
    client, svc = await make_client("--max-queue-size", "8")
    seen: list[int] = []
    preprocess = svc.model.preprocess
    svc.model.preprocess = lambda inputs: seen.append(len(inputs["text"])) or preprocess(inputs)  # type: ignore[method-assign]
    try:
        r = await client.post("/v2/models/echo/infer", json=body(["x"] * 9))
        assert r.status_code == 413 and r.json() == {
            "error": "the request has 9 items; one request may hold at most 8"
        }
        assert seen == []
        assert (await client.post("/v2/models/echo/infer", json=body(["x"] * 8))).status_code == 200
        assert seen == [8]
        metrics = (await client.get("/metrics")).text
        assert 'reason="too_many_items",version="3"} 1.0' in metrics
    finally:
        await client.aclose()
        await svc.drain()


async def test_requests_beyond_max_concurrent_requests_get_503_with_retry_after():
    """The limit counts requests from their arrival at the app to their answer; failed ones leave it."""
    client, svc = await make_client("--max-concurrent-requests", "2")
    app = client._transport.app  # type: ignore[attr-defined]
    release = asyncio.Event()
    infer = svc.infer

    async def held(*args, **kw):
        await release.wait()
        return await infer(*args, **kw)

    svc.infer = held  # type: ignore[method-assign]
    try:
        for _ in range(3):
            assert (await client.post("/v2/models/other/infer", json=body(["x"]))).status_code == 404
        assert app.door.inside == 0
        first = [
            asyncio.create_task(client.post("/v2/models/echo/infer", json=body([f"t{i}"]))) for i in (1, 2)
        ]
        for _ in range(200):
            if app.door.inside == 2:
                break
            await asyncio.sleep(0.01)
        r = await client.post("/v2/models/echo/infer", json=body(["third"]))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert r.json() == {"error": "2 requests in flight (max_concurrent_requests)"}
        release.set()
        answers = await asyncio.wait_for(asyncio.gather(*first), 5)
        assert [a.status_code for a in answers] == [200, 200] and app.door.inside == 0
        assert (await client.post("/v2/models/echo/infer", json=body(["later"]))).status_code == 200
        assert 'reason="overloaded",version="3"} 1.0' in (await client.get("/metrics")).text
    finally:
        release.set()
        await client.aclose()
        await svc.drain()


async def test_a_large_input_is_preprocessed_off_the_event_loop():
    """Above OFF_LOOP_BYTES the tokenizing runs on the service's preprocess thread; small inputs do not
    pay the thread hop."""
    import threading

    client, svc = await make_client()
    threads: list[str] = []
    preprocess = svc.model.preprocess

    def spy(inputs):
        threads.append(threading.current_thread().name)
        return preprocess(inputs)

    svc.model.preprocess = spy  # type: ignore[method-assign]
    try:
        assert (await client.post("/v2/models/echo/infer", json=body(["small"]))).status_code == 200
        assert (await client.post("/v2/models/echo/infer", json=body(["x" * 70_000]))).status_code == 200
        assert threads[0] == threading.current_thread().name and threads[1].startswith("preprocess")
    finally:
        await client.aclose()
        await svc.drain()


async def test_a_parameter_fastapi_refuses_is_a_400_with_an_error() -> None:
    """The server's exception handlers on an app with a typed query parameter (no route of the server has
    one today): FastAPI's refusal is answered like every other bad input."""
    app = FastAPI(exception_handlers=EXCEPTION_HANDLERS)

    @app.get("/typed")
    async def typed(n: int) -> dict[str, int]:
        return {"n": n}

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        ok = await client.get("/typed", params={"n": "3"})
        bad = await client.get("/typed", params={"n": "three"})
    assert (ok.status_code, ok.json()) == (200, {"n": 3})
    assert bad.status_code == 400
    body = bad.json()
    assert set(body) == {"error"} and body["error"].startswith("query.n: "), body


def _burn(seconds: float) -> None:
    import time

    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def test_cpu_seconds_count_tokenize_and_inference_thread_time() -> None:
    """``modelserver_cpu_seconds_total{part}`` (issue 26's CPU split): the thread CPU spent in the model's
    preprocess and in the batch forward, each counted where it runs (the event loop, the inference thread)."""
    client, svc = await make_client()
    preprocess, predict = svc.model.preprocess, svc.model.predict

    def slow_preprocess(inputs):
        _burn(0.05)
        return preprocess(inputs)

    def slow_predict(payloads):
        _burn(0.08)
        return predict(payloads)

    svc.model.preprocess = slow_preprocess  # type: ignore[method-assign]
    svc.worker.predict = slow_predict
    try:
        assert (await client.post("/v2/models/echo/infer", json=body(["a"]))).status_code == 200
        text = (await client.get("/metrics")).text
        got = {}
        for part in ("tokenize", "inference"):
            line = next(
                ln
                for ln in text.splitlines()
                if ln.startswith("modelserver_cpu_seconds_total") and part in ln
            )
            got[part] = float(line.rsplit(" ", 1)[1])
        assert 0.05 <= got["tokenize"] < 0.5, got
        assert 0.08 <= got["inference"] < 0.5, got
    finally:
        await client.aclose()
        await svc.drain()
