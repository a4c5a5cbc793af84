"""Per-request latency targets (`[slo]`), as `vllm bench serve --goodput`.

A request is good when it meets every target that is set; goodput counts good requests per
second. Targets are in seconds here; the CLI flags that take milliseconds say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.serde import require


@dataclass(frozen=True, slots=True, kw_only=True)
class SloSpec:
    ttft_s: float | None = None
    tpot_s: float | None = None
    """Mean time per output token after the first, per request."""
    e2el_s: float | None = None
    """End-to-end latency per request."""

    def __post_init__(self) -> None:
        for key in ("ttft_s", "tpot_s", "e2el_s"):
            value = getattr(self, key)
            require(value is None or (math.isfinite(value) and value > 0), key, value,
                    "must be a finite number > 0 (leave it unset for no target)")

    def is_met(self, *, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        return (
            (self.ttft_s is None or ttft_s <= self.ttft_s)
            and (self.tpot_s is None or tpot_s <= self.tpot_s)
            and (self.e2el_s is None or e2el_s <= self.e2el_s)
        )
