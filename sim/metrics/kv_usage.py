"""KV-cache usage after each engine step, kept in bounded memory.

A run adds one sample per step: the step's end time and the used fraction of its replica's KV
blocks. The trace keeps every sample exactly until it holds `max_samples` of them; past that it
turns into a time-bucketed series of at most `max_buckets` buckets (the bucket width doubles, and
neighbouring buckets merge, whenever a sample falls past the last bucket), each holding its steps'
count, sum and maximum of the used fraction and its last step's end time. So a run of any length
(a fleet's day is ~10^8 steps) keeps at most `max_samples` samples' worth of memory.

The step-weighted mean and the maximum over all steps are kept whatever the mode: the maximum
exactly, the mean as `numpy.mean` of the samples while they are exact (the same number as
before the trace was bounded) and as the buckets' sums over the step count once bucketed (the
same mean summed in another order: ~1e-16 relative).

Samples may arrive out of time order (replicas that run decode steps ahead of the others add
them when their run ends); `series()` returns them sorted by time (stable: samples at the same
time keep the order they were added).
"""

from __future__ import annotations

import math
from array import array

import numpy as np

MAX_SAMPLES = 1 << 18
"""Exact per-step samples kept before the trace turns into time buckets (4 MiB of arrays)."""
_sum, _max = np.add.reduce, np.maximum.reduce
"""`ndarray.sum()` and `.max()` without their Python wrappers (the same reductions)."""
MAX_BUCKETS = 4096
"""Most time buckets of a bucketed trace (a day: buckets of ~21-42 s)."""


