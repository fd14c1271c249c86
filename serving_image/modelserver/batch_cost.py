"""What the batching core knows of the model's cost: :class:`CostModel` learns batch latency ``t(n, L)``
online, :class:`BucketPolicy` holds the length buckets (fixed, or from observed length quantiles)."""

from __future__ import annotations

import bisect
import math
import threading
from collections import deque
from collections.abc import Sequence

import numpy as np


class CostModel:
    """Online estimate of batch latency ``t(n, L)`` in seconds.

    Features ``[1, n, T, T*L]``: ``T`` the positions the batch runs -- ``n*L`` padded, the real tokens when
    packed (modelserver.packing; ``L`` is then the rows' width) -- so a padded batch's are
    ``[1, n, n*L, n*L^2]``. Coefficients are fitted by non-negative least squares on relative error
    over the most recent observations, refitted every few observations.

    One ring buffer of the last ``window`` observations. After a burst of large batches it holds nothing
    else, so the fixed cost ``c0`` cannot be told apart from the per-item cost ``c1``, and a fit with
    ``c0 ~ 0`` explains the data as well; the queue's plan guards against that (see
    :meth:`BatchQueue.record`). (A model that keeps observations per cell of sizes and lengths fared worse:
    bench/batching_v1.py's ``StratifiedCostModel``, the benchmark's comparison.)
    """

    FEATURES = 4

    def __init__(self, window: int = 512, refit_every: int = 8) -> None:
        self._obs: deque[tuple[int, int, float, int]] = deque(maxlen=window)
        self._count = 0
        self._refit_every = refit_every
        self._since_fit = 0
        # A weak prior, only used until the first fit: 0.5 ms + 2 us per padded token.
        self.coef = np.array([5e-4, 0.0, 2e-6, 0.0])
        self.fitted = False
        self._lock = threading.Lock()

    def predict(self, n: int, length: int, tokens: int | None = None) -> float:
        """Seconds for ``n`` items of rows ``length`` wide running ``tokens`` positions (``n * length``:
        padded)."""
        c = self.coef
        t = n * length if tokens is None else tokens
        return float(c[0] + n * c[1] + t * (c[2] + length * c[3]))

    def observe(self, n: int, length: int, seconds: float, tokens: int | None = None) -> None:
        if seconds <= 0 or n <= 0:
            return
        length = max(1, length)
        with self._lock:
            self._keep((n, length, seconds, n * length if tokens is None else max(1, tokens)))
            self._count += 1
            self._since_fit += 1
            if self._since_fit >= (1 if self._count < 32 else self._refit_every):
                self._fit()

    def _keep(self, ob: tuple[int, int, float, int]) -> None:
        self._obs.append(ob)

    def observations(self) -> list[tuple[int, int, float, int]]:
        """The (n, padded length or row width, seconds, positions) observations the fit uses."""
        return list(self._obs)

    def _fit(self) -> None:
        self._since_fit = 0
        obs = np.array(self.observations(), dtype=np.float64)
        if len(obs) < 2:
            return
        n, length, y, tokens = obs[:, 0], obs[:, 1], obs[:, 2], obs[:, 3]
        x = np.stack([np.ones_like(n), n, tokens, tokens * length], axis=1)
        w = 1.0 / y  # relative error
        xw, yw = x * w[:, None], y * w
        active = list(range(self.FEATURES))
        coef = np.zeros(self.FEATURES)
        while active:
            sol, *_ = np.linalg.lstsq(xw[:, active], yw, rcond=None)
            if (sol >= 0).all():
                coef[:] = 0
                coef[active] = sol
                break
            active.pop(int(np.argmin(sol)))
        if coef.any():
            self.coef = coef
            self.fitted = True


# ----------------------------------------------------------------------------------------------------------
# buckets


class BucketPolicy:
    """Length buckets. ``bounds`` are inclusive upper bounds, the last one is ``max_length``.

    Fixed bounds are used as given. Otherwise ("auto") they start as powers of two and are re-derived from
    the observed lengths' P50/P80/P95 (rounded up to multiples of 8) every ``update_every`` observations.
    """

    QUANTILES = (0.50, 0.80, 0.95)

    def __init__(
        self,
        max_length: int,
        fixed: Sequence[int] | None = None,
        window: int = 1024,
        update_every: int = 256,
        min_samples: int = 64,
    ) -> None:
        self.max_length = max(1, max_length)
        self.auto = fixed is None
        self._lengths: deque[int] = deque(maxlen=window)
        self._update_every = update_every
        self._min_samples = min_samples
        self._since = 0
        if fixed is not None:
            bounds = sorted({min(int(b), self.max_length) for b in fixed if b > 0})
        else:
            bounds, b = [], 16
            while b < self.max_length:
                bounds.append(b)
                b *= 2
        if not bounds or bounds[-1] != self.max_length:
            bounds.append(self.max_length)
        self.bounds: list[int] = bounds

    def index(self, length: int) -> int:
        return min(bisect.bisect_left(self.bounds, length), len(self.bounds) - 1)

    def range_of(self, length: int) -> tuple[int, int]:
        """Inclusive (low, high) lengths of the bucket holding ``length``."""
        i = self.index(length)
        return (self.bounds[i - 1] + 1 if i else 0), self.bounds[i]

    def observe(self, length: int) -> None:
        if not self.auto:
            return
        self._lengths.append(length)
        self._since += 1
        if self._since >= self._update_every and len(self._lengths) >= self._min_samples:
            self._since = 0
            self.bounds = self.derive(list(self._lengths), self.max_length)

    @classmethod
    def derive(cls, lengths: Sequence[int], max_length: int) -> list[int]:
        qs = np.quantile(np.asarray(lengths, dtype=np.float64), cls.QUANTILES)
        bounds = sorted({min(max_length, max(8, math.ceil(q / 8.0) * 8)) for q in qs})
        if bounds[-1] != max_length:
            bounds.append(max_length)
        return bounds
