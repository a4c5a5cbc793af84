"""Fleet-day parts of `[workload]`: traffic classes (`[[workload.classes]]`) and bursts
(`[[workload.bursts]]`). Each class has its own length distribution (`vllm bench serve` random-length
meanings) and its own per-request SLOs; a burst multiplies the request rate for a while."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sim.serde import require
from sim.specs.slo import require_targets

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficClass:
    """One kind of traffic: its share of the requests, lengths and latency targets."""

    name: str
    share: float
    """Relative weight; shares are normalised over the classes (each request draws its class)."""
    input_len: int
    output_len: int
    range_ratio: float = 0.0
    """Lengths uniform over [floor(L x (1 - r)), ceil(L x (1 + r))], as `random_range_ratio`."""
    ttft_s: float | None = None
    """This class's per-request targets; an unset one falls back to the scenario's `[slo]`."""
    tpot_s: float | None = None
    e2el_s: float | None = None

    def __post_init__(self) -> None:
        require(bool(_NAME_RE.match(self.name)), "name", self.name,
                "must be letters, digits, '_', '.', '-' (it names metrics)")
        require(math.isfinite(self.share) and self.share > 0, "share", self.share, "must be a finite number > 0")
        require(self.input_len >= 1, "input_len", self.input_len, "must be >= 1")
        require(self.output_len >= 1, "output_len", self.output_len, "must be >= 1")
        require(0.0 <= self.range_ratio < 1.0, "range_ratio", self.range_ratio, "must be in [0, 1)")
        require_targets(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """From `start_s` for `duration_s` the rate is `rate_factor` times the profile's (to the second)."""

    start_s: float
    duration_s: float
    rate_factor: float

    def __post_init__(self) -> None:
        require(math.isfinite(self.start_s) and self.start_s >= 0, "start_s", self.start_s, "must be >= 0")
        require(math.isfinite(self.duration_s) and self.duration_s > 0, "duration_s", self.duration_s,
                "must be > 0")
        require(math.isfinite(self.rate_factor) and self.rate_factor >= 0, "rate_factor", self.rate_factor,
                "must be a finite number >= 0")
