"""bench.generate_bound's replay of the closed loop on measured step costs (issue 25): what it charges,
and the losses it exists to show -- prefill, and rows that empty when the list runs dry (no model, no
timing: step costs are given)."""

from __future__ import annotations

import pytest

from bench.generate_bound import CHUNKS, CONTEXTS, ROWS, StepCosts, replay


def costs(
    per_step: float = 0.01, per_row: float = 0.001, per_context_row: float = 0.0, per_token: float = 0.001
) -> StepCosts:
    decode = [[per_step + per_row * r + per_context_row * r * c for c in CONTEXTS] for r in ROWS]
    return StepCosts(decode, [per_token * n for n in CHUNKS])


def test_step_costs_interpolate_between_grid_points_and_beyond() -> None:
    c = costs(per_context_row=1e-5)
    assert c.decode_s(12, 300) == pytest.approx(0.01 + 0.012 + 1e-5 * 12 * 300)
    assert c.prefill_s(100) == pytest.approx(0.1)
    assert c.prefill_s(1000) == pytest.approx(1.0)  # past the grid: the last segment's slope


def test_one_client_decodes_one_row_per_step_after_its_prefill() -> None:
    out = replay(costs(), [(100, 50)], 1)
    # 100 prompt tokens in one chunk (0.1 s, the first token with it), then 49 one-row decode steps
    assert out["makespan_s"] == pytest.approx(0.1 + 49 * 0.011, abs=0.01)
    assert out["tokens_per_s"] == pytest.approx(50 / (0.1 + 49 * 0.011), rel=0.01)


def test_rows_empty_when_the_list_runs_dry_so_the_loop_stays_under_the_full_batch_rate() -> None:
    same = replay(costs(per_token=0.0), [(16, 64)] * 64, 32)
    mixed = replay(costs(per_token=0.0), [(16, 16)] * 56 + [(16, 256)] * 8, 32)
    full = 32 / costs().decode_s(32, 64)
    assert same["tokens_per_s"] == pytest.approx(full, rel=0.05)
    assert mixed["mean_rows"] < 16 and mixed["tokens_per_s"] < 0.7 * full


def test_a_decode_step_is_charged_at_its_rows_mean_context_not_the_longest() -> None:
    c = costs(per_context_row=1e-4, per_token=0.0)
    short, mixed = [(16, 64)] * 32, [(16, 64)] * 31 + [(512, 64)]
    # one long prompt among 31 short ones: the mean context grows by 16 (~1.25x here), not to 512 (~8x)
    ratio = replay(c, short, 32)["tokens_per_s"] / replay(c, mixed, 32)["tokens_per_s"]
    assert 1.0 < ratio < 1.5


def test_prefill_time_is_counted_and_shares_the_step_budget() -> None:
    out = replay(costs(per_token=0.001), [(512, 16)] * 4, 4, budget=512)
    # 4 x 512 prompt tokens at 1 ms: 2.048 s of prefill, one prompt per step
    assert out["prefill_share"] > 0.8
    assert out["makespan_s"] == pytest.approx(2.048 + 16 * 0.014, rel=0.1)


def test_a_steps_prefill_chunks_are_one_forward() -> None:
    c = StepCosts(costs().decode, [0.01 + 0.001 * n for n in CHUNKS])  # 10 ms a forward, 1 ms a token
    out = replay(c, [(16, 1)] * 3, 3)  # three prompts of 16 tokens, each answer its first token
    assert out["makespan_s"] == pytest.approx(0.01 + 0.048, abs=0.005)  # not 3 x (0.01 + 0.016)
