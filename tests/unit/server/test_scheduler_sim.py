"""Batch formation on a simulated clock (bench/serving_sim.py): the real BatchQueue, a closed loop of 128
clients, batch latency from all-MiniLM-L6-v2's CPU cost function. Deterministic; no model, no timing."""

from __future__ import annotations

import pytest

from bench.serving_sim import long_lengths, short_lengths, simulate, sorted_limit


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
