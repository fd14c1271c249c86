"""The statistical judge (analysis.judge): the canary's samples against the stable's from the same window,
Mann-Whitney with a Hodges-Lehmann effect, three outcomes (Pass, Fail, Inconclusive); dry-run
measurements that never decide; inconclusive windows that hold and then pause; measurements kept per
metric. Fixed samples, no Prometheus (the range queries are tested in test_op_promclient and
test_op_measurements)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from modeldeploy import cli
from modeldeploy.analysis import (
    ERROR_RATE,
    JUDGE_ERRORS,
    JUDGE_LATENCY,
    JUDGE_TTFT,
    P99,
    REQUESTS,
    Sample,
    advance,
    build_queries,
    judge,
)
from modeldeploy.api import AnalysisSpec, ModelDeployment
from modeldeploy.judge_stats import compare, finite_samples
from pydantic import ValidationError

T0 = datetime(2026, 1, 1, tzinfo=UTC)

#: per-2s mean latencies (ms), written by hand in the shape of a noop revision's (delay_ms=20) on the
#: local cluster: a floor, a right skew, one slow window
STABLE_MS = [21.9, 22.4, 21.7, 23.0, 22.1, 22.8, 21.6, 25.9, 22.2, 22.0, 21.8, 22.6, 22.3, 23.4, 21.9]
SAME_MS = [22.0, 21.8, 22.9, 22.3, 21.7, 23.1, 22.5, 21.9, 22.2, 24.8, 22.1, 21.6, 22.7, 22.4, 22.0]
#: the same with delay_ms=26: 30 % slower at the median, far under a 500 ms p99 limit
SLOWER_MS = [28.1, 28.6, 27.9, 29.4, 28.3, 28.0, 30.7, 28.5, 27.8, 28.9, 28.2, 29.1, 28.4, 27.9, 28.8]


def cmp(canary: list[float], stable: list[float], **kw: float) -> object:
    args = {"confidence": 0.98, "max_increase": 0.2, "min_samples": 6, "relative": True, **kw}
    return compare(canary, stable, **args)  # type: ignore[arg-type]


# -- the comparison -------------------------------------------------------------------------------------


def test_a_revision_30_percent_slower_fails_with_its_increase_and_p_value():
    c = cmp(SLOWER_MS, STABLE_MS)
    assert c.verdict == "Fail", c
    assert c.effect is not None and 0.25 < c.effect < 0.33
    assert c.p_value is not None and c.p_value < 0.001
    assert "> +20.0% allowed" in c.reason


def test_an_identical_revision_passes():
    c = cmp(SAME_MS, STABLE_MS)
    assert c.verdict == "Pass", c
    assert c.effect is not None and abs(c.effect) < 0.05
    assert c.low is not None and c.high is not None and c.low <= c.effect <= c.high


def test_a_small_increase_measured_precisely_is_allowed_though_significant():
    c = cmp([x * 1.05 for x in STABLE_MS], STABLE_MS)
    assert c.p_value is not None and c.p_value < 0.02  # significant ...
    assert c.verdict == "Pass"  # ... but +5 % is within the allowed +20 %


def test_a_faster_revision_passes():
    assert cmp([x * 0.7 for x in STABLE_MS], STABLE_MS).verdict == "Pass"


def test_too_few_samples_on_either_side_is_inconclusive():
    c = cmp(SLOWER_MS[:5], STABLE_MS)
    assert c.verdict == "Inconclusive" and "too few samples (canary 5, stable 15 < minSamples 6)" in c.reason
    assert cmp(SLOWER_MS, []).verdict == "Inconclusive"


def test_samples_too_noisy_to_tell_are_inconclusive_not_passed():
    rnd = random.Random(1)
    noisy_c = [rnd.lognormvariate(3.1, 0.9) for _ in range(8)]
    noisy_s = [rnd.lognormvariate(3.1, 0.9) for _ in range(8)]
    c = cmp(noisy_c, noisy_s)
    assert c.verdict == "Inconclusive" and "interval too wide" in c.reason, c


def test_a_stalled_sample_is_kept_and_fails_neither_an_identical_nor_an_allowed_slower_revision():
    """No outlier is dropped (judge_stats.finite_samples says why): a stall is one rank to the U test and
    widens Welch's standard error as much as it moves the mean."""
    with_stall = [*SAME_MS[:-1], 900.0]
    assert finite_samples([*with_stall, float("nan"), float("inf")]) == with_stall
    assert cmp(with_stall, STABLE_MS).verdict == "Pass"
    # +5 % (allowed) is significant on these samples, and the stall makes the mean +250 %: not a Fail
    slower = [x * 1.05 for x in SAME_MS[:-1]] + [900.0]
    c = cmp(slower, STABLE_MS)
    assert c.verdict == "Pass" and c.p_value is not None and c.p_value < 0.02, c
    assert c.mean_effect is not None and c.mean_effect > 2


