"""The statistical judge (``analysis.judge``): the canary's samples against the stable's, from the same
window, after Kayenta's Mann-Whitney judge (pure; scipy does the statistics).

Per metric, on every finite sample of each side (NaN -- an interval without requests -- and infinities
dropped; nothing else is, see :func:`finite_samples`):

1. a one-sided Mann-Whitney U test, *is the canary stochastically larger* (slower, or erring more);
2. the Hodges-Lehmann estimate of the shift (the median of all canary - stable differences) with its
   distribution-free confidence interval (the order statistics of those differences at the U test's
   critical value, normal approximation), relative to the stable's median for latency, absolute for an
   error share;
3. the increase of the mean (relative to the stable's mean for latency, absolute for an error share)
   with Welch's one-sided t-test: the median shift cannot see a canary slow in a minority of its
   intervals (with a quarter of them twice as slow the median shift is 0 and the mean +25 %).

Verdict, in this order:

* ``Inconclusive`` -- fewer than ``minSamples`` on either side, a latency whose stable median is not
  positive (nothing to be relative to), or an increase that is not a number (samples so large that
  their differences overflow);
* ``Fail`` -- the shift is significant (Mann-Whitney p < 1 - ``confidence``) *and* its estimate is above
  the allowed increase: significance alone is not enough (a 2 % slowdown measured precisely is
  allowed), nor is a large estimate from noise;
* ``Fail`` -- the same for the mean: Welch's p < 1 - ``confidence`` and the mean's increase above the
  allowed one (a stalled interval widens Welch's standard error as much as it moves the mean, so one
  stall is not significant);
* ``Fail`` -- the whole confidence interval is above the allowed increase, however wide: every canary
  sample is slower than the stable's by more than allowed. Only a few samples get here without being
  significant (with 3 on each side the smallest possible p is 1/20): without this rule such a judge could
  never fail anything, and a revision 100 times slower would be held, not rolled back;
* ``Inconclusive`` -- the confidence interval is wider than twice the allowed increase: these samples
  cannot tell an allowed change from a forbidden one;
* ``Pass`` otherwise.

Every number of a :class:`Comparison` is finite or None: status is sent to the apiserver as JSON, which
has no Infinity or NaN (a patch carrying one is refused, and the verdict with it). An increase beyond the
float range (a stable median near 0) is None, and the reason says so; the verdict is taken before.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

#: differences kept for the Hodges-Lehmann interval (samples beyond are thinned evenly: bounded work)
MAX_SAMPLES = 1000

JudgeVerdict = Literal["Pass", "Fail", "Inconclusive"]


@dataclass(frozen=True)
class Comparison:
    """The judge's answer for one metric and window; every number finite or None."""

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
    mean_effect: float | None = None  # the mean's increase (relative to the stable's mean, or absolute)


def finite_samples(samples: Sequence[float]) -> list[float]:
    """``samples`` without NaN (an interval without requests) and infinities. No outlier is dropped:
    fences drawn on each side's own samples make the two sides unlike -- with quantized latencies (an IQR
    of 0) every sample off the mode went, a canary slow in a fifth of its intervals with them, and
    where one side's stalls went and the other's stayed, identical revisions were "significantly"
    different (2.7-4.4 % of windows at a nominal 2 %; 16 % with the mean's test). The statistics need no
    trimming: a stall is one rank in the U test and the Hodges-Lehmann median, and it widens Welch's
    standard error as much as it moves the mean."""
    return [float(x) for x in samples if x is not None and math.isfinite(x)]


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


def welch_greater(canary: Sequence[float], stable: Sequence[float]) -> float:
    """One-sided p-value of Welch's t-test, *the canary's mean is larger* (1.0 when neither side varies:
    the rank test judges samples that are all alike)."""
    from scipy import stats

    with warnings.catch_warnings():
        # nearly equal samples: scipy warns of precision loss and answers, rightly, that nothing differs
        warnings.simplefilter("ignore", RuntimeWarning)
        p = float(stats.ttest_ind(canary, stable, equal_var=False, alternative="greater").pvalue)
    return p if math.isfinite(p) else 1.0


