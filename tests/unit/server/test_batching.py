"""The batching core, driven directly with a manual clock (no HTTP, no model)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import fixed_cost
from modelserver.batch_worker import BatchWorker, SplitStats, run_with_split
from modelserver.batching import (
    Batch,
    BatchingConfig,
    BatchQueue,
    BucketPolicy,
    CostModel,
    DeadlineExpired,
    DeadlineUnmeetable,
    Draining,
    ItemFailed,
    OutOfMemory,
    QueueFull,
)


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def get_batch(q: BatchQueue) -> Batch:
    b = await asyncio.wait_for(q.next_batch(), 5)
    assert b is not None
    return b


# -- closing on size and on delay ---------------------------------------------------------------------------


async def test_batch_closes_on_size_without_waiting(make_queue, make_item):
    q = make_queue(max_batch_size=4, max_queue_delay_s=3600.0)
    q.submit([make_item(10) for _ in range(6)])
    b = await get_batch(q)  # the clock never moves: only "full" can release it
    assert b.size == 4
    assert q.depth == 2


async def test_batch_closes_on_delay(make_queue, make_item, clock):
    q = make_queue(max_batch_size=8, max_queue_delay_s=0.050)
    q.submit([make_item(10), make_item(10)])
    task = asyncio.ensure_future(q.next_batch())
    await settle()
    assert not task.done(), "a non-full batch must wait for the queue delay"
    clock.advance(0.049)
    q.poke()
    await settle()
    assert not task.done()
    clock.advance(0.002)
    q.poke()
    b = await asyncio.wait_for(task, 5)
    assert b is not None and b.size == 2


async def test_new_arrival_completes_a_waiting_batch(make_queue, make_item):
    q = make_queue(max_batch_size=3, max_queue_delay_s=3600.0)
    q.submit([make_item(10), make_item(10)])
    task = asyncio.ensure_future(q.next_batch())
    await settle()
    assert not task.done()
    q.submit([make_item(10)])
    b = await asyncio.wait_for(task, 5)
    assert b is not None and b.size == 3


# -- buckets and the token budget ---------------------------------------------------------------------------


async def test_buckets_keep_short_inputs_apart_from_long_ones(make_queue, make_item):
    q = make_queue(max_batch_size=8, buckets=[16, 64, 256], max_length=256, token_budget=100_000)
    items = []
    for _ in range(4):  # interleaved arrivals: short, long, short, long, ...
        items += [make_item(10), make_item(200)]
    q.submit(items)
    q.close()  # dispatch without waiting for more arrivals
    first, second = await get_batch(q), await get_batch(q)
    assert sorted(i.length for i in first.items) == [10] * 4
    assert first.padded_length == 10
    assert sorted(i.length for i in second.items) == [200] * 4
    assert first.padding_ratio == 1.0


async def test_fifo_scheduler_pads_short_inputs_to_long_ones(make_queue, make_item):
    q = make_queue(max_batch_size=8, scheduler="fifo", max_length=256)
    items = []
    for _ in range(4):
        items += [make_item(10), make_item(200)]
    q.submit(items)
    b = await get_batch(q)
    assert b.size == 8 and b.padded_length == 200
    assert b.padding_ratio > 1.9


async def test_token_budget_limits_padded_tokens(make_queue, make_item):
    q = make_queue(max_batch_size=32, token_budget=400, max_length=512)
    q.submit([make_item(100) for _ in range(10)])
    b = await get_batch(q)
    assert b.size == 4 and b.padded_tokens <= 400


async def test_efficiency_keeps_short_items_out_of_a_long_batch(make_queue, make_item):
    # One bucket for everything: only the estimated cost keeps the 10-token items out of the batch that is
    # padded to 200 tokens (padded, each costs twenty times its own time; the least-time plan splits).
    q = make_queue(max_batch_size=16, buckets=[256], max_length=256, token_budget=100_000)
    seed, near = make_item(200), make_item(190)
    shorts = [make_item(10) for _ in range(8)]
    q.submit([seed, near, *shorts])
    q.close()
    first = await get_batch(q)
    assert set(first.items) == {seed, near}
    second = await get_batch(q)
    assert set(second.items) == set(shorts) and second.padded_length == 10


async def test_cross_bucket_window_used_when_the_cost_model_says_so(make_queue, make_item):
    # A big fixed cost per batch makes one larger batch much better than two tiny ones.
    cost = fixed_cost(c0=1.0, c2=1e-7)
    q = make_queue(cost=cost, max_batch_size=8, buckets=[16, 32], max_length=32)
    q.submit([make_item(12), make_item(20), make_item(20)])
    q.close()
    b = await get_batch(q)
    assert b.size == 3 and b.padded_length == 20


async def test_a_packed_model_runs_inputs_together_that_padded_would_run_apart(make_queue, make_item):
    # 100, 50 and 50 tokens. Padded together: 300 positions (0.35 s) > apart, [50, 50] and [100]: two fixed
    # costs and 200 positions (0.30 s). Packed, the two 50s share a row beside the 100's: 200 positions in
    # one batch (0.25 s), one fixed cost less than apart.
    cost = fixed_cost(c0=0.05, c2=1e-3)
    for width, sizes in ((0, [1, 2]), (32, [3])):
        q = make_queue(cost=cost, max_batch_size=8, buckets=[512], pack_min_width=width)
        q.submit([make_item(100), make_item(50), make_item(50)])
        q.close()
        got = [(await get_batch(q)).size for _ in sizes]
        assert sorted(got) == sizes, f"pack_min_width={width}"


async def test_a_packed_batch_is_costed_by_its_rows_at_least_the_floor_wide(make_queue, make_item):
    q = make_queue(cost=fixed_cost(c0=0.0, c1=0.0, c2=1.0, c3=0.5), pack_min_width=32)
    # 50 positions in rows 32 wide: 50 x (1 + 0.5 x 32)
    assert q.cost_of(4, 20, 50) == pytest.approx(50 * 17)
    # three inputs of 10 tokens and one of 20, packed: rows [20, 10], [10, 10] -> 2 rows x 30 positions
    batch = Batch([make_item(20), *(make_item(10) for _ in range(3))], 20, 0.0)
    assert q.batch_cost(batch) == 60 * 17
    # what the padding-ratio metric reports: the positions run over the real tokens
    assert q.padding_ratio(batch) == pytest.approx(60 / 50)
    padded = make_queue(cost=fixed_cost(c0=0.0, c1=0.0, c2=1.0, c3=0.5))
    assert padded.padding_ratio(batch) == pytest.approx(80 / 50) == batch.padding_ratio
    assert padded.cost_of(4, 20, 50) == pytest.approx(80 * (1 + 0.5 * 20))  # 4 x 20 positions, 20 wide


def test_buckets_from_length_quantiles():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 300, size=2000).tolist()
    bounds = BucketPolicy.derive(lengths, 512)
    q = np.quantile(lengths, [0.5, 0.8, 0.95])
    assert bounds[-1] == 512
    assert len(bounds) == 4
    for b, qq in zip(bounds[:3], q, strict=True):
        assert qq <= b < qq + 8
    auto = BucketPolicy(512, None, update_every=100, min_samples=50)
    assert auto.bounds == [16, 32, 64, 128, 256, 512]
    for v in lengths[:100]:
        auto.observe(v)
    assert auto.bounds == BucketPolicy.derive(lengths[:100], 512)
    fixed = BucketPolicy(512, [64, 32])
    fixed.observe(5)
    assert fixed.bounds == [32, 64, 512]
    assert fixed.range_of(40) == (33, 64) and fixed.range_of(1) == (0, 32)


# -- priorities and aging ----------------------------------------------------------------------------------


async def test_higher_priority_first(make_queue, make_item):
    q = make_queue(max_batch_size=1, aging_s=1.0)
    low, high = make_item(10, priority=3), make_item(10, priority=1)
    q.submit([low])
    q.submit([high])
    assert (await get_batch(q)).items == [high]
    assert (await get_batch(q)).items == [low]


async def _served_after(q: BatchQueue, make_item, clock, steps: int) -> int | None:
    low = make_item(10, priority=3, timeout=1e6)
    q.submit([low])
    for step in range(steps):
        q.submit([make_item(10, priority=1, timeout=1e6)])  # a steady stream of high-priority work
        b = await get_batch(q)
        if low in b.items:
            return step
        clock.advance(0.010)
    return None


async def test_aging_beats_starvation(make_queue, make_item, clock):
    q = make_queue(max_batch_size=1, aging_s=0.050)
    step = await _served_after(q, make_item, clock, steps=100)
    # 2 levels x 50 ms of aging = 100 ms = about 10 steps of 10 ms.
    assert step is not None and step <= 12


async def test_without_aging_low_priority_starves(make_queue, make_item, clock):
    q = make_queue(max_batch_size=1, aging_s=3600.0)
    assert await _served_after(q, make_item, clock, steps=100) is None


# -- deadlines, admission ----------------------------------------------------------------------------------


async def test_item_expiring_in_the_queue_gets_504(make_queue, make_item, clock):
    q = make_queue(max_batch_size=8, max_queue_delay_s=3600.0)
    short, longer = make_item(10, timeout=0.5), make_item(10, timeout=100.0)
    q.submit([short, longer])
    clock.advance(1.0)
    q.expire([short])
    with pytest.raises(DeadlineExpired) as e:
        await short.future
    assert e.value.status == 504
    assert not longer.future.done()
    assert q.depth == 1


async def test_item_whose_batch_runs_past_its_deadline_gets_504_at_the_deadline(make_queue, make_item, clock):
    """A batch can run longer than predicted (a shared CPU): its caller is answered at the deadline, not
    with a 200 after it, and the result that comes later is dropped."""
    q = make_queue(max_batch_size=8, max_queue_delay_s=0.0)
    late, spare = make_item(10, timeout=0.5), make_item(10, timeout=100.0)
    q.submit([late, spare])
    batch = await get_batch(q)
    assert batch.items == [late, spare]  # running now: no longer queued
    clock.advance(1.0)
    q.expire([late])
    with pytest.raises(DeadlineExpired, match="while its batch ran") as e:
        await asyncio.wait_for(late.future, 5.0)
    assert e.value.status == 504 and e.value.retry_after >= 1
    assert not spare.future.done()  # the other item of the batch is answered when the batch ends
    assert q.depth == 0


async def test_sweep_fails_expired_items_when_forming(make_queue, make_item, clock):
    q = make_queue(max_batch_size=8, max_queue_delay_s=0.0)
    a, b = make_item(10, timeout=0.5), make_item(10, timeout=100.0)
    q.submit([a, b])
    clock.advance(1.0)
    batch = await get_batch(q)
    assert batch.items == [b]
    assert isinstance(a.future.exception(), DeadlineExpired)


async def test_unmeetable_deadline_rejected_at_once(make_queue, make_item):
    q = make_queue(cost=fixed_cost(c0=1.0, c2=0.0), max_batch_size=1)
    q.submit([make_item(10, timeout=100.0) for _ in range(3)])  # ~3 s of work queued
    with pytest.raises(DeadlineUnmeetable) as e:
        q.submit([make_item(10, timeout=2.0)])
    assert e.value.status == 429 and e.value.retry_after >= 3
    q.submit([make_item(10, timeout=10.0)])  # a looser deadline is admitted
    assert q.depth == 4


async def test_urgent_deadline_overrides_priority(make_queue, make_item, clock):
    q = make_queue(cost=fixed_cost(c0=0.004, c2=0.0), max_batch_size=1)
    q.recent_batch_s = 0.010
    relaxed = make_item(10, priority=1, timeout=100.0)
    urgent = make_item(10, priority=3, timeout=0.015)
    q.submit([relaxed, urgent])
    assert (await get_batch(q)).items == [urgent]


async def test_queue_full_503_with_retry_after(make_queue, make_item):
    q = make_queue(max_queue_size=2)
    q.submit([make_item(), make_item()])
    with pytest.raises(QueueFull) as e:
        q.submit([make_item()])
    assert e.value.status == 503 and e.value.retry_after >= 1
    with pytest.raises(QueueFull):  # all or nothing
        q.submit([make_item(), make_item(), make_item()])
    assert q.depth == 2


async def test_close_rejects_new_and_flushes_queued(make_queue, make_item):
    q = make_queue(max_batch_size=8, max_queue_delay_s=3600.0)
    q.submit([make_item(), make_item()])
    q.close()
    with pytest.raises(Draining):
        q.submit([make_item()])
    b = await get_batch(q)
    assert b.size == 2
    assert await asyncio.wait_for(q.next_batch(), 5) is None


# -- split on failure ----------------------------------------------------------------------------------------


async def test_slow_small_batches_of_the_ramp_up_do_not_pad_every_later_batch(make_item, clock):
    """Batches of 1-2 items that ran slower than predicted raise the plan's fixed cost (so that a backlog
    is not served in tiny batches); under saturation no small batch comes to refresh that, so it fades with
    every larger batch -- else every batch would be the whole queue padded to its longest."""
    q = BatchQueue(
        BatchingConfig(max_queue_delay_s=0.0, max_batch_size=64),
        clock=clock,
        cost_model=fixed_cost(0.010, c2=7e-5),
    )
    for _ in range(20):  # the ramp-up: lone items 44 ms slower than the model says
        q.record(Batch([make_item(10)], 10, clock()), q.cost.predict(1, 10) + 0.044)
    assert q.excess_s > 0.040
    for _ in range(40):  # then saturation: full batches, as predicted
        q.record(Batch([make_item(20) for _ in range(32)], 20, clock()), q.cost.predict(32, 20))
    q.submit([make_item((6, 13, 20)[i % 3]) for i in range(63)])
    batch = q.try_form()
    assert isinstance(batch, Batch)
    assert (batch.size, batch.padded_length) == (21, 6)  # one length group, not 63 items padded to 20


def test_oom_splits_the_batch_and_retries():
    calls = []

    def fn(batch):
        calls.append(len(batch))
        if len(batch) > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [x * 10 for x in batch]

    stats = SplitStats()
    out = run_with_split(fn, list(range(8)), stats)
    assert out == [x * 10 for x in range(8)]
    assert stats.ooms == 3 and stats.splits == 3
    assert calls == [8, 4, 2, 2, 4, 2, 2]


def test_single_bad_item_fails_alone():
    def fn(batch):
        if "bad" in batch:
            raise ValueError("cannot handle 'bad'")
        return [s.upper() for s in batch]

    out = run_with_split(fn, ["a", "b", "bad", "c", "d"])
    assert out[:2] == ["A", "B"] and out[3:] == ["C", "D"]
    assert isinstance(out[2], ItemFailed) and out[2].status == 500


def test_oom_on_a_single_item_is_reported_as_oom():
    def fn(batch):
        raise MemoryError()

    out = run_with_split(fn, [1])
    assert isinstance(out[0], OutOfMemory) and out[0].status == 503


def test_wrong_result_count_is_a_failure():
    out = run_with_split(lambda b: [1], [1, 2])
    assert out[0] == 1 and out[1] == 1  # split into singles, which then succeed


# -- worker ------------------------------------------------------------------------------------------------


async def test_worker_runs_batches_and_drains(make_item, clock):
    q = BatchQueue(BatchingConfig(max_batch_size=4, max_queue_delay_s=0.001), clock=clock)
    sizes = []

    def predict(payloads):
        sizes.append(len(payloads))
        if 13 in payloads:
            raise RuntimeError("boom")
        return [p + 1 for p in payloads]

    w = BatchWorker(q, predict)
    w.start()
    items = [make_item(10, payload=i) for i in range(20)]
    q.submit(items)
    q.close()
    await asyncio.wait_for(w.join(), 10)
    for i, it in enumerate(items):
        if i == 13:
            assert isinstance(it.future.exception(), ItemFailed)
        else:
            assert it.future.result() == i + 1
    assert max(sizes) == 4


async def test_worker_oom_lowers_the_token_budget(make_item, clock):
    q = BatchQueue(BatchingConfig(max_batch_size=8, max_queue_delay_s=0.0, token_budget=10_000), clock=clock)

    def predict(payloads):
        if len(payloads) > 2:
            raise MemoryError("simulated")
        return payloads

    w = BatchWorker(q, predict)
    w.start()
    items = [make_item(100, payload=i) for i in range(8)]
    q.submit(items)
    q.close()
    await asyncio.wait_for(w.join(), 10)
    assert [it.future.result() for it in items] == list(range(8))
    assert q.budget == 400  # 8 x 100 padded tokens ran out of memory -> halved


# -- cost model --------------------------------------------------------------------------------------------


def test_cost_model_learns_latency():
    cm = CostModel()
    rng = np.random.default_rng(1)
    true = np.array([2e-3, 1e-4, 3e-6, 1e-9])
    for _ in range(200):
        n, length = int(rng.integers(1, 33)), int(rng.integers(8, 513))
        t = float(true @ np.array([1, n, n * length, n * length * length])) * float(rng.uniform(0.97, 1.03))
        cm.observe(n, length, t)
    assert cm.fitted
    for n, length in [(1, 16), (8, 128), (32, 512)]:
        want = float(true @ np.array([1, n, n * length, n * length * length]))
        assert abs(cm.predict(n, length) - want) / want < 0.1
    assert (cm.coef >= 0).all()


def test_cost_model_learns_packed_batches_by_their_positions():
    # packed batches: the time follows the real tokens T and the rows' width W, not n x the longest
    cm = CostModel()
    rng = np.random.default_rng(2)
    true = np.array([2e-3, 1e-4, 3e-6, 1e-9])
    for _ in range(200):
        n, width = int(rng.integers(1, 33)), int(rng.integers(32, 513))
        tokens = int(n * width * rng.uniform(0.3, 1.0))
        t = float(true @ np.array([1, n, tokens, tokens * width])) * float(rng.uniform(0.97, 1.03))
        cm.observe(n, width, t, tokens)
    for n, width, tokens in [(1, 32, 16), (8, 128, 500), (32, 512, 4000)]:
        want = float(true @ np.array([1, n, tokens, tokens * width]))
        assert abs(cm.predict(n, width, tokens) - want) / want < 0.1
