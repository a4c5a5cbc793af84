"""Log-bucketed histogram for inter-token latencies: exact count and mean, percentiles to 0.5%."""

from __future__ import annotations

import math

import numpy as np

_RESOLUTION = 1.01  # bucket width ratio: percentiles within 0.5% of the true value
_MIN_S = 1e-7


class LogHistogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.total = 0.0

    def add(self, value_s: float, n: int = 1) -> None:
        b = int(math.log(max(value_s, _MIN_S) / _MIN_S, _RESOLUTION))
        self.counts[b] = self.counts.get(b, 0) + n
        self.count += n
        self.total += value_s * n

    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def percentile(self, q: float) -> float:
        if not self.count:
            return math.nan
        keys = np.array(sorted(self.counts))
        cum = np.cumsum([self.counts[k] for k in keys])
        idx = int(np.searchsorted(cum, q / 100.0 * self.count, side="left"))
        b = int(keys[min(idx, len(keys) - 1)])
        return float(_MIN_S * _RESOLUTION ** (b + 0.5))
