"""KvUsageTrace: exact per-step samples, then a bounded time-bucketed series."""

from __future__ import annotations

import numpy as np
import pytest

from sim.metrics.kv_usage import KvUsageTrace


def test_exact_samples_keep_every_step_in_time_order() -> None:
    trace = KvUsageTrace()
    trace.add(1.0, 0.25)
    trace.extend(np.array([2.0, 3.0]), np.array([0.5, 0.75]))
    trace.extend_values([0.5], [0.0])  # a replica's earlier step, added late
    assert trace.series() == ((0.5, 0.0), (1.0, 0.25), (2.0, 0.5), (3.0, 0.75))
    assert trace.bucket_s == 0.0 and trace.num_steps == 4
    assert trace.mean_frac() == 0.375 and trace.max_frac() == 0.75


def test_long_traces_turn_into_at_most_max_buckets_buckets() -> None:
    trace = KvUsageTrace(max_samples=8, max_buckets=4)
    times = np.arange(1, 101, dtype=np.float64)  # steps ending at 1, 2, ..., 100 s
    fracs = (times % 10) / 10
    for i in range(0, 100, 7):
        trace.extend(times[i:i + 7], fracs[i:i + 7])
    assert trace.num_steps == 100 and len(trace) <= 4
    assert trace.bucket_s == 32.0  # 128 s of buckets cover 100 s
    assert trace.max_frac() == 0.9
    assert trace.mean_frac() == pytest.approx(fracs.mean(), rel=1e-15)
    series = trace.series()
    assert [t for t, _ in series] == [31.0, 63.0, 95.0, 100.0]  # each bucket's last step
    assert series[0][1] == pytest.approx(fracs[:31].mean(), rel=1e-15)
    assert trace.bucket_max() == (0.9, 0.9, 0.9, 0.9)


def test_adding_one_by_one_or_in_arrays_gives_the_same_buckets() -> None:
    rng = np.random.default_rng(0)
    times = np.cumsum(rng.uniform(0.0, 0.3, 500))
    fracs = rng.uniform(0.0, 1.0, 500)
    a, b = KvUsageTrace(max_samples=50, max_buckets=16), KvUsageTrace(max_samples=50, max_buckets=16)
    for t, f in zip(times.tolist(), fracs.tolist(), strict=True):
        a.add(t, f)
    for i in range(0, 500, 37):
        b.extend(times[i:i + 37], fracs[i:i + 37])
    assert a.bucket_s == b.bucket_s and a.num_steps == b.num_steps == 500
    assert [t for t, _ in a.series()] == [t for t, _ in b.series()]
    assert a.bucket_max() == b.bucket_max()
    for (_, x), (_, y) in zip(a.series(), b.series(), strict=True):
        assert x == pytest.approx(y, rel=1e-12)
