"""Optuna's TPE, with its log normal-CDF evaluated array-wise: the same numbers, a fraction of the time.

TPE prices an integer or discrete parameter (`max_num_seqs`, `max_num_batched_tokens`) by the
Gaussian mass of each candidate's unit interval under every kernel of its Parzen estimators. Optuna
(5.0) computes that log-CDF one element at a time through a Python function behind a
1,000-entry `lru_cache` (`optuna.samplers._tpe._truncnorm._log_ndtr`, via `np.frompyfunc`); a
study of 1,000 trials asks it ~15,000 distinct values per ask, so the cache misses and this is
the largest part of each ask (docs/benchmarks.md, "TPE's log-CDF array-wise").

`log_ndtr` below takes the same branches with the same C functions (`math.erf`, `math.erfc`,
`math.log`, applied element-wise) and the same IEEE operations, so every value is bitwise the one
Optuna computes (tests/orchestrator/test_fast_truncnorm.py checks every branch), the far-left
tail's asymptotic series (a <= -20, most of the calls) included.
`install()` makes Optuna's TPE call it, and does nothing when Optuna's function does not give the
same values on a set of probes (another version), so TPE then runs exactly as shipped.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

_SQRT2 = 2**0.5
_LOW = -1 / 2**0.5
_HIGH = 1 / 2**0.5
_erf = np.frompyfunc(math.erf, 1, 1)
_erfc = np.frompyfunc(math.erfc, 1, 1)
_log = np.frompyfunc(math.log, 1, 1)
_pow = np.frompyfunc(pow, 2, 1)
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _floats(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def ndtr(a: np.ndarray) -> np.ndarray:
    """Standard normal CDF of each element: erfc in both tails (no cancellation), erf in between."""
    x = np.asarray(a, dtype=np.float64) / _SQRT2
    out = np.empty_like(x)
    left = x < _LOW
    centre = ~left & (x < _HIGH)
    right = ~(left | centre)  # NaN lands here, as in Optuna
    out[left] = 0.5 * _floats(_erfc(-x[left]))
    out[centre] = 0.5 + 0.5 * _floats(_erf(x[centre]))
    out[right] = 1.0 - 0.5 * _floats(_erfc(x[right]))
    return out


def log_ndtr_left_tail(a: np.ndarray) -> np.ndarray:
    """log ndtr(a) for a <= -20 (or NaN): the asymptotic series of the Mills ratio, summed until a
    term no longer changes the total. Every element goes through the operations of Optuna's scalar
    loop in the same order; the elements run in lockstep and each stops where its own loop stops."""
    a = np.asarray(a, dtype=np.float64)
    a_squared = _floats(_pow(a, 2))
    log_lhs = -0.5 * a_squared - _floats(_log(-a)) - _HALF_LOG_2PI
    last_total = np.zeros_like(a)
    total = np.ones_like(a)
    numerator = np.ones_like(a)
    denom_factor = np.ones_like(a)
    denom_cons = 1 / a_squared
    sign = 1.0
    i = 0
    active = np.abs(last_total - total) > sys.float_info.epsilon
    while active.any():
        i += 1
        sign = -sign
        last_total[active] = total[active]
        denom_factor[active] *= denom_cons[active]
        numerator[active] *= 2 * i - 1
        total[active] += sign * numerator[active] * denom_factor[active]
        active &= np.abs(last_total - total) > sys.float_info.epsilon
    out: np.ndarray = log_lhs + _floats(_log(total))
    return out


def log_ndtr(a: np.ndarray) -> np.ndarray:
    """log ndtr(a) element-wise, as Optuna's `_truncnorm._log_ndtr_single` computes each element."""
    a = np.asarray(a, dtype=np.float64)
    out = np.empty_like(a)
    upper = a > 6
    middle = ~upper & (a > -20)
    rest = ~(upper | middle)
    if upper.any():
        # log(1 - q) = -q to double precision for q = ndtr(-a) < 1e-9.
        out[upper] = -ndtr(-a[upper])
    if middle.any():
        out[middle] = _floats(_log(ndtr(a[middle])))
    if rest.any():
        out[rest] = log_ndtr_left_tail(a[rest])
    return out


def install() -> bool:
    """Point Optuna's TPE at the array-wise log-CDF; True when installed (now or before)."""
    try:
        from optuna.samplers._tpe import _truncnorm
    except ImportError:
        return False
    current = getattr(_truncnorm, "_log_ndtr", None)
    if getattr(current, "kernelsight_array_wise", False):
        return True
    if current is None or not _agrees(current):
        logger.debug("optuna's _truncnorm differs from the version fast_truncnorm was written for; not installed")
        return False

    def fast(a: np.ndarray) -> np.ndarray:
        return log_ndtr(a)

    fast.kernelsight_array_wise = True  # type: ignore[attr-defined]
    setattr(_truncnorm, "_log_ndtr", fast)  # noqa: B010  (a module global Optuna looks up per call)
    return True


PROBES = np.array([-np.inf, -40.0, -20.0, -19.999, -7.5, -1.0, -0.70710678, 0.0, 0.5, 0.70710679, 3.0, 6.0,
                   6.000001, 9.0, 40.0, np.inf])
"""Points on every branch and boundary of both implementations."""


def _agrees(current: Callable[[np.ndarray], np.ndarray]) -> bool:
    """`log_ndtr` gives Optuna's values bitwise on `PROBES` (a guard against a changed Optuna, not
    the test of record: that is tests/orchestrator/test_fast_truncnorm.py)."""
    try:
        want = np.asarray(current(PROBES.copy()), dtype=np.float64)
    except Exception:  # an Optuna whose _log_ndtr takes something else
        return False
    return want.shape == PROBES.shape and bool(np.array_equal(want.view(np.int64), log_ndtr(PROBES).view(np.int64)))
