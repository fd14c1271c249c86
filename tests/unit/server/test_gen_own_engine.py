"""The own generation engine (``--engine own``, modelserver.gen_own_engine) on the small Llama: greedy
answers token for token what ``model.generate`` gives while sequences of mixed prompt lengths join a run
mid-way (chunked prefill, a queue for a slot), a cancelled stream frees its slot at once, the KV cache stays
within its configured size, and a seeded sampled answer is the same whatever runs beside it."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import torch
from gen_support import BUDGET, KV_TOKENS, SLOTS, collect, prompts_of, reference
from modelserver.errors import InvalidInput
from modelserver.gen_app import GenerationApp
from modelserver.gen_engine import GenerationEngine, Limits, Sampling
from modelserver.gen_own_engine import (
    PER_ROW_MIN_GAIN,
    OwnEngine,
    Sequence,
    per_row_contexts,
)
from modelserver.gen_sampling import RowSampling, filtered
from modelserver.metrics import Metrics


@pytest.fixture
def engine(own: OwnEngine, loaded: Any) -> GenerationEngine:
    limits = Limits(context=own.max_len, max_tokens=100, max_waiting=16, max_running=SLOTS)
    return GenerationEngine(own, limits, loaded[1].eos_token_id)


@pytest.mark.parametrize("min_gain", [PER_ROW_MIN_GAIN, -1, 10**9], ids=["default", "row-by-row", "batched"])
async def test_greedy_answers_are_what_generate_gives_while_mixed_prompts_join_mid_run(
    engine: GenerationEngine, own: OwnEngine, loaded: Any, min_gain: float
) -> None:
    """Whether a decode step attends row by row (each row over its own context) or in one batched call
    over the longest context (a mask hiding the rest), the answers are generate()'s."""
    own.per_row_min_gain = min_gain
    _, tok = loaded
    lengths, news = [3, 70, 11, 97, 5, 40, 2], [30, 12, 25, 8, 40, 20, 33]
    prompts = prompts_of(tok, lengths)
    want = [reference(loaded, p, n) for p, n in zip(prompts, news, strict=True)]
    assert any(len(w) == n for w, n in zip(want, news, strict=True)), "every answer stopped at once"
    steps_before = own.steps
    got = await asyncio.gather(
        *(
            collect(engine, p, Sampling(n, greedy=True), 0.02 * i)
            for i, (p, n) in enumerate(zip(prompts, news, strict=True))
        )
    )
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"prompt {i} ({lengths[i]} tokens): {g} != {w}"
    # 7 sequences in 3 slots, prompts of up to 97 tokens in 24-token steps: they joined a running batch
    assert own.steps - steps_before < sum(lengths) + sum(news)
    assert own.kv_cache_usage() == 0.0 and not own.decoding and own.prefilling is None


def test_newcomers_prompts_share_one_forward_with_the_running_rows_decode_and_answer_as_generate_does(
    loaded: Any,
) -> None:
    model, tok = loaded
    own = OwnEngine(model, kv_cache_tokens=KV_TOKENS, max_batch_tokens=BUDGET, max_sequences=SLOTS)
    try:
        prompts = prompts_of(tok, [5, 7, 15])
        greedy = RowSampling.of(True, 0.0, 1, 1.0, None)
        eos = frozenset([tok.eos_token_id])
        own.queue.extend(Sequence(str(i), list(p), len(p), 6, eos, greedy) for i, p in enumerate(prompts))
        own.step()
        # one forward: 5 + 7 tokens, then 12 of the third prompt's 15 (the step's budget is 24)
        assert own.forwards == 1
        assert [s.rid for s in own.decoding] == ["0", "1"]
        assert own.prefilling is not None and (own.prefilling.rid, own.prefilling.cached) == ("2", 12)
        seqs = [*own.decoding, own.prefilling]
        own.step()
        # one forward again: the two running rows' decode and the third prompt's last 3 tokens
        assert own.forwards == 2 and [s.rid for s in own.decoding] == ["0", "1", "2"]
        assert [len(s.generated) for s in seqs] == [2, 2, 1]
        while own.decoding or own.prefilling is not None:
            own.step()
        assert [s.generated for s in seqs] == [reference(loaded, p, 6) for p in prompts]
    finally:
        model.set_attn_implementation(own._attn_before)


async def test_leaving_a_stream_frees_its_slot_at_once_and_the_waiter_gets_it(
    own: OwnEngine, loaded: Any
) -> None:
    _, tok = loaded
    limits = Limits(context=own.max_len, max_tokens=own.max_len, max_waiting=16, max_running=SLOTS + 1)
    engine = GenerationEngine(own, limits, tok.eos_token_id)  # the gate lets one more through than the slots
    prompts = prompts_of(tok, [8, 9, 10, 12])
    n = own.max_len - 12
    assert all(len(reference(loaded, p, n)) == n for p in prompts[:SLOTS]), "an answer ends early"
    long = [engine.stream(p, Sampling(n, greedy=True)) for p in prompts[:SLOTS]]
    for s in long:
        await anext(s)  # each has its first token: every slot is held
    waiter = asyncio.create_task(collect(engine, prompts[3], Sampling(3, greedy=True)))
    while not own.queue:
        await asyncio.sleep(0.001)
    assert own.kv_cache_usage() == 1.0, "the fourth sequence should wait for a slot"
    await long[1].aclose()  # the client went away: its slot goes to the waiter at the next step
    answer = await asyncio.wait_for(waiter, 10)
    assert answer == reference(loaded, prompts[3], 3)
    assert len(own.decoding) == 2, "the other two long answers had ended: the test showed nothing"
    for s in (long[0], long[2]):
        await s.aclose()
    for _ in range(100):
        if own.kv_cache_usage() == 0.0:
            break
        await asyncio.sleep(0.02)
    assert own.kv_cache_usage() == 0.0 and engine.running == 0 and engine.waiting == 0
    assert not own.handlers


