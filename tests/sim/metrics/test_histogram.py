"""Exact statistics of a multiset kept as value counts."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.metrics.histogram import counted_stats, counted_std


def test_hand_computed_percentiles_interpolate_between_order_statistics() -> None:
    # Expanded: 1, 1, 1, 2, 10 -> median 1, p90 at position 3.6: 2 + 0.6 x 8 = 6.8
    mean, p50, p90 = counted_stats({1.0: 3, 2.0: 1, 10.0: 1}, (50.0, 90.0))
    assert (mean, p50, p90) == pytest.approx((3.0, 1.0, 6.8))


def test_empty_multiset_gives_nan() -> None:
    assert all(math.isnan(v) for v in counted_stats({}))


@given(st.dictionaries(st.floats(1e-6, 10.0), st.integers(1, 50), min_size=1, max_size=30))
def test_matches_numpy_on_the_expanded_values(counts: dict[float, int]) -> None:
    values = np.repeat(np.array(list(counts)), list(counts.values()))
    expected = [values.mean(), *np.percentile(values, [50, 90, 99])]
    assert counted_stats(counts) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_std_is_numpys_population_std_of_the_expanded_values() -> None:
    # Expanded: 1, 1, 1, 2, 10 -> mean 3, variance (3 x 4 + 1 + 49) / 5 = 12.4 (ddof 0, as np.std)
    assert counted_std({1.0: 3, 2.0: 1, 10.0: 1}) == pytest.approx(math.sqrt(12.4), rel=1e-12)
    assert counted_std({0.5: 7}) == 0.0
    assert math.isnan(counted_std({}))


@given(st.dictionaries(st.floats(1e-6, 10.0), st.integers(1, 50), min_size=1, max_size=30))
def test_std_matches_numpy_on_the_expanded_values(counts: dict[float, int]) -> None:
    values = np.repeat(np.array(list(counts)), list(counts.values()))
    assert counted_std(counts) == pytest.approx(float(np.std(values)), rel=1e-9, abs=1e-12)


def test_std_does_not_depend_on_the_order_the_values_were_counted_in() -> None:
    """A bulk run and the step-by-step loop count the same gaps in different orders; their
    summaries must agree bit for bit."""
    import random

    rng = random.Random(1)  # unsorted sums of these differ in the last bit between the two orders
    items = [(rng.uniform(0.001, 0.05), rng.randint(1, 50)) for _ in range(500)]
    shuffled = items[:]
    rng.shuffle(shuffled)
    assert counted_std(dict(items)) == counted_std(dict(shuffled))
