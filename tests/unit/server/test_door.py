"""Shedding at the door (issue 26): the in-flight bound before anything else, the deadline from arrival,
and no work on a request whose answer would come after its deadline -- played with overload in-process."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import httpx
import orjson
import pytest
from conftest import fixed_cost
from modelserver.app import ModelServerApp
from modelserver.batching import OVERRUN_HALF_LIFE_S, Batch, DeadlineExpired
from modelserver.config import load_settings
from modelserver.door import drain_body
from modelserver.loader import create_model
from modelserver.service import ModelService


async def make_app(*args: str) -> tuple[ModelServerApp, ModelService]:
    settings = load_settings(
        ["--model-name", "echo", "--model-version", "3", "--model-uri", "noop://", *args], environ={}
    )
    service = ModelService(settings, create_model(settings))
    app = ModelServerApp(service)
    await service.start()
    return app, service


def body(texts: list[str], **params: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": texts}]
    }
    if params:
        doc["parameters"] = params
    return doc


def counting(svc: ModelService) -> list[int]:
    """The items each batch the model ran held."""
    ran: list[int] = []
    assert svc.worker is not None
    predict = svc.worker.predict

    def spy(payloads: list[Any]) -> Any:
        ran.append(len(payloads))
        return predict(payloads)

    svc.worker.predict = spy
    return ran


async def test_the_deadline_counts_from_the_arrival_at_the_door() -> None:
    """A request that arrived 10 s before it reached the service (a stalled event loop, a slow body) with a
    1 s timeout is answered 504 + Retry-After and never runs; counted from the service, it would have run."""
    app, svc = await make_app()
    ran = counting(svc)
    app.door.clock = lambda: time.monotonic() - 10.0
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")
    try:
        r = await client.post("/v2/models/echo/infer", json=body(["late"], timeout_ms=1000))
        assert r.status_code == 504, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert "before the request reached the queue" in r.json()["error"]
        assert ran == []
        app.door.clock = time.monotonic
        assert (await client.post("/v2/models/echo/infer", json=body(["on time"]))).status_code == 200
        assert ran == [1]
        assert 'reason="timeout",version="3"} 1.0' in (await client.get("/metrics")).text
    finally:
        await client.aclose()
        await svc.drain()


async def test_beyond_the_bound_the_door_answers_without_decoding_or_routing() -> None:
    """With the bound reached, a request is answered 503 + Retry-After with a JSON error by the door itself:
    its body is read to its end and dropped (answered before it, the body would meet a closed socket and a
    reset: tests/integration/server/test_early_answers.py) and only then answered, the application's
    middleware never sees it (the in-flight gauge does not move), and it is counted as overloaded."""
    app, svc = await make_app("--max-concurrent-requests", "2")
    app.door.inside = 2  # two requests admitted and not yet answered
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": b"x" * 60, "more_body": True}]
    chunks.append({"type": "http.request", "body": b"x" * 40, "more_body": False})

    async def receive() -> dict[str, Any]:
        assert not sent, "the door answered before the body came"
        if not chunks:
            raise AssertionError("the door read past the end of the body")
        return chunks.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v2/models/echo/infer",
        "headers": [(b"x-request-id", b"abc-1"), (b"content-length", b"100")],
        "query_string": b"",
    }
    try:
        await app(scope, receive, send)
        start, end = sent
        assert start["status"] == 503
        headers = dict(start["headers"])
        assert headers[b"retry-after"] == b"1" and headers[b"x-request-id"] == b"abc-1"
        assert headers[b"content-type"] == b"application/json"
        assert orjson.loads(end["body"]) == {"error": "2 requests in flight (max_concurrent_requests)"}
        assert int(headers[b"content-length"]) == len(end["body"])
        assert svc.metrics.inflight._value.get() == 0
        assert app.door.inside == 2 and app.door.refused == 1
        assert chunks == []  # the whole body was read
        text = svc.metrics.exposition().decode()
        assert 'reason="overloaded",version="3"} 1.0' in text
        assert 'modelserver_requests_total{code="503",model="echo",version="3"} 1.0' in text
    finally:
        app.door.inside = 0
        await svc.drain()


async def test_a_batch_does_not_run_items_it_would_finish_after_their_deadline(make_queue, make_item, clock):
    """At dispatch, an item whose deadline falls before the batch's predicted end (by the cost model) fails
    504 + Retry-After and is left out; the others run."""
    q = make_queue(cost=fixed_cost(c0=0.05, c2=0.0), max_queue_delay_s=0.0)
    tight = make_item(length=8, timeout=0.2)
    ok = [make_item(length=8, timeout=5.0) for _ in range(2)]
    q.submit([tight, *ok])
    clock.advance(0.17)  # 30 ms left for a 50 ms batch
    batch = q.try_form()
    assert batch is not None and not isinstance(batch, float)
    assert batch.items == ok
    assert tight.future is not None and isinstance(tight.future.exception(), DeadlineExpired)
    exc = tight.future.exception()
    assert exc.status == 504 and exc.retry_after is not None and exc.retry_after >= 1  # type: ignore[union-attr]
    assert q.depth == 0


async def test_a_batch_of_only_late_items_is_skipped_for_the_next(make_queue, make_item, clock):
    q = make_queue(cost=fixed_cost(c0=0.05, c2=0.0), max_queue_delay_s=0.0, max_batch_size=1)
    late = make_item(length=8, timeout=0.04)
    fine = make_item(length=8, timeout=5.0)
    q.submit([fine])  # admitted first; the late one is at risk, so it seeds the first batch
    late.deadline = clock() + 0.04
    q._items.append(late)
    late.queued = True
    batch = q.try_form()
    assert batch is not None and not isinstance(batch, float) and batch.items == [fine]
    assert late.future is not None and isinstance(late.future.exception(), DeadlineExpired)


async def test_a_batch_that_handed_back_late_makes_the_next_dispatch_check_stricter(
    make_queue, make_item, clock
):
    """The dispatch check adds how much later than predicted recent batches handed their answers back (a
    maximum that halves every ``OVERRUN_HALF_LIFE_S``): an item that fits the cost model's time alone, but
    not that time plus the overrun just seen, is failed 504, not run late."""
    q = make_queue(cost=fixed_cost(c0=0.05, c2=0.0), max_queue_delay_s=0.0)
    first = make_item(length=8, timeout=5.0)
    q.submit([first])
    batch = q.try_form()
    assert batch is not None and not isinstance(batch, float) and batch.items == [first]
    clock.advance(0.07)  # predicted 50 ms, handed back after 70
    q.record_answered(batch, 0.05)
    assert q.overrun_s == pytest.approx(0.02)
    tight, loose = make_item(length=8, timeout=0.06), make_item(length=8, timeout=0.08)
    q.submit([tight, loose])  # 50 ms fits 60, but 50 + 20 does not
    batch = q.try_form()
    assert batch is not None and not isinstance(batch, float) and batch.items == [loose]
    assert tight.future is not None and isinstance(tight.future.exception(), DeadlineExpired)
    clock.advance(0.05)
    q.record_answered(batch, 0.05)  # on time: the margin fades with time, it does not drop to 0
    assert q.overrun_s == pytest.approx(0.02 * 0.5 ** (0.05 / OVERRUN_HALF_LIFE_S))


async def test_a_stall_longer_than_the_deadline_does_not_leave_every_later_request_failed(
    make_queue, make_item, clock
):
    """One batch handed back 1.5 s late (the process was stopped: a throttled or frozen pod) raises the
    margin past a 1 s deadline, so the next batches are failed at dispatch and none is answered. The margin
    fades with time all the same: a request that comes a second later is served. (It faded only as batches
    were answered before, and no batch was: every later request was a 504, for good.)"""
    q = make_queue(cost=fixed_cost(c0=0.01, c2=0.0), max_queue_delay_s=0.0)
    stalled = make_item(length=8, timeout=5.0)
    q.submit([stalled])
    batch = q.try_form()
    assert isinstance(batch, Batch)
    clock.advance(1.51)
    q.record_answered(batch, 0.01)
    assert q.overrun_s == pytest.approx(1.5)
    right_after = make_item(length=8, timeout=1.0)
    q.submit([right_after])
    assert q.try_form() is None  # failed at dispatch: the margin says it would be late
    assert isinstance(right_after.future.exception(), DeadlineExpired)
    clock.advance(1.0)
    later = make_item(length=8, timeout=1.0)
    q.submit([later])
    batch = q.try_form()
    assert isinstance(batch, Batch) and batch.items == [later]
    assert q.overrun_s < 0.1


async def test_what_start_up_built_is_out_of_the_collectors_view_once_the_model_is_ready() -> None:
    """A full collection scans every tracked object: with torch and MiniLM loaded, 410,000 of them and
    180 ms in which neither the event loop nor the inference thread runs (measured); frozen once the model
    is ready, it scans what requests create. (Without the freeze the in-process overload test below, then
    with a 150 ms deadline, failed about one run in two on a quiet machine: a full collection of the test
    process held the first batch past the deadline.)"""
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    _, svc = await make_app()
    try:
        assert svc.ready
        assert gc.get_freeze_count() > 1000
    finally:
        await svc.drain()


#: how late a hand-back may be against the deadline its batch was predicted to meet (see below)
PREDICTION_SLACK_S = 0.005


async def test_overload_played_in_process_every_answer_in_time_the_rest_refused_and_never_run() -> None:
    """120 requests at once at a server that runs 4 items per 30 ms batch, admits 16 and gives each 300 ms:
    the door refuses most at once, the queue refuses or expires what
    cannot be served in time, and every request answered 200 had its answer handed back by the batch worker
    by its deadline (the server's own clock: arrival + 300 ms); every other answer is 503, 429 or 504 with
    Retry-After and a JSON error, and the model ran exactly the items answered 200.

    "By its deadline" is within ``PREDICTION_SLACK_S``: the check that drops an item is a prediction made
    when its batch is formed (the cost model plus the hand-back overrun recent batches showed), and on a
    loaded two-core machine a batch can hand back a few ms later than any batch before it. The check's
    arithmetic is played exactly, on a manual clock, by the tests above and below. (300 ms, not the 150 it
    was: beside a Go build on the two cores, the 120 requests' own HTTP work in this process took longer than
    150 ms and no batch could be served in time.)"""
    app, svc = await make_app(
        "--model-uri", "noop://?delay_ms=30", "--max-batch-size", "4", "--max-concurrent-requests", "16"
    )
    ran = counting(svc)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=httpx.Timeout(30.0)
    )
    deadlines: dict[str, float] = {}  # request id -> its arrival + 300 ms
    handed_back: dict[str, float] = {}  # request id -> when the worker handed its answer back
    orig_infer, queue = svc.infer, svc.queue
    assert queue is not None
    orig_answered = queue.record_answered

    async def infer(*args: Any, **kw: Any) -> Any:
        deadlines[args[3]] = kw["arrival"] + 0.3
        return await orig_infer(*args, **kw)

    def answered(batch: Any, predicted_s: float) -> None:
        handed_back.update({it.request_id: time.monotonic() for it in batch.items})
        orig_answered(batch, predicted_s)

    svc.infer = infer  # type: ignore[method-assign]
    queue.record_answered = answered  # type: ignore[method-assign]
    try:
        reqs = [
            client.post(
                "/v2/models/echo/infer",
                json=body([f"t{i}"], timeout_ms=300),
                headers={"x-request-id": f"r{i}"},
            )
            for i in range(120)
        ]
        answers = await asyncio.gather(*reqs)
        codes: dict[int, int] = {}
        for a in answers:
            codes[a.status_code] = codes.get(a.status_code, 0) + 1
            if a.status_code != 200:
                assert a.status_code in (429, 503, 504), a.text
                assert int(a.headers["retry-after"]) >= 1
                assert set(a.json()) == {"error"}
        ok = [a for a in answers if a.status_code == 200]
        failed = [a.text for a in answers if a.status_code == 504][:3]
        # the door refused what it could not admit, and some were served
        assert codes.get(503, 0) >= 120 - 16 and ok, (codes, failed)
        assert sum(ran) == len(ok)  # nothing refused or late was run
        assert sorted(handed_back) == sorted(a.headers["x-request-id"] for a in ok)
        late = {rid: round(t - deadlines[rid], 4) for rid, t in handed_back.items() if t > deadlines[rid]}
        assert all(s <= PREDICTION_SLACK_S for s in late.values()), late
        assert app.door.inside == 0
    finally:
        await client.aclose()
        await svc.drain()


async def test_draining_a_body_is_bounded_in_time_and_bytes() -> None:
    """A client that never sends its body, or sends more than the server reads, holds the early answer
    at most the drain's timeout and limit."""
    reads = 0

    async def never() -> dict[str, Any]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def endless() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}

    t0 = time.monotonic()
    await drain_body(never, timeout_s=0.05)
    assert time.monotonic() - t0 < 1.0
    await drain_body(endless, limit=10_000, timeout_s=5.0)
    assert reads == 11  # stopped once past the limit
