"""Faults in text generation on the small Llama (modelserver.gen_own_engine, gen_sampling, gen_engine): one
request's settings or one row's failure ends only what it must; every stream ends, with its answer or an
error, and frees its slot, its place in the gate and its count; the engine keeps serving; and a reader that
does not read holds one output, not one per step."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest
import torch
from gen_support import SLOTS, collect, prompts_of, reference
from modelserver import gen_sampling
from modelserver.errors import ServerError
from modelserver.gen_engine import GenerationEngine, GenerationUnavailable, Limits, Sampling
from modelserver.gen_own_engine import Output, OwnEngine
from modelserver.gen_sampling import RowSampling, filtered, next_tokens


def poisoned(n: int) -> Sampling:
    """Sampled with a top_p that passes a ``> 0`` check and is 0 in float32."""
    return Sampling(n, temperature=1.0, top_p=1e-46)


def engine_of(own: OwnEngine, eos: int | None, max_running: int = SLOTS) -> GenerationEngine:
    limits = Limits(context=own.max_len, max_tokens=own.max_len, max_waiting=64, max_running=max_running)
    return GenerationEngine(own, limits, eos)


async def settled(engine: GenerationEngine, own: OwnEngine) -> None:
    """Every count, place and slot is free again (the loop's thread may lag the streams by a step)."""
    for _ in range(250):
        if own.kv_cache_usage() == 0.0 and not own.handlers and not own.queue:
            break
        await asyncio.sleep(0.02)
    assert (engine.waiting, engine.running) == (0, 0)
    assert not engine.gate.running and not engine.gate.waiting
    assert own.kv_cache_usage() == 0.0 and not own.handlers and not own.queue


async def until(condition: Any, what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"never: {what}")


# -- the sampler ---------------------------------------------------------------------------------------
def test_a_top_p_that_is_zero_in_float32_keeps_the_most_likely_token_and_no_row_is_nan() -> None:
    logits = torch.tensor([1.0, 3.0, 2.0])
    assert torch.isinf(filtered(logits, 0, 1e-46)).tolist() == [True, False, True]
    assert torch.isinf(filtered(logits, 1, 1e-46)).tolist() == [True, False, True]
    assert next_tokens(logits[None], [RowSampling.of(False, 1.0, 0, 1e-46, 0)]) == [1]
    # non-finite logits (a model that overflowed): the row's most likely token, not an exception
    bad = torch.tensor([[0.0, float("nan"), 1.0], [float("inf"), 0.0, 1.0]])
    out = next_tokens(bad, [RowSampling.of(False, 1.0, 0, 1.0, 0), RowSampling.of(False, 0.5, 2, 0.5, 0)])
    assert all(isinstance(t, int) for t in out) and out[1] == 0


# -- the own engine --------------------------------------------------------------------------------
async def test_a_top_p_of_1e_46_beside_honest_streams_answers_and_fails_none_of_them(
    own: OwnEngine, loaded: Any
) -> None:
    _, tok = loaded
    engine = engine_of(own, tok.eos_token_id)
    a, b, p = prompts_of(tok, [8, 9, 12])
    n = 40
    want = [reference(loaded, x, n) for x in (a, b, p)]
    assert len(want[0]) == len(want[1]) == n, "the honest answers end early: they show nothing"
    got = await asyncio.wait_for(
        asyncio.gather(
            collect(engine, a, Sampling(n, greedy=True)),
            collect(engine, b, Sampling(n, greedy=True)),
            collect(engine, p, poisoned(n), delay=0.05),  # joins while they run
        ),
        60,
    )
    assert got[:2] == want[:2]
    assert got[2] == want[2], "top_p 1e-46 keeps only the most likely token: the greedy answer"
    await settled(engine, own)


async def test_fifty_poisoned_requests_then_an_honest_one_is_served_at_once(
    own: OwnEngine, loaded: Any
) -> None:
    _, tok = loaded
    engine = engine_of(own, tok.eos_token_id)
    prompt = prompts_of(tok, [8])[0]
    answers = await asyncio.wait_for(
        asyncio.gather(*(collect(engine, prompt, poisoned(3)) for _ in range(50))), 60
    )
    assert all(a == answers[0] and a for a in answers)
    honest = await asyncio.wait_for(collect(engine, prompt, Sampling(8, greedy=True)), 10)
    assert honest == reference(loaded, prompt, 8)
    await settled(engine, own)


@pytest.mark.parametrize("fail_at", [1, 3], ids=["first-token", "in-decode"])
async def test_a_row_whose_sampling_raises_fails_alone(
    own: OwnEngine, loaded: Any, monkeypatch: pytest.MonkeyPatch, fail_at: int
) -> None:
    """The row with top_k 7 raises at its ``fail_at``-th token: its stream ends with the error (after the
    tokens it had), the others -- greedy, and sampled through the same code -- go on as if it were not
    there."""
    _, tok = loaded
    real, calls = gen_sampling.filtered, [0]

    def flaky(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
        if top_k == 7:
            calls[0] += 1
            if calls[0] == fail_at:
                raise RuntimeError("injected sampling failure")
        return real(logits, top_k, top_p)

    monkeypatch.setattr(gen_sampling, "filtered", flaky)
    engine = engine_of(own, tok.eos_token_id, max_running=SLOTS + 1)
    a, s, bad = prompts_of(tok, [8, 9, 12])
    n = 40
    want = reference(loaded, a, n)
    seeded = Sampling(n, temperature=0.9, top_k=5, seed=3)
    alone = await collect(engine, s, seeded)
    tokens: list[int] = []

    async def failing() -> None:
        await asyncio.sleep(0.05)  # joins while the others run
        async for step in engine.stream(bad, Sampling(n, temperature=0.8, top_k=7)):
            tokens.extend(step.tokens)

    got = await asyncio.wait_for(
        asyncio.gather(
            collect(engine, a, Sampling(n, greedy=True)), collect(engine, s, seeded), failing(),
            return_exceptions=True,
        ),
        60,
    )  # fmt: skip
    assert got[0] == want and got[1] == alone
    assert isinstance(got[2], ServerError) and "injected sampling failure" in str(got[2])
    assert len(tokens) == fail_at - 1
    await settled(engine, own)
    assert await collect(engine, a, Sampling(5, greedy=True)) == want[:5]


async def test_a_failed_forward_ends_its_rows_only_and_the_engine_keeps_serving(
    own: OwnEngine, loaded: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rows run; X's prompt is taken from the queue into a forward that raises: the two rows and X end
    with the error, Q (queued behind X, no slot for it yet) is not in that step and is answered."""
    _, tok = loaded
    engine = engine_of(own, tok.eos_token_id, max_running=SLOTS + 1)  # one more than the slots: Q queues
    a, b, x, q = prompts_of(tok, [8, 9, 13, 10])
    n = 60
    assert all(len(reference(loaded, p, n)) == n for p in (a, b)), "an answer ends early"
    want_q = reference(loaded, q, 20)
    pause, paused, resume = threading.Event(), threading.Event(), threading.Event()
    queued: list[list[int]] = []
    real = own._forward

    def forward(ids: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        if pause.is_set():  # the loop is held here while X and Q are added
            paused.set()
            resume.wait(10)
        row = ids[0].tolist()
        if not queued and any(row[i : i + len(x)] == x for i in range(len(row))):
            queued.extend(s.tokens[: s.prompt_len] for s in own.queue)
            raise RuntimeError("injected forward failure")
        return real(ids, *args, **kw)

    monkeypatch.setattr(own, "_forward", forward)
    long = [asyncio.create_task(collect(engine, p, Sampling(n, greedy=True))) for p in (a, b)]
    await until(lambda: len(own.decoding) == 2, "two running rows")
    pause.set()
    await asyncio.to_thread(paused.wait, 10)
    tx = asyncio.create_task(collect(engine, x, Sampling(n, greedy=True)))
    await until(lambda: len(own._inbox.added) == 1, "X added")
    tq = asyncio.create_task(collect(engine, q, Sampling(20, greedy=True)))
    await until(lambda: len(own._inbox.added) == 2, "Q added after X")
    pause.clear()
    resume.set()
    got = await asyncio.wait_for(asyncio.gather(*long, tx, tq, return_exceptions=True), 30)
    assert queued == [q], "Q should have been queued, out of the failed step"
    for i, r in enumerate(got[:3]):
        assert isinstance(r, ServerError) and "injected forward failure" in str(r), (i, r)
    assert got[3] == want_q
    await settled(engine, own)
    assert await asyncio.wait_for(collect(engine, a, Sampling(5, greedy=True)), 10) == reference(loaded, a, 5)
    await settled(engine, own)


async def test_stopping_the_engine_ends_every_stream_running_or_queued(own: OwnEngine, loaded: Any) -> None:
    """What SIGTERM's drain waits for ends at once (with an error), not at the drain limit."""
    _, tok = loaded
    engine = engine_of(own, None, max_running=SLOTS + 1)  # no EOS: the answers run on
    prompts = prompts_of(tok, [8, 9, 10, 11])
    tasks = [asyncio.create_task(collect(engine, p, Sampling(120, greedy=True))) for p in prompts]
    await until(lambda: len(own.decoding) == SLOTS and own.queue, "every slot held, one queued")
    await asyncio.to_thread(own.stop, True, 10)
    got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, ServerError) for r in got), got
    assert (engine.waiting, engine.running) == (0, 0) and not engine.gate.running
    assert own.add_request([1, 2], "late", 3) is None


async def test_a_reader_that_does_not_read_holds_one_output_not_one_per_step(
    own: OwnEngine, loaded: Any
) -> None:
    """Every step's output carries all the tokens so far: queueing each for a stalled reader would hold
    n^2/2 tokens for an n-token answer."""
    _, tok = loaded
    engine = engine_of(own, None)  # no EOS: the answer runs to its length
    prompt = prompts_of(tok, [8])[0]
    n = own.max_len - len(prompt)
    steps = engine.stream(prompt, Sampling(n, greedy=True))
    first = await anext(steps)
    # the reader stops reading; the loop generates the rest of the answer
    await until(lambda: not own.decoding and not own.handlers, "the answer generated")
    for _ in range(5):
        await asyncio.sleep(0.01)  # the outputs' callbacks, on this loop, have run
    gc.collect()
    held = [o for o in gc.get_objects() if type(o) is Output]
    tokens = sum(len(o.generated_tokens) for o in held)
    # the latest output and the one the reader last took: O(n), where one per step would be ~n^2/2
    assert tokens <= 2 * n, f"{len(held)} outputs hold {tokens} tokens for an answer of {n}"
    rest = [t async for step in steps for t in step.tokens]
    assert len(first.tokens + rest) == n
    await settled(engine, own)


# -- GenerationEngine over a loop that dies (transformers' manager: its thread can die) --------------------
class _DyingLoop:
    """Takes requests and never answers; its thread dies when told."""

    seeds_per_request = False

    def __init__(self) -> None:
        self.alive = True

    def is_running(self) -> bool:
        return self.alive

    def register_result_handler(self, rid: str, handler: Any) -> None:
        pass

    def add_request(self, tokens: list[int], request_id: str, **kw: Any) -> str:
        return request_id

    def cancel_request(self, rid: str) -> None:
        pass


async def test_a_stream_ends_when_the_loop_dies_without_answering_and_frees_its_place() -> None:
    loop = _DyingLoop()
    engine = GenerationEngine(loop, Limits(context=64, max_tokens=8, max_waiting=4, max_running=1), None)
    stream = asyncio.create_task(collect(engine, [1, 2, 3], Sampling(4, greedy=True)))
    await asyncio.sleep(0.05)
    assert not stream.done() and engine.gate.running
    loop.alive = False
    with pytest.raises(GenerationUnavailable, match="stopped"):
        await asyncio.wait_for(stream, 5)
    assert (engine.waiting, engine.running) == (0, 0) and not engine.gate.running
