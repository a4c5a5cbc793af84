"""Per-request latency targets (`[slo]`), as `vllm bench serve --goodput`.

A request is good when it meets every target that is set; goodput counts good requests per
second. Targets are in seconds here; the CLI flags that take milliseconds say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sim.serde import require

TARGET_KEYS: Final = ("ttft_s", "tpot_s", "e2el_s")


def require_targets(owner: object) -> None:
    """The per-request targets of `owner` (`[slo]` or a traffic class) are unset or finite and > 0."""
    for key in TARGET_KEYS:
        value = getattr(owner, key)
        require(value is None or (math.isfinite(value) and value > 0), key, value,
                "must be a finite number > 0 (leave it unset for no target)")


@dataclass(frozen=True, slots=True, kw_only=True)
class SloSpec:
    ttft_s: float | None = None
    tpot_s: float | None = None
    """Mean time per output token after the first, per request."""
    e2el_s: float | None = None
    """End-to-end latency per request."""

    def __post_init__(self) -> None:
        require_targets(self)

    def is_met(self, *, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        return (
            (self.ttft_s is None or ttft_s <= self.ttft_s)
            and (self.tpot_s is None or tpot_s <= self.tpot_s)
            and (self.e2el_s is None or e2el_s <= self.e2el_s)
        )
