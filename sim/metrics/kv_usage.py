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
MAX_BUCKETS = 4096
"""Most time buckets of a bucketed trace (a day: buckets of ~21-42 s)."""
MAX_PENDING = 1 << 16
"""Samples added before they are applied in one pass (`KvUsageTrace._flush`; 1 MiB of arrays)."""


class KvUsageTrace:
    def __init__(self, *, max_samples: int = MAX_SAMPLES, max_buckets: int = MAX_BUCKETS,
                 max_pending: int = MAX_PENDING) -> None:
        if max_samples < 1 or max_buckets < 2 or max_pending < 1:
            raise ValueError(f"max_samples={max_samples!r} must be >= 1, max_buckets={max_buckets!r} >= 2 and "
                             f"max_pending={max_pending!r} >= 1")
        self._max_samples = max_samples
        self._max_buckets = max_buckets
        self._max_pending = max_pending
        self._time_s = array("d")
        self._frac = array("d")
        self.num_steps = 0
        """Samples added (pending ones included)."""
        self._max = -math.inf
        self._bucket_s = 0.0
        self._count = np.zeros(0, dtype=np.int64)
        self._sum = np.zeros(0)
        self._bmax = np.zeros(0)
        self._last_s = np.zeros(0)
        # Samples added but not yet applied, one entry per addition (an array, or a 1-tuple for one
        # sample), applied in order by `_flush`.
        self._pend_t: list[np.ndarray | tuple[float]] = []
        self._pend_f: list[np.ndarray | tuple[float]] = []
        self._num_pending = 0

    @property
    def bucket_s(self) -> float:
        """Width of a time bucket; 0 while every sample is kept."""
        self._flush()
        return self._bucket_s

    def __len__(self) -> int:
        """Samples kept (per step, or buckets once bucketed)."""
        self._flush()
        return len(self._time_s) if not self._bucket_s else int(np.count_nonzero(self._count))

    def add(self, time_s: float, frac: float) -> None:
        self._pend_t.append((time_s,))
        self._pend_f.append((frac,))
        self.num_steps += 1
        self._num_pending += 1
        if self._num_pending >= self._max_pending:
            self._flush()

    def extend_values(self, time_s: list[float], frac: list[float]) -> None:
        """`extend` for a few samples given as lists."""
        if not time_s:
            return
        if self.num_steps > self._max_samples:
            # Bucketed by the time they are applied: each sample is added on its own, as `add`.
            for t, f in zip(time_s, frac, strict=True):
                self.add(t, f)
            return
        self.extend(np.array(time_s, dtype=np.float64), np.array(frac, dtype=np.float64))

    def extend(self, time_s: np.ndarray, frac: np.ndarray) -> None:
        """Samples of consecutive steps (float64 arrays of one length, times nondecreasing)."""
        n = len(time_s)
        if not n:
            return
        self._pend_t.append(time_s)
        self._pend_f.append(frac)
        self.num_steps += n
        self._num_pending += n
        if self._num_pending >= self._max_pending:
            self._flush()

    def _flush(self) -> None:
        """Apply the pending additions in the order they were made: exact samples appended; once
        bucketed, each addition's samples summed per bucket as one array sum (an addition inside
        one bucket: its `sum()`; one across buckets: `np.add.reduceat` at the boundaries) and the
        sums added to the buckets in order. The bucket width doubles before the first addition
        whose last sample falls past the last bucket, and the trace turns into buckets right
        after the addition that takes it past `max_samples`: the same numbers as applying each
        addition when it is made, at a few array operations per flush."""
        if not self._pend_t:
            return
        time_s = np.concatenate(self._pend_t)
        frac = np.concatenate(self._pend_f)
        lens = np.fromiter(map(len, self._pend_t), dtype=np.int64, count=len(self._pend_t))
        self._pend_t, self._pend_f, self._num_pending = [], [], 0
        ends = lens.cumsum()
        top = float(frac.max())
        if top > self._max:
            self._max = top
        i, n = 0, len(lens)
        while i < n:
            s0 = int(ends[i - 1]) if i else 0
            if not self._bucket_s:
                # Exact: append up to and including the addition that takes the trace past max_samples.
                room = self._max_samples - len(self._time_s)
                j = int(ends.searchsorted(s0 + room, side="right")) + 1  # first addition not appended now
                j = min(j, n)
                s1 = int(ends[j - 1])
                self._time_s.frombytes(time_s[s0:s1].tobytes())
                self._frac.frombytes(frac[s0:s1].tobytes())
                if len(self._time_s) > self._max_samples:
                    self._to_buckets()
                i = j
                continue
            w = self._bucket_s
            last_b = time_s[ends[i:] - 1] // w
            past = np.flatnonzero(last_b >= self._max_buckets)
            j = i + int(past[0]) if len(past) else n
            if j > i:
                self._apply(time_s[s0:int(ends[j - 1])], frac[s0:int(ends[j - 1])], ends[i:j] - s0)
            if j < n:
                last = float(time_s[ends[j] - 1])
                while int(last // self._bucket_s) >= self._max_buckets:
                    self._coarsen()
            i = j

    def _apply(self, time_s: np.ndarray, frac: np.ndarray, ends: np.ndarray) -> None:
        """Add bucketed samples: `ends` are the additions' ends in the arrays (none past the last
        bucket)."""
        b = (time_s // self._bucket_s).astype(np.int64)
        m = len(b)
        starts = np.concatenate(((0,), ends[:-1]))
        cut = np.zeros(m, dtype=bool)
        cut[starts] = True
        cut[1:] |= b[1:] != b[:-1]
        seg = np.flatnonzero(cut)
        # An addition inside one bucket sums as `ndarray.sum()`, which is `np.add.reduceat` of its
        # samples behind a 0.0; one across buckets sums each bucket's part with `reduceat` itself.
        inside = starts[b[starts] == b[ends - 1]]
        padded = np.insert(frac, inside, 0.0)
        sums = np.add.reduceat(padded, seg + inside.searchsorted(seg, side="left"))
        maxes = np.maximum.reduceat(frac, seg)
        seg_end = np.append(seg[1:], m)
        lasts = time_s[seg_end - 1]
        where = b[seg]
        np.add.at(self._count, where, seg_end - seg)
        np.add.at(self._sum, where, sums)
        np.maximum.at(self._bmax, where, maxes)
        np.maximum.at(self._last_s, where, lasts)

    def _merge(self, idx: np.ndarray, time_s: np.ndarray, frac: np.ndarray) -> None:
        buckets, first = np.unique(idx, return_index=True)
        ends = np.append(first[1:], len(idx))
        self._count[buckets] += np.diff(np.append(first, len(idx)))
        self._sum[buckets] += np.add.reduceat(frac, first)
        np.maximum.at(self._bmax, buckets, np.maximum.reduceat(frac, first))
        np.maximum.at(self._last_s, buckets, time_s[ends - 1])

    def _to_buckets(self) -> None:
        time_s = np.frombuffer(self._time_s, dtype=np.float64)
        frac = np.frombuffer(self._frac, dtype=np.float64)
        order = np.argsort(time_s, kind="stable")
        time_s, frac = time_s[order], frac[order]
        top = float(time_s[-1])
        # The narrowest power-of-two width that leaves room for twice the time seen so far.
        w = 2.0 ** math.ceil(math.log2(max(2.0 * top / self._max_buckets, 1e-6)))
        self._bucket_s = w
        nb = self._max_buckets
        self._count, self._sum = np.zeros(nb, dtype=np.int64), np.zeros(nb)
        self._bmax, self._last_s = np.full(nb, -math.inf), np.full(nb, -math.inf)
        self._merge((time_s // w).astype(np.int64), time_s, frac)
        self._time_s, self._frac = array("d"), array("d")

    def _coarsen(self) -> None:
        """Double the bucket width: bucket i of the new series is buckets 2i and 2i + 1 of the old."""
        half = self._max_buckets // 2
        pad = self._max_buckets - half
        count, total, bmax, last = self._count, self._sum, self._bmax, self._last_s
        self._count = np.concatenate((count[0:2 * half:2] + count[1:2 * half:2], np.zeros(pad, dtype=np.int64)))
        self._sum = np.concatenate((total[0:2 * half:2] + total[1:2 * half:2], np.zeros(pad)))
        self._bmax = np.concatenate((np.maximum(bmax[0:2 * half:2], bmax[1:2 * half:2]), np.full(pad, -math.inf)))
        self._last_s = np.concatenate((np.maximum(last[0:2 * half:2], last[1:2 * half:2]), np.full(pad, -math.inf)))
        self._bucket_s *= 2.0

    def mean_frac(self) -> float:
        """Step-weighted mean used fraction (0.0 without steps)."""
        if not self.num_steps:
            return 0.0
        if not self.bucket_s:
            return float(np.frombuffer(self._frac, dtype=np.float64)[self._order()].mean())
        return math.fsum(self._sum.tolist()) / self.num_steps

    def max_frac(self) -> float:
        self._flush()
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
        return tuple((t, s / c) for c, s, t in zip(self._count.tolist(), self._sum.tolist(), self._last_s.tolist(),
                                                  strict=True) if c)

    def bucket_max(self) -> tuple[float, ...]:
        """Once bucketed, each nonempty bucket's largest used fraction (in `series()` order); else
        the samples' own values."""
        if not self.bucket_s:
            return tuple(f for _, f in self.series())
        return tuple(m for c, m in zip(self._count.tolist(), self._bmax.tolist(), strict=True) if c)
