"""`[autoscaling]`: replicas added and removed on load during a run (docs/scenario.md, "[autoscaling]").

```toml
[autoscaling]
min_replicas = 8
max_replicas = 64              # default: engine.data_parallel_size (the fleet's replica slots)
target_ongoing_requests = 24   # per replica: running + waiting (Ray Serve, Knative concurrency target)
upscale_delay_s = 30
downscale_delay_s = 600
startup_delay_s = 60           # model load: a new replica takes traffic after this, and is paid during it
look_back_period_s = 30        # optional: average each replica's metrics over this window (Ray Serve's default 30)
upscaling_factor = 1.0         # optional: the share of each decision's change applied (Ray Serve)
downscaling_factor = 1.0
```

The names follow Ray Serve's `autoscaling_config` (`min_replicas`, `max_replicas`,
`initial_replicas`, `target_ongoing_requests`, `upscale_delay_s`, `downscale_delay_s`,
`look_back_period_s`, `upscaling_factor`, `downscaling_factor`) and the Kubernetes HPA's replica
formula and tolerance; the policy is `sim.engine.autoscaler`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from sim.serde import require

DEFAULT_RECORD_INTERVAL_S: Final = 0.5
"""Ray Serve's replica metric record interval (`RAY_SERVE_REPLICA_AUTOSCALING_METRIC_RECORD_INTERVAL_S`):
a replica's window average is over its samples this far apart."""

MIN_INTERVAL_S: Final = 0.1
"""Shortest evaluation interval: a day at 0.1 s is already 864,000 evaluations (real autoscalers
evaluate every 1 to 15 s)."""

TARGET_KEYS: Final = ("target_ongoing_requests", "target_waiting_requests", "target_kv_usage",
                      "target_running_frac")