#: quantized latencies (1 ms): the IQR of a side is 0
STABLE_Q = [20.0] * 19 + [21.0] * 5


@pytest.mark.parametrize(
    "canary",
    [
        pytest.param([20.0] * 14 + [21.0] * 4 + [40.0] * 6, id="a quarter twice as slow"),
        pytest.param([20.0] * 15 + [21.0] * 4 + [60.0] * 5, id="a fifth three times as slow"),
    ],
)
def test_a_canary_slow_in_a_share_of_its_quantized_intervals_fails_on_its_mean(canary: list[float]):
    """Its median is the stable's, so the median shift is 0; Tukey's fences on its own samples (IQR 0)
    dropped the slow fifth outright. The mean shows it: +25 % and +41 %, Welch's p < 0.02."""
    c = cmp(canary, STABLE_Q)
    assert c.verdict == "Fail" and c.effect is not None and c.effect < 0.2, c
    assert c.canary_n == 24 and "mean increase +" in c.reason and "> +20.0% allowed" in c.reason


@pytest.mark.parametrize(
    ("canary", "stable", "confidence"),
    [
        pytest.param([1480.0, 2650.0, 4120.0], [20.1, 21.3, 22.0], 0.98, id="3 a side at 98%"),
        pytest.param(
            [1480.0, 2650.0, 4120.0, 1900.0, 3300.0],
            [20.1, 21.3, 22.0, 20.6, 21.8],
            0.9999,
            id="5 a side at 99.99%",
        ),
    ],
)
def test_a_revision_100_times_slower_on_few_samples_fails_rather_than_being_too_wide_to_judge(
    canary: list[float], stable: list[float], confidence: float
):
    """Three samples a side cannot be significant at 98 % (the least p is 1/20), nor five at 99.99 %, and
    the interval is wide -- but all of it is above the allowed increase."""
    c = cmp(canary, stable, min_samples=3, confidence=confidence)
    assert c.verdict == "Fail" and "the whole interval > +20.0% allowed" in c.reason, c
    assert c.low is not None and c.low > 0.2 and c.p_value is not None and c.p_value > 1 - confidence


def test_error_shares_are_compared_absolutely():
    stable = [0.0] * 12
    assert cmp([0.0] * 12, stable, relative=False, max_increase=0.01).verdict == "Pass"
    failing = [0.05, 0.04, 0.06, 0.05, 0.05, 0.07, 0.04, 0.05, 0.06, 0.05, 0.05, 0.04]
    c = cmp(failing, stable, relative=False, max_increase=0.01)
    assert c.verdict == "Fail" and c.effect == pytest.approx(0.05, abs=0.01)


def test_two_identical_revisions_pass_20_windows_out_of_20():
    rnd = random.Random(7)
    verdicts = []
    for _ in range(20):
        c_ = [rnd.lognormvariate(3.1, 0.05) for _ in range(15)]
        s_ = [rnd.lognormvariate(3.1, 0.05) for _ in range(15)]
        verdicts.append(cmp(c_, s_, max_increase=0.25).verdict)
    assert verdicts == ["Pass"] * 20


def _stalling(rnd: random.Random, n: int, share: float) -> list[float]:
    """``n`` latencies of one revision, each interval 20 times as slow with probability ``share``."""
    return [rnd.lognormvariate(3.1, 0.05) * (20 if rnd.random() < share else 1) for _ in range(n)]


def _erring(rnd: random.Random, n: int) -> list[float]:
    """``n`` error shares: none in 80 % of the intervals, up to 10 % in the others."""
    return [rnd.random() * 0.1 if rnd.random() < 0.2 else 0.0 for _ in range(n)]


