"""The statistical judge (``analysis.judge``): the canary's samples against the stable's, from the same
window, as Kayenta's Mann-Whitney judge compares them (pure; scipy does the statistics).

Per metric:

1. NaNs dropped; outliers removed with Tukey's far-out fences (outside ``Q1 - 3 IQR .. Q3 + 3 IQR`` of
   each side's own samples: a sample interval with one stalled scrape, not a slower revision);
2. a one-sided Mann-Whitney U test, *is the canary stochastically larger* (slower, or erring more);
3. the Hodges-Lehmann estimate of the shift (the median of all canary - stable differences) with its
   distribution-free confidence interval (the order statistics of those differences at the U test's
   critical value, normal approximation), relative to the stable's median for latency, absolute for an
   error share.

Verdict, in this order:

* ``Inconclusive`` -- fewer than ``minSamples`` on either side (after outliers), or a latency whose stable
  median is not positive (nothing to be relative to);
* ``Fail`` -- the increase is significant (p < 1 - ``confidence``) *and* its estimate is above the allowed
  increase: significance alone is not enough (a 2 % slowdown measured precisely is allowed), nor is a
  large estimate from noise;
* ``Inconclusive`` -- the confidence interval is wider than twice the allowed increase: these samples
  cannot tell an allowed change from a forbidden one;
* ``Pass`` otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: Tukey's far-out fences: samples further than this many IQRs outside the quartiles are dropped
IQR_FACTOR = 3.0
#: differences kept for the Hodges-Lehmann interval (samples beyond are thinned evenly: bounded work)
MAX_SAMPLES = 1000

JudgeVerdict = Literal["Pass", "Fail", "Inconclusive"]


@dataclass(frozen=True)
class Comparison:
    """The judge's answer for one metric and window."""

    verdict: JudgeVerdict
    reason: str
    canary_n: int
    stable_n: int
    canary_median: float | None = None
    stable_median: float | None = None
    effect: float | None = None  # Hodges-Lehmann shift (relative to the stable's median, or absolute)
    low: float | None = None  # the shift's confidence interval, same scale
    high: float | None = None
    p_value: float | None = None  # one-sided: the canary larger


def without_outliers(samples: Sequence[float], factor: float = IQR_FACTOR) -> list[float]:
    """``samples`` without NaN/inf and without values outside Tukey's fences (``factor`` x IQR)."""
    xs = [float(x) for x in samples if x is not None and math.isfinite(x)]
    if len(xs) < 4:
        return xs
    q1, q3 = np.percentile(xs, [25, 75])
    iqr = q3 - q1
    lo, hi = q1 - factor * iqr, q3 + factor * iqr
    return [x for x in xs if lo <= x <= hi]


def _thin(xs: list[float]) -> np.ndarray:
    arr = np.asarray(xs, dtype=float)
    if len(arr) <= MAX_SAMPLES:
        return arr
    return arr[np.linspace(0, len(arr) - 1, MAX_SAMPLES).round().astype(int)]


def hodges_lehmann(
    canary: Sequence[float], stable: Sequence[float], confidence: float
) -> tuple[float, float, float]:
    """(estimate, low, high) of the shift canary - stable: the median of all pairwise differences and its
    two-sided ``confidence`` interval (Moses' order statistics, normal approximation of U)."""
    c, s = _thin(list(canary)), _thin(list(stable))
    diffs = np.sort(np.subtract.outer(c, s).ravel())
    n, m = len(c), len(s)
    from scipy import stats  # imported on first use: it costs the operator ~70 MiB of RSS at start

    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    k = math.floor(n * m / 2 - z * math.sqrt(n * m * (n + m + 1) / 12))
    k = min(max(k, 0), len(diffs) - 1)
    return float(np.median(diffs)), float(diffs[k]), float(diffs[len(diffs) - 1 - k])


def mann_whitney_greater(canary: Sequence[float], stable: Sequence[float]) -> float:
    """One-sided p-value of *the canary is stochastically larger* (1.0 when every sample is equal)."""
    if np.ptp(np.concatenate([np.asarray(canary, float), np.asarray(stable, float)])) == 0:
        return 1.0
    from scipy import stats

    return float(stats.mannwhitneyu(canary, stable, alternative="greater").pvalue)


def compare(
    canary: Sequence[float],
    stable: Sequence[float],
    *,
    confidence: float,
    max_increase: float,
    min_samples: int,
    relative: bool,
) -> Comparison:
    """The verdict on one metric's samples (see the module docstring for the rules)."""
    c, s = without_outliers(canary), without_outliers(stable)
    n, m = len(c), len(s)
    if n < min_samples or m < min_samples:
        return Comparison(
            "Inconclusive", f"too few samples (canary {n}, stable {m} < minSamples {min_samples})", n, m
        )
    c_med, s_med = float(np.median(c)), float(np.median(s))
    if relative and s_med <= 0:
        return Comparison(
            "Inconclusive", "the stable's median is 0: no scale to compare with", n, m, c_med, s_med
        )
    p = mann_whitney_greater(c, s)
    est, low, high = hodges_lehmann(c, s, confidence)
    scale = s_med if relative else 1.0
    effect, low, high = est / scale, low / scale, high / scale
    facts = dict(canary_median=c_med, stable_median=s_med, effect=effect, low=low, high=high, p_value=p)
    shown = _shown(effect, low, high, relative)
    alpha = 1 - confidence
    if p < alpha and effect > max_increase:
        why = f"increase {shown} > {_pct(max_increase, relative)} allowed, p={p:.2g} < {alpha:.2g}"
        return Comparison("Fail", why, n, m, **facts)
    if high - low > 2 * max_increase:
        why = f"interval too wide to judge: {shown} (wider than 2 x {_pct(max_increase, relative)})"
        return Comparison("Inconclusive", why, n, m, **facts)
    return Comparison("Pass", f"increase {shown}, p={p:.2g}", n, m, **facts)


def _pct(x: float, relative: bool) -> str:
    return f"{x * 100:+.1f}%" if relative else f"{x:+.4g}"


def _shown(effect: float, low: float, high: float, relative: bool) -> str:
    return f"{_pct(effect, relative)} [{_pct(low, relative)}, {_pct(high, relative)}]"
