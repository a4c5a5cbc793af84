"""Statistics of a multiset kept as {value: count}: exact, in memory proportional to distinct values.

Inter-token latencies are mostly whole step durations, and a run has few distinct step durations,
so the multiset of 10^8 gaps fits in a small dict and its percentiles are exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np


def counted_stats(counts: Mapping[float, int], percentiles: Sequence[float] = (50.0, 90.0, 99.0)
                  ) -> tuple[float, ...]:
    """Mean and the percentiles of the values, each repeated `count` times.

    Percentiles interpolate linearly between order statistics, as `numpy.percentile` (and
    `vllm bench serve`) does on the expanded list. NaN for an empty multiset.
    """
    total = sum(counts.values())
    if total == 0:
        return (math.nan,) * (1 + len(percentiles))
    values = np.array(sorted(counts), dtype=np.float64)
    weights = np.array([counts[v] for v in values.tolist()], dtype=np.int64)
    cum = np.cumsum(weights)
    mean = float(np.dot(values, weights.astype(np.float64)) / total)
    out = [mean]
    for q in percentiles:
        pos = q / 100.0 * (total - 1)
        lo = math.floor(pos)
        frac = pos - lo
        a = values[int(np.searchsorted(cum, lo, side="right"))]
        b = values[int(np.searchsorted(cum, min(lo + 1, total - 1), side="right"))]
        out.append(float(a + (b - a) * frac))
    return tuple(out)


def counted_std(counts: Mapping[float, int]) -> float:
    """Population standard deviation of the values, each repeated `count` times: `numpy.std` of
    the expanded list (ddof 0, as `vllm bench serve`'s `std_*_ms`). NaN for an empty multiset."""
    total = sum(counts.values())
    if total == 0:
        return math.nan
    # Sorted by value, so the sums (and their rounding) do not depend on the order the gaps were
    # counted in (a bulk run and the step-by-step loop count them in different orders).
    items = sorted(counts.items())
    values = np.fromiter((v for v, _ in items), dtype=np.float64, count=len(items))
    weights = np.fromiter((c for _, c in items), dtype=np.float64, count=len(items))
    mean = float(np.dot(values, weights) / total)
    return math.sqrt(float(np.dot(weights, (values - mean) ** 2)) / total)