"""The per-replica metric targets; at least one is required, and with several the largest
replica count any of them asks for wins (as the HPA does with several metrics)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscalingSpec:
    min_replicas: int = 1
    """Replicas never drained below this (>= 1: no scale to zero)."""
    max_replicas: int | None = None
    """Replicas provisioned at most (active, starting and draining together); default the scenario's
    `engine.data_parallel_size`, which it may not exceed."""
    initial_replicas: int | None = None
    """Replicas active at t = 0 (already loaded); default `min_replicas`."""
    target_ongoing_requests: float | None = None
    """Requests per active replica, running plus waiting (Ray Serve `target_ongoing_requests`,
    Knative's concurrency target)."""
    target_waiting_requests: float | None = None
    """Queue depth per active replica: requests waiting for admission."""
    target_kv_usage: float | None = None
    """Mean used fraction of the active replicas' KV blocks, in (0, 1]."""
    target_running_frac: float | None = None
    """Mean running requests / `max_num_seqs` of the active replicas, in (0, 1]."""
    tolerance: float = 0.1
    """No change while every metric is within target x (1 +- tolerance) (HPA's default 0.1): the
    thresholds are target x (1 + tolerance) up and target x (1 - tolerance) down."""
    interval_s: float = 10.0
    """Time between evaluations (ticks at interval_s, 2 x interval_s, ...)."""
    upscale_delay_s: float = 30.0
    """A scale-up happens once every evaluation has asked for more replicas for this long (Ray Serve
    `upscale_delay_s`, default 30)."""
    downscale_delay_s: float = 600.0
    """A scale-down happens once every evaluation has asked for fewer for this long (Ray Serve
    `downscale_delay_s`, default 600): the cool-down."""
    startup_delay_s: float = 60.0
    """Seconds from a scale-up decision until the new replica takes traffic (model load); paid."""
    look_back_period_s: float | None = None
    """Each active replica's metrics are averaged over its samples of the last this many seconds
    (Ray Serve `look_back_period_s`, default 30 there), then summed over the active replicas; None:
    the metrics as of the evaluation (the HPA's instantaneous reading; the simulator's behaviour
    before the key existed)."""
    metrics_record_interval_s: float | None = None
    """With `look_back_period_s`: seconds between a replica's samples (default 0.5, Ray Serve's
    `RAY_SERVE_REPLICA_AUTOSCALING_METRIC_RECORD_INTERVAL_S`); every evaluation samples too."""
    upscaling_factor: float | None = None
    """A scale-up moves from the active replicas `a` towards a metric's ask `x` (total / target,
    unrounded) by this share: ceil(a + factor x (x - a)) (Ray Serve `upscaling_factor`, formerly
    `upscale_smoothing_factor`; None: 1, the whole change)."""
    downscaling_factor: float | None = None
    """The same for a scale-down (Ray Serve `downscaling_factor`); a change that rounds back to `a`
    removes one replica, as Ray Serve does."""

    def __post_init__(self) -> None:
        require(self.min_replicas >= 1, "min_replicas", self.min_replicas,
                "must be >= 1 (scale to zero is not simulated: a request needs an active replica)")
        mx = self.max_replicas
        require(mx is None or mx >= self.min_replicas, "max_replicas", mx,
                f"must be >= min_replicas={self.min_replicas}")
        init = self.initial_replicas
        require(init is None or (init >= self.min_replicas and (mx is None or init <= mx)), "initial_replicas",
                init, f"must be within [min_replicas, max_replicas] = [{self.min_replicas}, "
                f"{mx if mx is not None else 'engine.data_parallel_size'}]")
        for key in TARGET_KEYS:
            value = getattr(self, key)
            require(value is None or (math.isfinite(value) and value > 0), key, value, "must be a finite number > 0")
        for key in ("target_kv_usage", "target_running_frac"):
            value = getattr(self, key)
            require(value is None or value <= 1.0, key, value, "is a fraction: must be in (0, 1]")
        require(any(getattr(self, k) is not None for k in TARGET_KEYS), "target_ongoing_requests", None,
                "give at least one metric target: " + ", ".join(TARGET_KEYS))
        require(0.0 <= self.tolerance < 1.0, "tolerance", self.tolerance, "must be in [0, 1)")
        require(math.isfinite(self.interval_s) and self.interval_s >= MIN_INTERVAL_S, "interval_s", self.interval_s,
                f"must be a finite number >= {MIN_INTERVAL_S} (seconds; every evaluation is an event of the run)")
        for key in ("upscale_delay_s", "downscale_delay_s", "startup_delay_s"):
            value = getattr(self, key)
            require(math.isfinite(value) and value >= 0, key, value, "must be a finite number >= 0 (seconds)")
        look = self.look_back_period_s
        require(look is None or (math.isfinite(look) and look > 0), "look_back_period_s", look,
                "must be a finite number > 0 (seconds)")
        rec = self.metrics_record_interval_s
        require(rec is None or look is not None, "metrics_record_interval_s", rec,
                "samples the look-back window: set look_back_period_s too (without it the evaluation reads the "
                "metrics as of its instant)")
        require(rec is None or (math.isfinite(rec) and rec >= MIN_INTERVAL_S), "metrics_record_interval_s", rec,
                f"must be a finite number >= {MIN_INTERVAL_S} (seconds; every sample is an event of the run)")
        for key in ("upscaling_factor", "downscaling_factor"):
            value = getattr(self, key)
            require(value is None or (math.isfinite(value) and value > 0), key, value, "must be a finite number > 0")

    @property
    def record_interval_s(self) -> float:
        """Seconds between a replica's metric samples for the look-back window."""
        return self.metrics_record_interval_s if self.metrics_record_interval_s is not None \
            else DEFAULT_RECORD_INTERVAL_S

    def resolved(self, slots: int) -> AutoscalingSpec:
        """`max_replicas` and `initial_replicas` filled in for a fleet of `slots` replica slots."""
        mx = self.max_replicas if self.max_replicas is not None else max(slots, self.min_replicas)
        init = self.initial_replicas if self.initial_replicas is not None else self.min_replicas
        return AutoscalingSpec(**{**{k: getattr(self, k) for k in _FIELDS}, "max_replicas": mx,
                                  "initial_replicas": init})


_FIELDS: Final = tuple(AutoscalingSpec.__dataclass_fields__)