#: identical revisions, as a window's two sides: (canary, stable, compare's arguments)
NULL_WINDOWS = {
    "stalls in 7 % of 15 intervals": lambda r: (_stalling(r, 15, 0.07), _stalling(r, 15, 0.07), {}),
    "stalls in 15 % of 30 intervals": lambda r: (_stalling(r, 30, 0.15), _stalling(r, 30, 0.15), {}),
    "error shares in bursts": lambda r: (
        _erring(r, 15),
        _erring(r, 15),
        {"relative": False, "max_increase": 0.01},
    ),
    "a heavy tail (Pareto 3)": lambda r: (
        [20 * r.paretovariate(3) for _ in range(15)],
        [20 * r.paretovariate(3) for _ in range(15)],
        {},
    ),
}


@pytest.mark.parametrize("name", NULL_WINDOWS)
def test_identical_revisions_with_stalls_and_tails_fail_at_most_at_the_nominal_rate(name: str):
    """Every sample is kept and the mean is judged too: simulated, neither makes identical revisions fail
    more often than 1 - confidence (2 %) of windows; 3 % allows for the noise of 400 windows. Fences on
    each side's own samples failed 4 % of the windows with stalls in 15 % of intervals (one side's
    stalls went, the other's stayed; 16 % with the mean's test). 2000 windows of each with this judge,
    four seeds: 0-0.3 %, 1.3-2.2 %, 0.7-1.1 %, 1.4-1.8 % -- the mean's test makes the second and the
    fourth about as often significant as its level allows, where the median shift never was."""
    rnd, fails, windows = random.Random(5), 0, 400
    for _ in range(windows):
        canary, stable, kw = NULL_WINDOWS[name](rnd)
        fails += cmp(canary, stable, **kw).verdict == "Fail"
    assert fails <= 0.03 * windows, fails


# -- the queries ----------------------------------------------------------------------------------------

JUDGED = AnalysisSpec.model_validate({"judge": {"sampleInterval": "2s", "maxIncrease": 0.2}})


def queries(spec: AnalysisSpec = JUDGED, stable: str | None = "s1", generation: bool = False):
    return build_queries(
        spec,
        namespace="ns",
        name="m",
        revision="c1",
        stable=stable,
        interval="30s",
        generation=generation,
    )


def test_the_judge_asks_range_queries_of_canary_and_stable_over_the_window():
    q = {x.metric: x for x in queries()}
    lat, err = q[JUDGE_LATENCY], q[JUDGE_ERRORS]
    assert lat.judge is not None and err.judge is not None
    assert (
        'modeldeploy_io_revision="c1"' in lat.promql and 'modeldeploy_io_revision="s1"' in lat.judge.baseline
    )
    assert "modelserver_request_duration_seconds_sum" in lat.promql and "[2s]" in lat.promql
    assert (lat.judge.window, lat.judge.step, lat.judge.relative) == (30.0, 2.0, True)
    assert lat.threshold == 0.2 and err.threshold == 0.01 and not err.judge.relative
    assert 'code=~"5..|413|429"' in err.promql


def test_the_judge_needs_a_stable_to_compare_with():
    assert not {JUDGE_LATENCY, JUDGE_ERRORS} & {x.metric for x in queries(stable=None)}
    assert not {JUDGE_LATENCY, JUDGE_ERRORS} & {x.metric for x in queries(AnalysisSpec())}


def test_for_generation_the_judge_compares_time_to_first_token():
    q = {x.metric: x for x in queries(generation=True)}
    assert JUDGE_LATENCY not in q
    assert "modelserver_generation_time_to_first_token_seconds_sum" in q[JUDGE_TTFT].promql


def test_a_window_too_short_for_min_samples_is_refused_naming_the_field():
    md = {
        "apiVersion": "modeldeploy.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {
            "model": {"name": "m", "version": "1", "uri": "noop://?delay_ms=1"},
            "rollout": {"interval": "1m", "analysis": {"judge": {"sampleInterval": "20s"}}},
        },
    }
    with pytest.raises(ValidationError, match=r"spec\.rollout\.analysis\.judge\.sampleInterval"):
        ModelDeployment.model_validate(md)


# -- the window's verdict -------------------------------------------------------------------------------


