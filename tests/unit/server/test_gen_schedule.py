"""Priorities, deadlines and preemption of generation sequences (modelserver.gen_schedule): the pure
decisions on hand-made seats, then the engine on the small Llama -- a high-priority request gets its first
token while low-priority streams still run, a preempted stream's answer is token for token the one it
would have had, and a request that cannot get a place in time is a 504, not a hang."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from localcluster.promtext import sample_sum
from modelserver.errors import InvalidInput
from modelserver.gen_app import GenerationApp
from modelserver.gen_engine import GenerationEngine, Limits, Sampling, build_manager, schedule_of
from modelserver.gen_own_engine import build_own_engine
from modelserver.gen_schedule import Gate, GenerationDeadline, Seat, most_urgent, victim
from modelserver.metrics import Metrics


def seat(priority: int, arrival: float, order: int, running: bool = False) -> Seat:
    return Seat(priority=priority, arrival=arrival, order=order, running=running)


# -- the decisions ------------------------------------------------------------------------------------------
def test_the_most_urgent_waiter_is_the_highest_priority_unless_a_lower_one_has_waited_long() -> None:
    old_low, new_high = seat(3, arrival=100.0, order=0), seat(1, arrival=100.1, order=1)
    assert most_urgent([old_low, new_high], aging_s=0.1) is new_high  # 100.1 < 100.0 + 2 x 0.1
    assert most_urgent([old_low, seat(1, arrival=100.5, order=2)], aging_s=0.1) is old_low  # aged
    assert most_urgent([], aging_s=0.1) is None
    first, second = seat(2, 100.0, order=0), seat(2, 100.0, order=1)
    assert most_urgent([second, first], aging_s=0.1) is first  # ties: first come first served


def test_the_victim_is_the_latest_admitted_of_the_lowest_priority_below_the_newcomer() -> None:
    a, b, c = seat(2, 1.0, 0, True), seat(3, 2.0, 1, True), seat(3, 3.0, 2, True)
    assert victim([a, b, c], seat(1, 4.0, 3)) is c
    assert victim([a, b, c], seat(3, 4.0, 3)) is None  # never for an equal priority
    c.asked_to_yield = True
    assert victim([a, b, c], seat(1, 4.0, 3)) is b  # one victim per newcomer
    assert victim([a], seat(2, 4.0, 3)) is None


async def test_the_gate_runs_at_most_its_places_and_gives_a_freed_one_to_the_most_urgent() -> None:
    gate = Gate(slots=2, aging_s=10.0)
    first, second = gate.seat(2), gate.seat(2)
    await gate.enter(first)
    await gate.enter(second)
    low, high = gate.seat(3), gate.seat(1)
    waits = [asyncio.create_task(gate.enter(s)) for s in (low, high)]
    await asyncio.sleep(0)
    assert not low.admitted.is_set() and not high.admitted.is_set()  # no victim of lower priority
    gate.leave(first)
    await asyncio.sleep(0)
    assert high.admitted.is_set() and not low.admitted.is_set()
    gate.leave(second)
    await asyncio.gather(*waits)
    assert gate.running == [high, low] and gate.waiting == []


async def test_a_waiter_leaves_at_its_deadline_with_a_504_and_holds_no_place() -> None:
    gate = Gate(slots=1)
    await gate.enter(gate.seat(2))
    late = gate.seat(2, timeout_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(GenerationDeadline) as e:
        await gate.enter(late)
    assert e.value.status == 504 and "50 ms" in str(e.value)
    assert 0.04 < time.monotonic() - t0 < 1.0
    assert gate.waiting == [] and late not in gate.running


async def test_a_higher_priority_newcomer_asks_one_lower_running_seat_to_yield() -> None:
    gate = Gate(slots=1, aging_s=10.0)
    low = gate.seat(3)
    asked: list[str] = []
    low.on_preempt = lambda: asked.append("low")
    await gate.enter(low)
    high = gate.seat(1)
    wait = asyncio.create_task(gate.enter(high))
    await asyncio.sleep(0)
    assert asked == ["low"] and not high.admitted.is_set()  # the place is free once low has yielded
    back = asyncio.create_task(gate.yield_place(low))
    await asyncio.sleep(0)
    await wait
    assert gate.running == [high] and gate.waiting == [low] and gate.preemptions == 1
    gate.leave(high)
    await back
    assert gate.running == [low] and low.preemptions == 1 and low.deadline is None


def test_priority_and_timeout_of_a_request_are_checked_and_capped() -> None:
    limits = Limits(context=100, max_tokens=50, max_waiting=1, priority_levels=3, default_priority=2)
    assert schedule_of(limits, 0, None) == (2, None)
    assert schedule_of(limits, 1, 250.0) == (1, 0.25)
    assert schedule_of(limits, 3, 10**9) == (3, limits.max_timeout_s)
    with pytest.raises(InvalidInput, match=r"priority: 1 \(the highest\) .. 3"):
        schedule_of(limits, 4, None)


# -- the engine on the small Llama ------------------------------------------------------------------------
@pytest.fixture(params=["manager", "own"])
async def engine(loaded: Any, request: Any) -> AsyncIterator[GenerationEngine]:
    """The gate over either loop (``--engine manager | own``)."""
    model, tok = loaded
    if request.param == "own":
        manager: Any = build_own_engine(model, kv_cache_tokens=1024, max_batch_tokens=128, max_sequences=2)
    else:
        manager = build_manager(
            model, kv_cache_tokens=2048, page_size=32, max_batch_tokens=128, max_sequences=2
        )
    limits = Limits(context=512, max_tokens=200, max_waiting=8, max_running=2)
    yield GenerationEngine(manager, limits, tok.eos_token_id, aging_s=10.0)
    manager.stop(block=True, timeout=10)


async def answer(
    engine: GenerationEngine, prompt: list[int], n: int, priority: int, log: list[Any]
) -> list[int]:
    tokens: list[int] = []
    async for step in engine.stream(prompt, Sampling(n, temperature=0.0, greedy=True), priority):
        if step.tokens and not tokens:
            log.append(("first", priority, time.monotonic()))
        tokens += step.tokens
    log.append(("done", priority, time.monotonic()))
    return tokens


async def test_a_high_priority_request_starts_while_low_ones_run_and_the_preempted_answer_is_unchanged(
    engine: GenerationEngine, loaded: Any
) -> None:
    _, tok = loaded
    prompts = [tok(p)["input_ids"] for p in ("The licensee may", "Permission is hereby", "The software")]
    # alone, one after another: the answers each must be
    alone = [await answer(engine, p, 120, 3, []) for p in prompts[:2]]
    assert all(len(a) == 120 for a in alone), "the model stopped early: the test shows nothing"
    log: list[Any] = []
    lows = [asyncio.create_task(answer(engine, p, 120, 3, log)) for p in prompts[:2]]
    while engine.running < 2:  # both places held by low-priority streams
        await asyncio.sleep(0.01)
    high = await answer(engine, prompts[2], 8, 1, log)
    low_answers = await asyncio.gather(*lows)
    high_done = next(t for what, p, t in log if what == "done" and p == 1)
    lows_done = [t for what, p, t in log if what == "done" and p == 3]
    assert len(high) == 8
    assert high_done < min(lows_done), "the high-priority request waited for a low one to finish"
    assert engine.gate.preemptions == 1
    # recomputed from its prompt and what it had sent: the client sees the same greedy answer
    assert low_answers == alone
    assert engine.running == 0 and engine.waiting == 0 and engine.gate.running == []


async def test_without_a_lower_priority_to_preempt_a_request_past_its_timeout_is_a_504(
    engine: GenerationEngine, loaded: Any
) -> None:
    _, tok = loaded
    prompt = tok("The licensee may")["input_ids"]
    app = GenerationApp(engine, tok, "tiny", "1", Metrics("tiny", "1"))
    lows = [asyncio.create_task(answer(engine, prompt, 150, 1, [])) for _ in range(2)]
    while engine.running < 2:
        await asyncio.sleep(0.01)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gen", timeout=30) as c:
        body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "temperature": 0, "priority": 2}
        r = await c.post("/v1/completions", json={**body, "timeout_ms": 100})
        assert r.status_code == 504 and "deadline" in r.json()["error"]["message"], r.text
        bad = await c.post("/v1/completions", json={**body, "priority": 7})
        assert bad.status_code == 400 and "priority" in bad.json()["error"]["message"]
        await asyncio.gather(*lows)
        ok = await c.post("/v1/completions", json={**body, "timeout_ms": 100})
        assert ok.status_code == 200, ok.text
        metrics = (await c.get("/metrics")).text
    assert sample_sum(metrics, "modelserver_requests_total", code="504") == 1
    assert sample_sum(metrics, "modelserver_generation_preemptions_total") == 0
    assert engine.waiting == 0 and engine.gate.waiting == []
