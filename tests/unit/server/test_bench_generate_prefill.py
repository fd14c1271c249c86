"""bench-generate's "limit with prefill" (issue 25): the plain loop's tokens/s and prefill share, and the
ratio the report gives against it (no model, no timing)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.generate import with_prefill
from bench.generate_report import markdown, ratios_of


def test_with_prefill_adds_the_prefill_time_to_the_decode_time() -> None:
    # 3000 answer tokens at 1000 tok/s decode = 3 s, plus 1 s of prefill: 750 tok/s, prefill 25 %
    out = with_prefill(1.0, 3000, 1000.0)
    assert out == {"tokens_per_s": 750.0, "prefill_share": 0.25, "prefill_s": 1.0, "decode_s": 3.0}


def _res() -> dict[str, Any]:
    run = {"output_tokens_per_s": 300.0, "ttft_p99_s": 2.0, "ok": 64, "requests": 64, "ttft_p50_s": 0.4,
           "inter_token_p99_s": 0.3, "kv_cache_usage": None}  # fmt: skip
    return {
        "modelserver-own": {"closed": {"32": run}, "poisson": {}},
        "limit_decode_tokens_per_s": {"32": 1000.0},
        "limit_with_prefill": {"32": with_prefill(3.0, 3000, 1000.0)},  # 500 tok/s, prefill 50 %
    }


def test_ratios_give_the_share_of_both_limits() -> None:
    r = ratios_of(_res(), "modelserver-own")["32"]
    assert r["share_of_limit"] == pytest.approx(0.30)
    assert r["share_of_limit_with_prefill"] == pytest.approx(0.60)


def test_ratios_without_limit_with_prefill_leave_it_out() -> None:
    res = _res()
    del res["limit_with_prefill"]
    assert "share_of_limit_with_prefill" not in ratios_of(res, "modelserver-own")["32"]


def test_report_names_the_limit_with_prefill_and_its_prefill_share() -> None:
    res = _res()
    res["machine"] = {"cpus": 2, "cpu_model": "x", "server_cpu": "1", "loadavg_before": [0],
                      "loadavg_after": [0], "kv_cache_budget_mb": 1}  # fmt: skip
    res["config"] = {"kv_cache_tokens": 1, "max_batch_tokens": 1, "running": 1}
    res.update(commit="c", date="d", ratios={"modelserver-own": ratios_of(res, "modelserver-own")})
    md = markdown(res)
    assert "Limit with prefill" in md
    assert '"prefill_share": 0.5' in md
    assert '"share_of_limit_with_prefill": 0.6' in md