def window(spec: AnalysisSpec, canary: list[float], stable: list[float], **values: float) -> list[Sample]:
    base = {REQUESTS: 300.0, ERROR_RATE: 0.0, P99: 40.0, **values}
    out = []
    for q in build_queries(spec, namespace="ns", name="m", revision="c1", stable="s1", interval="30s"):
        if q.metric == JUDGE_LATENCY:
            out.append(Sample(q, None, series=tuple(canary), baseline=tuple(stable)))
        elif q.metric == JUDGE_ERRORS:
            out.append(Sample(q, None, series=(0.0,) * 15, baseline=(0.0,) * 15))
        else:
            out.append(Sample(q, base.get(q.metric, 0.0)))
    return out


def test_a_slower_canary_under_the_fixed_p99_limit_fails_the_window_on_the_judge():
    j = judge(window(JUDGED, SLOWER_MS, STABLE_MS), T0)
    assert j.verdict == "Fail" and j.failing is not None and j.failing.metric == JUDGE_LATENCY
    by = {m.metric: m for m in j.measurements}
    assert by[P99].verdict == "Pass"  # the fixed threshold alone would have passed it
    m = by[JUDGE_LATENCY]
    # every sample counts, the stable's one slow window (25.9 ms) too
    assert m.judge is not None and m.judge.canary_samples == 15 and m.judge.stable_samples == 15
    assert m.judge.canary is not None and m.judge.stable is not None and m.judge.canary > m.judge.stable
    out = advance(JUDGED, None, j, T0)
    assert out.action == "fail" and "judge-latency-ms: Fail: increase +" in out.reason


def test_an_infinite_increase_is_stored_as_null_and_the_status_is_json_the_apiserver_takes():
    """A stable median near 0 makes the relative increase overflow to infinity; JSON has no Infinity, and
    a status patch with one would be refused (and the window's verdict lost with it)."""
    tiny = [1e-310] * 15  # a positive median, so the increase is relative to it
    j = judge(window(JUDGED, SLOWER_MS, tiny), T0)
    assert j.verdict == "Fail"
    m = {x.metric: x for x in j.measurements}[JUDGE_LATENCY]
    assert m.value is None and m.judge is not None and m.judge.low is None and m.judge.high is None
    assert "beyond the float range, not stored: effect, low, high" in m.judge.reason
    state = advance(JUDGED, None, j, T0).state
    assert state is not None and json.loads(json.dumps(state.to_api(), allow_nan=False))


def test_a_dry_run_judge_is_measured_and_shown_but_never_decides():
    spec = JUDGED.model_copy(update={"dry_run": [JUDGE_LATENCY]})
    j = judge(window(spec, SLOWER_MS, STABLE_MS), T0)
    assert j.verdict == "Pass"
    m = {x.metric: x for x in j.measurements}[JUDGE_LATENCY]
    assert m.verdict == "Fail" and m.dry_run is True


def test_a_dry_run_fixed_threshold_never_decides_either():
    spec = AnalysisSpec.model_validate({"dryRun": [P99], "maxP99LatencyMs": 10})
    samples = [
        Sample(q, {REQUESTS: 300.0, ERROR_RATE: 0.0, P99: 40.0}.get(q.metric, 0.0))
        for q in build_queries(spec, namespace="ns", name="m", revision="c1", stable="s1", interval="30s")
    ]
    j = judge(samples, T0)
    assert j.verdict == "Pass" and {m.metric: m for m in j.measurements}[P99].verdict == "Fail"


def test_inconclusive_windows_hold_the_step_then_pause_for_a_human():
    spec = AnalysisSpec.model_validate({"judge": {"sampleInterval": "2s", "inconclusiveLimit": 2}})
    j = judge(window(spec, SLOWER_MS[:4], STABLE_MS), T0)
    assert j.verdict == "Inconclusive"
    first = advance(spec, None, j, T0)
    assert first.action == "hold" and first.verdict == "Inconclusive"
    assert first.state.consecutive_inconclusive == 1 and first.state.paused_reason is None
    second = advance(spec, first.state, j, T0 + timedelta(seconds=30))
    assert second.action == "pause" and second.state.paused_reason is not None
    assert "2/2 inconclusive windows" in second.state.paused_reason