@dataclass(frozen=True)
class _Measured:
    """What the verdict is taken on, on the comparison's scale."""

    effect: float
    low: float
    high: float
    p: float  # Mann-Whitney
    mean_effect: float | None
    mean_p: float  # Welch; 1.0 where not asked (the mean's increase is allowed)


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
    c, s = finite_samples(canary), finite_samples(stable)
    n, m = len(c), len(s)
    if n < min_samples or m < min_samples:
        return Comparison(
            "Inconclusive", f"too few samples (canary {n}, stable {m} < minSamples {min_samples})", n, m
        )
    c_med, s_med = float(np.median(c)), float(np.median(s))
    if relative and s_med <= 0:
        why = "the stable's median is 0: no scale to compare with"
        return _finite(Comparison("Inconclusive", why, n, m, c_med, s_med))
    est, low, high = hodges_lehmann(c, s, confidence)
    scale = s_med if relative else 1.0
    mean_effect = _mean_increase(c, s, relative)
    asked = mean_effect is not None and mean_effect > max_increase
    got = _Measured(
        est / scale,
        low / scale,
        high / scale,
        mann_whitney_greater(c, s),
        mean_effect,
        welch_greater(c, s) if asked else 1.0,
    )
    verdict, why = _verdict(got, 1 - confidence, max_increase, relative)
    facts = dict(effect=got.effect, low=got.low, high=got.high, p_value=got.p, mean_effect=mean_effect)
    return _finite(Comparison(verdict, why, n, m, c_med, s_med, **facts))


def _mean_increase(c: list[float], s: list[float], relative: bool) -> float | None:
    """The canary's mean over the window against the stable's: relative for latency (None without a
    positive stable mean), absolute for an error share."""
    with np.errstate(over="ignore", invalid="ignore"):  # beyond the float range: inf, handled after
        mean_c, mean_s = float(np.mean(c)), float(np.mean(s))
    if not relative:
        return mean_c - mean_s
    return mean_c / mean_s - 1 if mean_s > 0 else None


def _verdict(x: _Measured, alpha: float, max_increase: float, relative: bool) -> tuple[JudgeVerdict, str]:
    """The rules of the module docstring, in their order, on the numbers as computed (infinite ones
    included: a canary infinitely slower fails)."""
    shown = _shown(x.effect, x.low, x.high, relative)
    allowed = _pct(max_increase, relative)
    if any(math.isnan(v) for v in (x.effect, x.low, x.high)):
        return "Inconclusive", f"the increase is not a number: {shown} (samples beyond the float range)"
    if x.p < alpha and x.effect > max_increase:
        return "Fail", f"increase {shown} > {allowed} allowed, p={x.p:.2g} < {alpha:.2g}"
    if x.mean_effect is not None and x.mean_effect > max_increase and x.mean_p < alpha:
        mean = _pct(x.mean_effect, relative)
        why = f"mean increase {mean} > {allowed} allowed, Welch p={x.mean_p:.2g} < {alpha:.2g}"
        return "Fail", f"{why} (median increase {shown}, p={x.p:.2g})"
    if x.low > max_increase:
        why = f"increase {shown}: the whole interval > {allowed} allowed (p={x.p:.2g}: few samples)"
        return "Fail", why
    if x.high - x.low > 2 * max_increase:
        return "Inconclusive", f"interval too wide to judge: {shown} (wider than 2 x {allowed})"
    return "Pass", f"increase {shown}, p={x.p:.2g}"


def _finite(c: Comparison) -> Comparison:
    """``c`` with every infinite or NaN number None, the reason saying so (status is JSON, which has
    neither; a None is never mistaken for a measured value, as a sentinel number would be)."""
    names = ("canary_median", "stable_median", "effect", "low", "high", "p_value", "mean_effect")
    bad = [k for k in names if not _is_finite(getattr(c, k))]
    if not bad:
        return c
    reason = f"{c.reason}; beyond the float range, not stored: {', '.join(bad)}"
    kept = [x if _is_finite(x) else None for x in (getattr(c, k) for k in names)]
    return Comparison(c.verdict, reason, c.canary_n, c.stable_n, *kept)


def _is_finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


def _pct(x: float, relative: bool) -> str:
    return f"{x * 100:+.1f}%" if relative else f"{x:+.4g}"


def _shown(effect: float, low: float, high: float, relative: bool) -> str:
    return f"{_pct(effect, relative)} [{_pct(low, relative)}, {_pct(high, relative)}]"
