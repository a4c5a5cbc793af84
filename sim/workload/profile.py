"""Request-rate profiles over a day: a diurnal cosine or a CSV of requests per minute, with bursts,
and arrivals that follow them.

The profile is a rate per second of the run (one bin a second). Arrivals are a time-rescaled
renewal process: gaps of a unit-rate process are Gamma(shape = burstiness, scale = 1 / burstiness)
(Poisson at burstiness 1, as `vllm bench serve`), and the unit-rate arrival times s_i are mapped
back through the cumulative rate, t_i = Lambda^-1(s_i), so the expected number of requests in
[a, b] is the integral of the rate over it. Generation stops at the profile's end or after
`max_requests` arrivals, whichever comes first.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from sim.errors import ConfigError
from sim.serde import check_unique_columns
from sim.specs.workload import DAY_S, DIURNAL, MAX_PROFILE_S, WorkloadSpec

CSV_COLUMN: Final = "requests_per_min"
MINUTE_COLUMN: Final = "minute"
"""Optional: when present, the minutes 0, 1, 2, ... of the rows, checked."""
_SOURCE: Final = "[workload]"


def rate_per_s(spec: WorkloadSpec) -> npt.NDArray[np.float64]:
    """Requests/s in each second of the profile, bursts applied."""
    profile = spec.request_rate_profile
    assert profile is not None
    if profile == DIURNAL:
        assert spec.diurnal_peak_rate is not None and spec.diurnal_trough_rate is not None
        duration_s = spec.profile_duration_s or DAY_S
        mid_h = (np.arange(math.ceil(duration_s), dtype=np.float64) + 0.5) / 3600.0
        # Midpoint of each second: over a whole day the cosine sums to zero, so the day's integral
        # is exactly (peak + trough) / 2 x 86,400 s.
        phase = 2.0 * math.pi * (mid_h - spec.diurnal_peak_hour) / 24.0
        rates = spec.diurnal_trough_rate + (spec.diurnal_peak_rate - spec.diurnal_trough_rate) * 0.5 * (
            1.0 + np.cos(phase))
    else:
        per_min = read_rate_csv(profile)
        rates = np.repeat(per_min / 60.0, 60)
        if spec.profile_duration_s is not None:
            n = math.ceil(spec.profile_duration_s)
            rates = np.resize(rates, n) if n > rates.size else rates[:n]  # a longer day repeats the file
        elif rates.size > MAX_PROFILE_S:
            raise ConfigError(source=profile, key=CSV_COLUMN, value=per_min.size,
                              rule=f"at most {MAX_PROFILE_S / 60:,.0f} minutes (a week: the simulation's time limit); "
                                   "profile_duration_s cuts a longer file")
        late = [b.start_s for b in spec.bursts if b.start_s >= rates.size]
        if late and spec.profile_duration_s is None:  # (a duration cutting the file short may leave bursts after it)
            raise ConfigError(source=profile, key="bursts", value=late,
                              rule=f"a burst must start before the file's last minute ends at {rates.size:,} s")
    for burst in spec.bursts:
        lo = math.floor(burst.start_s)
        hi = min(math.ceil(burst.start_s + burst.duration_s), rates.size)
        rates[lo:hi] *= burst.rate_factor
    return rates


def _number(text: str | None) -> float:
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        return math.nan


def read_rate_csv(path: str) -> npt.NDArray[np.float64]:
    """The `requests_per_min` column of a CSV file, one row a minute."""
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or CSV_COLUMN not in reader.fieldnames:
                raise ConfigError(source=path, key="request_rate_profile", value=path,
                                  rule=f"the CSV needs a {CSV_COLUMN!r} column (requests in each minute)")
            values: list[float] = []
            check_unique_columns(reader.fieldnames, path)
            has_minute = MINUTE_COLUMN in reader.fieldnames
            for row_number, row in enumerate(reader, start=2):
                # One row a minute: a blank line (which the reader skips) or a gap in `minute` would
                # shift every later minute earlier.
                if reader.line_num != row_number:
                    raise ConfigError(source=f"{path} line {row_number}", key=CSV_COLUMN, value="",
                                      rule="one row a minute: blank lines are not allowed")
                if has_minute and _number(row[MINUTE_COLUMN]) != row_number - 2:
                    raise ConfigError(source=f"{path} row {row_number}", key=MINUTE_COLUMN, value=row[MINUTE_COLUMN],
                                      rule=f"minutes must run 0, 1, 2, ... one row each (expected {row_number - 2})")
                text = row[CSV_COLUMN]
                try:
                    value = float(text)
                except (TypeError, ValueError):
                    value = math.nan
                if not (math.isfinite(value) and value >= 0):
                    raise ConfigError(source=f"{path} row {row_number}", key=CSV_COLUMN, value=text,
                                      rule="must be a finite number >= 0")
                values.append(value)
    except OSError as exc:
        raise ConfigError(source=path, key="request_rate_profile", value=path, rule=f"cannot read: {exc}") from None
    if not values or sum(values) <= 0:
        raise ConfigError(source=path, key=CSV_COLUMN, value=len(values),
                          rule="needs at least one minute with requests")
    return np.asarray(values, dtype=np.float64)


def last_bin_s(spec: WorkloadSpec) -> float:
    """Length of the profile's last one-second bin: the fraction of a second a `profile_duration_s`
    such as 100.5 leaves (1.0 for a whole number of seconds)."""
    duration_s = spec.profile_duration_s
    if duration_s is None:
        return 1.0
    frac = duration_s - math.floor(duration_s)
    return frac if frac > 0 else 1.0


def profile_arrivals_s(rates_per_s: npt.NDArray[np.float64], max_requests: int, burstiness: float,
                       rng: np.random.Generator, *, last_bin: float = 1.0) -> npt.NDArray[np.float64]:
    """Arrival times (s) following the per-second rates (module docstring); the last bin lasts
    `last_bin` seconds (`last_bin_s`), so it holds that share of its second's requests and none
    arrives after the profile's end."""
    mass = rates_per_s
    if last_bin != 1.0:
        mass = rates_per_s.copy()
        mass[-1] *= last_bin
    cum = np.concatenate(([0.0], np.cumsum(mass)))
    total = float(cum[-1])
    if total <= 0:
        raise ConfigError(source=_SOURCE, key="request_rate_profile", value=total,
                          rule="the profile (bursts applied) sends no requests")
    chunk = int(min(max_requests, math.ceil(total + 10.0 * math.sqrt(total / burstiness) + 100)))
    parts: list[npt.NDArray[np.float64]] = []
    reached, count = 0.0, 0
    while reached <= total and count < max_requests:
        gaps = (np.ones(chunk) if math.isinf(burstiness)  # evenly spaced unit-rate times
                else rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=chunk))
        s = reached + np.cumsum(gaps)
        parts.append(s)
        reached, count = float(s[-1]), count + chunk
    unit = np.concatenate(parts)
    if math.isinf(burstiness):
        # Evenly spaced unit times are whole numbers, and the cumulative sum of the rates rounds
        # (0.1 req/s for 100 s sums to 9.99999999999998): a time within rounding of the total is
        # the profile's last request, not one past its end.
        unit = np.minimum(unit[unit <= total * (1.0 + 1e-9)], total)[:max_requests]
    else:
        unit = unit[unit <= total][:max_requests]
    # Second k holds unit times in [cum[k], cum[k+1]); zero-rate seconds hold none (side="right"
    # skips past them: cum repeats their value). A unit time equal to the total (evenly spaced
    # times reach it exactly) belongs to the end of the last second with requests, not to a
    # trailing zero-rate second (that would divide by its zero rate).
    k = np.searchsorted(cum, unit, side="right") - 1
    k = np.minimum(k, int(np.flatnonzero(mass > 0)[-1]))
    return k + (unit - cum[k]) / rates_per_s[k]
