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


def _state(trace: KvUsageTrace) -> tuple[object, ...]:
    return (trace.bucket_s, trace.num_steps, len(trace), trace.series(), trace.bucket_max(), trace.mean_frac(),
            trace.max_frac())


@pytest.mark.parametrize("max_samples", [1, 40, 700, 10_000])
def test_pending_additions_give_bitwise_what_applying_each_at_once_gives(max_samples: int) -> None:
    """Additions are applied in batches (`max_pending`): the buckets, their sums and the moments the
    trace turns into buckets and the width doubles are those of applying each addition when made."""
    rng = np.random.default_rng(max_samples)
    eager = KvUsageTrace(max_samples=max_samples, max_buckets=8, max_pending=1)
    batched = KvUsageTrace(max_samples=max_samples, max_buckets=8, max_pending=997)
    clocks = [0.0, 0.0, 0.0]  # three replicas adding their steps out of time order
    for _ in range(600):
        r = int(rng.integers(3))
        kind = int(rng.integers(3))
        n = 1 if kind == 0 else int(rng.integers(1, 60))
        steps = rng.uniform(0.001, 0.05, n)
        times = clocks[r] + np.cumsum(steps)
        clocks[r] = float(times[-1])
        fracs = rng.uniform(0.0, 1.0, n)  # sums in another grouping differ in the last bits
        for trace in (eager, batched):
            if kind == 0:
                trace.add(float(times[0]), float(fracs[0]))
            elif kind == 1:
                trace.extend(times, fracs)
            else:
                trace.extend_values(times.tolist(), fracs.tolist())
    assert eager.bucket_s > 0.0 or max_samples == 10_000
    assert _state(eager) == _state(batched)


def test_an_addition_sums_as_one_array_in_each_bucket_it_reaches() -> None:
    """Once bucketed, an addition inside one bucket adds its `sum()` (pairwise, not a running sum);
    one across buckets adds `np.add.reduceat` of its part in each: the numbers of applying each
    addition at once, which the pending batches reproduce."""
    rng = np.random.default_rng(7)
    trace = KvUsageTrace(max_samples=1, max_buckets=64, max_pending=1000)
    trace.extend(np.array([0.0, 100.0]), np.array([0.5, 0.5]))  # buckets of 4 s from here on
    inside = rng.uniform(0.0, 1.0, 100)
    trace.extend(np.linspace(121.0, 123.0, 100), inside)  # all in [120, 124)
    across = rng.uniform(0.0, 1.0, 50)
    times = np.linspace(129.0, 134.0, 50)  # [128, 132) and [132, 136)
    trace.extend(times, across)
    split = int(np.searchsorted(times, 132.0))
    parts = np.add.reduceat(across, [0, split])
    assert trace.bucket_s == 4.0
    series = dict(trace.series())
    assert series[123.0] == float(inside.sum()) / 100
    assert series[float(times[split - 1])] == float(parts[0]) / split
    assert series[134.0] == float(parts[1]) / (50 - split)
