"""Batch formation on a simulated clock (bench/serving_sim.py): the real BatchQueue, a closed loop of 128
clients, batch latency from all-MiniLM-L6-v2's CPU cost function. Deterministic; no model, no timing."""

from __future__ import annotations

import pytest

from bench.serving_sim import MINILM_CPU, long_lengths, short_lengths, simulate, simulate_open, sorted_limit

LEARNED = (0.0135, 7.6e-05, 0.000131, 8.96e-08)  # what the server learned in the committed benchmark run


@pytest.mark.parametrize("workload", ["short", "long"])
def test_adaptive_batching_close_to_the_sorted_limit(workload):
    lengths = short_lengths(3000) if workload == "short" else long_lengths(3000)
    limit = sorted_limit(lengths)
    adaptive = simulate(lengths, "adaptive", items=2000)
    assert adaptive.items_per_s >= 0.85 * limit
    assert adaptive.padding_ratio < 1.15


def test_fifo_pads_the_long_mix_and_loses():
    lengths = long_lengths(3000)
    adaptive = simulate(lengths, "adaptive", items=2000)
    fifo = simulate(lengths, "fifo", items=2000)
    assert fifo.padding_ratio > 2.0
    assert adaptive.items_per_s >= 1.5 * fifo.items_per_s


# -- the tail (issue #15): Poisson arrivals at 70% of the peak, fresh and after saturation -----------------


@pytest.mark.parametrize("workload", ["short", "long"])
def test_tail_bound_keeps_the_baseline_throughput(workload):
    lengths = short_lengths(3000) if workload == "short" else long_lengths(3000)
    new = simulate(lengths, "adaptive", items=2000)
    v1 = simulate(lengths, "adaptive-v1", items=2000)
    fifo = simulate(lengths, "fifo", items=2000)
    assert new.items_per_s >= 0.95 * v1.items_per_s
    assert new.items_per_s > fifo.items_per_s


@pytest.mark.parametrize("workload", ["short", "long"])
@pytest.mark.parametrize("saturate", [0, 64])
def test_longest_wait_within_four_longest_batches(workload, saturate):
    lengths = short_lengths(5000) if workload == "short" else long_lengths(5000)
    rate = 0.7 * simulate(lengths, "adaptive", items=2000).items_per_s
    r = simulate_open(lengths, "adaptive", rate, seconds=30, saturate_clients=saturate)
    v1 = simulate_open(lengths, "adaptive-v1", rate, seconds=30, saturate_clients=saturate)
    assert r.max_wait <= 4 * r.max_batch_s
    assert r.p50 <= 1.05 * v1.p50 and r.p99 <= v1.p99  # no worse than the baseline at the same load
    if workload == "short":  # the long mix cannot meet it: see the next test
        assert r.p99 <= 3 * r.p50


@pytest.mark.parametrize("coef", [MINILM_CPU, LEARNED], ids=["minilm-cpu", "learned"])
def test_the_long_mix_misses_p99_within_three_p50_even_without_queueing(coef):
    # Poisson arrivals at 1 item/s: every item runs alone as soon as it comes, so the spread of latencies is
    # the spread of single-item batch times; the 99th-percentile length (about 420 tokens) costs more than
    # 3x the median one (about 65) under both cost functions. No batch formation can change that.
    lengths = long_lengths(5000)
    r = simulate_open(lengths, "adaptive", 1.0, seconds=300, coef=coef)
    assert r.mean_batch == pytest.approx(1.0, abs=0.01)
    assert r.p99 > 3 * r.p50


def test_a_misfitted_cost_model_after_saturation_does_not_stall_the_queue():
    # After a burst, a cost model fitted without a fixed cost (c0 = 0, the same time at n = 34) that stops
    # learning: the baseline forms batches of equal lengths only and its queue never drains at 140/s, half
    # the peak; the plan adds the measured excess over the predictions to the fixed cost and keeps batches
    # wide.
    frozen = (0.0, 0.000271 + 0.0127 / 34, 0.000141, 9.58e-08)
    coef = (0.0127, 0.000271, 0.000141, 9.58e-08)
    lengths = short_lengths(5000)
    v1 = simulate_open(lengths, "adaptive-v1", 140, 20, coef, saturate_clients=64, freeze_coef=frozen)
    new = simulate_open(lengths, "adaptive", 140, 20, coef, saturate_clients=64, freeze_coef=frozen)
    assert v1.p50 > 1.0
    assert new.p50 < 0.25
    assert new.p99 < 0.5