class KvUsageTrace:
    def __init__(self, *, max_samples: int = MAX_SAMPLES, max_buckets: int = MAX_BUCKETS) -> None:
        if max_samples < 1 or max_buckets < 2:
            raise ValueError(f"max_samples={max_samples!r} must be >= 1 and max_buckets={max_buckets!r} >= 2")
        self._max_samples = max_samples
        self._max_buckets = max_buckets
        self._time_s = array("d")
        self._frac = array("d")
        self.num_steps = 0
        self._max = -math.inf
        self.bucket_s = 0.0
        """Width of a time bucket; 0 while every sample is kept."""
        self._count: list[int] = []
        self._sum: list[float] = []
        self._bmax: list[float] = []
        self._last_s: list[float] = []

    def __len__(self) -> int:
        """Samples kept (per step, or buckets once bucketed)."""
        return len(self._time_s) if not self.bucket_s else sum(1 for c in self._count if c)

    def add(self, time_s: float, frac: float) -> None:
        self.num_steps += 1
        if frac > self._max:
            self._max = frac
        if not self.bucket_s:
            self._time_s.append(time_s)
            self._frac.append(frac)
            if len(self._time_s) > self._max_samples:
                self._to_buckets()
            return
        b = int(time_s // self.bucket_s)
        while b >= self._max_buckets:
            self._coarsen()
            b = int(time_s // self.bucket_s)
        self._count[b] += 1
        self._sum[b] += frac
        if frac > self._bmax[b]:
            self._bmax[b] = frac
        if time_s > self._last_s[b]:
            self._last_s[b] = time_s

    def extend_values(self, time_s: list[float], frac: list[float]) -> None:
        """`extend` for a few samples given as lists."""
        if self.bucket_s or not time_s:
            for t, f in zip(time_s, frac, strict=True):
                self.add(t, f)
            return
        self.num_steps += len(time_s)
        top = max(frac)
        if top > self._max:
            self._max = top
        self._time_s.extend(time_s)
        self._frac.extend(frac)
        if len(self._time_s) > self._max_samples:
            self._to_buckets()

    def extend(self, time_s: np.ndarray, frac: np.ndarray) -> None:
        """Samples of consecutive steps (float64 arrays of one length, times nondecreasing)."""
        n = len(time_s)
        if not n:
            return
        self.num_steps += n
        top = float(_max(frac))
        if top > self._max:
            self._max = top
        if not self.bucket_s:
            self._time_s.frombytes(time_s.tobytes())
            self._frac.frombytes(frac.tobytes())
            if len(self._time_s) > self._max_samples:
                self._to_buckets()
            return
        last = float(time_s[-1])
        while int(last // self.bucket_s) >= self._max_buckets:
            self._coarsen()
        w = self.bucket_s
        b0, b1 = int(float(time_s[0]) // w), int(last // w)
        if b0 == b1:
            self._count[b0] += n
            self._sum[b0] += float(_sum(frac))
            self._bmax[b0] = max(self._bmax[b0], top)
            self._last_s[b0] = max(self._last_s[b0], last)
            return
        # Split at the bucket boundaries the steps cross (a run of steps spans a few buckets).
        starts = time_s.searchsorted(np.arange(b0 + 1, b1 + 1) * w, side="left")
        firsts = [0, *starts.tolist()]
        lasts = [*starts.tolist(), n]
        sums = np.add.reduceat(frac, firsts).tolist()
        maxes = np.maximum.reduceat(frac, firsts).tolist()
        for b, i, j, total, top_b in zip(range(b0, b1 + 1), firsts, lasts, sums, maxes, strict=True):
            if j <= i:
                continue
            self._count[b] += j - i
            self._sum[b] += total
            if top_b > self._bmax[b]:
                self._bmax[b] = top_b
            t = float(time_s[j - 1])
            if t > self._last_s[b]:
                self._last_s[b] = t

    def _merge(self, idx: np.ndarray, time_s: np.ndarray, frac: np.ndarray) -> None:
        buckets, first = np.unique(idx, return_index=True)
        ends = np.append(first[1:], len(idx))
        counts = np.diff(np.append(first, len(idx)))
        sums = np.add.reduceat(frac, first)
        maxes = np.maximum.reduceat(frac, first)
        lasts = time_s[ends - 1]
        for b, c, s, m, t in zip(buckets.tolist(), counts.tolist(), sums.tolist(), maxes.tolist(), lasts.tolist(),
                                 strict=True):
            self._count[b] += c
            self._sum[b] += s
            if m > self._bmax[b]:
                self._bmax[b] = m
            if t > self._last_s[b]:
                self._last_s[b] = t

    def _to_buckets(self) -> None:
        time_s = np.frombuffer(self._time_s, dtype=np.float64)
        frac = np.frombuffer(self._frac, dtype=np.float64)
        order = np.argsort(time_s, kind="stable")
        time_s, frac = time_s[order], frac[order]
        top = float(time_s[-1])
        # The narrowest power-of-two width that leaves room for twice the time seen so far.
        w = 2.0 ** math.ceil(math.log2(max(2.0 * top / self._max_buckets, 1e-6)))
        self.bucket_s = w
        nb = self._max_buckets
        self._count, self._sum = [0] * nb, [0.0] * nb
        self._bmax, self._last_s = [-math.inf] * nb, [-math.inf] * nb
        self._merge((time_s // w).astype(np.int64), time_s, frac)
        self._time_s, self._frac = array("d"), array("d")

    def _coarsen(self) -> None:
        """Double the bucket width: bucket i of the new series is buckets 2i and 2i + 1 of the old."""
        half = self._max_buckets // 2
        count, total, bmax, last = self._count, self._sum, self._bmax, self._last_s
        pad = [0] * (self._max_buckets - half)
        self._count = [count[2 * i] + count[2 * i + 1] for i in range(half)] + pad
        self._sum = [total[2 * i] + total[2 * i + 1] for i in range(half)] + [0.0] * len(pad)
        self._bmax = [max(bmax[2 * i], bmax[2 * i + 1]) for i in range(half)] + [-math.inf] * len(pad)
        self._last_s = [max(last[2 * i], last[2 * i + 1]) for i in range(half)] + [-math.inf] * len(pad)
        self.bucket_s *= 2.0

    def mean_frac(self) -> float:
        """Step-weighted mean used fraction (0.0 without steps)."""
        if not self.num_steps:
            return 0.0
        if not self.bucket_s:
            return float(np.frombuffer(self._frac, dtype=np.float64)[self._order()].mean())
        return math.fsum(self._sum) / self.num_steps

    def max_frac(self) -> float:
        return self._max if self.num_steps else 0.0

    def _order(self) -> np.ndarray | slice:
        time_s = np.frombuffer(self._time_s, dtype=np.float64)
        if len(time_s) < 2 or bool(np.all(time_s[1:] >= time_s[:-1])):
            return slice(None)
        return np.argsort(time_s, kind="stable")

    def series(self) -> tuple[tuple[float, float], ...]:
        """(time_s, used fraction) per step in time order; once bucketed, per nonempty bucket: its
        last step's end time and its steps' mean used fraction."""
        if not self.bucket_s:
            order = self._order()
            time_s = np.frombuffer(self._time_s, dtype=np.float64)[order]
            frac = np.frombuffer(self._frac, dtype=np.float64)[order]
            return tuple(zip(time_s.tolist(), frac.tolist(), strict=True))
        return tuple((t, s / c) for c, s, t in zip(self._count, self._sum, self._last_s, strict=True) if c)

    def bucket_max(self) -> tuple[float, ...]:
        """Once bucketed, each nonempty bucket's largest used fraction (in `series()` order); else
        the samples' own values."""
        if not self.bucket_s:
            return tuple(f for _, f in self.series())
        return tuple(m for c, m in zip(self._count, self._bmax, strict=True) if c)