def test_a_passing_window_starts_the_inconclusive_count_over():
    spec = AnalysisSpec.model_validate({"judge": {"sampleInterval": "2s", "inconclusiveLimit": 2}})
    held = advance(spec, None, judge(window(spec, SLOWER_MS[:4], STABLE_MS), T0), T0)
    passed = advance(spec, held.state, judge(window(spec, SAME_MS, STABLE_MS), T0), T0)
    assert passed.action == "pass" and passed.state.consecutive_inconclusive == 0


# -- what kubectl modeldeploy status shows --------------------------------------------------------------


def test_status_draws_each_judged_window_as_canary_and_stable_bars_with_the_verdict():
    spec = JUDGED.model_copy(update={"dry_run": [JUDGE_ERRORS]})
    st = advance(spec, None, judge(window(spec, SAME_MS, STABLE_MS), T0), T0).state
    st = advance(spec, st, judge(window(spec, SLOWER_MS, STABLE_MS), T0 + timedelta(seconds=30)), T0).state
    md = {
        "metadata": {"name": "m", "namespace": "ns", "generation": 2},
        "spec": {"model": {"name": "echo", "version": "2"}},
        "status": {"observedGeneration": 2, "analysis": st.to_api()},
    }
    text = cli.render_status(md, now=T0 + timedelta(seconds=40))
    chart = text[text.index("judge-latency-ms: canary vs stable") :].splitlines()
    assert "allowed +20.0%" in chart[0]
    passed, failed = chart[1], chart[2]
    assert passed.rstrip().endswith("Pass") and failed.rstrip().endswith("Fail")
    # one scale: the slower canary's bar is the longest; the stable's is as long in both windows
    bars = [len(part.split()[0]) for part in failed.split("canary ")[1].split("stable ")]
    assert bars[0] == cli.BAR and bars[1] < cli.BAR
    assert "+27.9% [" in failed and "n=15/15" in failed
    # the dry-run measurement is shown as such in the table
    assert any(JUDGE_ERRORS in line and "(dry run)" in line for line in text.splitlines())


# -- each measurement names its window ------------------------------------------------------------------


def test_each_measurement_names_the_step_it_decided_and_the_plugin_shows_it():
    from md_canary import World

    w = World()
    w.deploy_first()
    new = w.new_version("2")
    w.reconcile()
    w.run_for(10)  # the first window (25 %) passes
    w.prom.values[new] = {ERROR_RATE: 0.2}
    w.run_for(10)  # the second (50 %) fails
    st = w.status
    h = st["history"][-1]
    assert h["outcome"] == "RolledBack" and h["measurement"]["window"] == "step 2/3 at 50%"
    windows = {m["window"] for m in st["analysis"]["measurements"] if m["revision"] == new}
    assert windows == {"step 1/3 at 25%", "step 2/3 at 50%"}
    text = cli.render_status(w.raw, now=w.clock.now)
    failed = [
        line for line in text.splitlines() if line.strip().startswith("step 2/3 at 50%") and "Fail" in line
    ]
    assert failed and ERROR_RATE in failed[0]


# -- samples recorded on the local cluster --------------------------------------------------------------

#: written by tests/e2e/test_judge.py with $JUDGE_SAMPLES_RECORD: each window's 2 s samples of both
#: revisions as the local cluster's Prometheus answered them (noop revisions, 20 ms vs 26 ms per batch)
RECORDED = json.loads((Path(__file__).parent / "judge_samples_recorded.json").read_text())


@pytest.mark.parametrize(("case", "verdict"), [("slower_30pct", "Fail"), ("identical", "Pass")])
def test_recorded_windows_get_the_verdict_the_operator_gave_them(case: str, verdict: str):
    rec = RECORDED[case]  # recorded 2026-12-04 on the local cluster (e2e test_judge.py)
    c = cmp(rec["canary"], rec["stable"])
    assert rec["operator"]["reason"] and c.verdict == verdict, (c, rec["operator"])
    assert min(len(rec["canary"]), len(rec["stable"])) >= 8


def test_the_operator_starts_without_scipy_which_only_a_judged_window_imports() -> None:
    """scipy costs the operator ~70 MiB of RSS at start (bench-operator: 144 MiB at start with it at import
    time, against 70 before the judge); it is imported when a window is first judged."""
    import subprocess
    import sys
    from pathlib import Path

    import modeldeploy

    code = "import sys, modeldeploy.operator; print('scipy' in sys.modules)"
    root = Path(modeldeploy.__file__).parent.parent
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.strip() == "False"