async def test_the_kv_cache_is_its_configured_size_and_longer_sequences_are_refused(
    own: OwnEngine, engine: GenerationEngine, loaded: Any
) -> None:
    model, tok = loaded
    cfg = model.config
    assert own.slots == SLOTS and own.max_len == KV_TOKENS // SLOTS
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # keys + values, fp32
    assert own.cache.nbytes == KV_TOKENS * per_token
    tensors = [id(t) for t in own.cache.keys]
    prompts = prompts_of(tok, [30, 50, 70, 90, 20, 60])
    sizes: list[int] = []
    step = own.step

    def watched() -> None:
        step()
        sizes.append(len(own.decoding) + (own.prefilling is not None))
        assert own.cached_tokens() <= SLOTS * own.max_len

    own.step = watched  # type: ignore[method-assign]
    await asyncio.gather(*(collect(engine, p, Sampling(60, greedy=True)) for p in prompts))
    assert max(sizes) == SLOTS  # full, never over
    assert [id(t) for t in own.cache.keys] == tensors, "the cache was reallocated"
    with pytest.raises(InvalidInput, match=f"over the context of {own.max_len} tokens"):
        engine.admit(own.max_len - 10, Sampling(11, greedy=True))


async def test_a_seeded_sampled_answer_is_the_same_whatever_runs_beside_it(
    own: OwnEngine, engine: GenerationEngine, loaded: Any
) -> None:
    _, tok = loaded
    app = GenerationApp(engine, tok, "tiny", "1", Metrics("tiny", "1"))
    body = {"model": "tiny", "prompt": "The licensee may", "max_tokens": 40, "temperature": 1.0, "seed": 7}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://gen", timeout=60
    ) as c:

        async def text(doc: dict[str, Any]) -> str:
            r = await c.post("/v1/completions", json=doc)
            assert r.status_code == 200, r.text
            return str(r.json()["choices"][0]["text"])

        alone = await text(body)
        other = {**body, "prompt": "def main():", "seed": None}
        beside = await asyncio.gather(text(body), text(other), text({**body, "seed": 8}))
        greedy = await text({**body, "temperature": 0, "seed": None})
    assert beside[0] == alone, "the same seed gave another answer next to other sequences"
    assert beside[2] != alone, "another seed gave the same answer: the seed is not used"
    assert alone != greedy, "a sampled answer equal to the greedy one shows nothing"


def test_a_decode_step_attends_row_by_row_only_when_its_contexts_differ_enough_to_pay() -> None:
    assert per_row_contexts([100, 100, 101]) is None  # one batched call over 102 positions
    assert per_row_contexts([10, 700, 20, 30]) == [11, 701, 21, 31]  # 701 against a mean of 191
    assert per_row_contexts([5, 5], min_gain=-1) == [6, 6]


def test_top_k_and_top_p_keep_what_they_should() -> None:
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    assert torch.isinf(filtered(logits, 2, 1.0)).tolist() == [False, False, True, True, True]
    probs = torch.softmax(logits, -1)  # 0.64, 0.24, 0.09, ...: top-p 0.8 keeps the first two
    assert probs[0] < 0.8 < probs[0] + probs[1]
    assert torch.isinf(filtered(logits, 0, 0.8)).tolist() == [False, False, True, True, True]
    assert not torch.isinf(filtered(logits, 0, 1.0)).any()


def test_engine_auto_is_the_own_loop_on_the_cpu_and_the_manager_on_cuda() -> None:
    """The own engine is measured on the CPU only (make bench-gpu ran the manager on an H200): auto picks
    what was measured where it runs; a named engine is kept."""
    from modelserver.gen_server import engine_for

    assert engine_for("auto", "cpu") == "own"
    assert engine_for("auto", "cuda") == "manager"
    assert engine_for("own", "cuda") == "own"
    assert engine_for("manager", "cpu") == "manager"


async def test_ignore_eos_runs_a_greedy_answer_past_its_eos_to_max_tokens(
    own: OwnEngine, loaded: Any
) -> None:
    """vLLM's ``ignore_eos``: the model's EOS (here its third greedy token, made the EOS) does not end it."""
    _, tok = loaded
    prompt = prompts_of(tok, [9])[0]
    want = reference(loaded, prompt, 20)
    assert len(want) == 20 and want[2] not in want[:2], "pick a prompt whose answer runs to 20"
    limits = Limits(context=own.max_len, max_tokens=100, max_waiting=16, max_running=SLOTS)
    engine = GenerationEngine(own, limits, want[2])
    stopped = [s async for s in engine.stream(prompt, Sampling(20, greedy=True))]
    assert [t for s in stopped for t in s.tokens] == want[:3] and stopped[-1].reason == "stop"
    steps = [s async for s in engine.stream(prompt, Sampling(20, greedy=True, ignore_eos=True))]
    assert [t for s in steps for t in s.tokens] == want
    assert steps[-1].finished and steps[-1].reason == "length"
