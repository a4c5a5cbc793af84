"""The autoscaling policy: what the fleet looks like at an evaluation -> how many replicas it wants.

A pure function of an observation and the policy's own memory (`decide`); the simulation
(`sim.engine.autoscaled`) owns the clock, calls it at each evaluation tick and carries out its
decision. The rule is the Kubernetes HPA's with Ray Serve's delays:

- for each metric with a target, the replicas it asks for are ceil(total over the active replicas /
  target) (HPA: desired = ceil(current x average / target)), or the current count while the
  average is within target x (1 +- tolerance); the largest over the metrics wins, clamped to
  [min_replicas, max_replicas];
- "current" counts active and starting replicas (a replica still loading is capacity on its way,
  as the HPA counts unready pods), not draining ones;
- a change happens only once every evaluation has asked for a change in the same direction for
  `upscale_delay_s` (more) or `downscale_delay_s` (fewer), as Ray Serve's decision counter does;
  the count applied is the one the latest evaluation asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.specs.autoscaling import AutoscalingSpec

_DELAY_EPS_S = 1e-9
"""Slack of the delay comparison: evaluation times are k x interval, and a difference of two such
products can fall an ulp short of the delay it equals (1.2 - 0.3 < 0.9)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetObservation:
    """The fleet at one evaluation; totals are over the active replicas only."""

    now_s: float
    num_active: int
    num_starting: int
    ongoing_requests: int
    """Running plus waiting requests."""
    waiting_requests: int
    kv_usage: float
    """Sum of the replicas' used KV fractions."""
    running_frac: float
    """Sum of the replicas' running requests / max_num_seqs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyState:
    """Since when every evaluation has asked for more (`up_since_s`) or fewer replicas."""

    up_since_s: float | None = None
    down_since_s: float | None = None


def desired_replicas(spec: AutoscalingSpec, obs: FleetObservation) -> int:
    """Replicas the metrics ask for now, clamped to [min_replicas, max_replicas]."""
    assert spec.max_replicas is not None
    current = obs.num_active + obs.num_starting
    want = 0
    for target, total in ((spec.target_ongoing_requests, float(obs.ongoing_requests)),
                          (spec.target_waiting_requests, float(obs.waiting_requests)),
                          (spec.target_kv_usage, obs.kv_usage), (spec.target_running_frac, obs.running_frac)):
        if target is None:
            continue
        ratio = total / (obs.num_active * target) if obs.num_active else math.inf
        # A float error below a millionth of a replica must not round up to a whole one.
        asked = current if abs(ratio - 1.0) <= spec.tolerance else math.ceil(total / target - 1e-9)
        want = max(want, asked)
    return min(max(want, spec.min_replicas), spec.max_replicas)


def decide(spec: AutoscalingSpec, obs: FleetObservation, state: PolicyState) -> tuple[int, PolicyState]:
    """The number of active plus starting replicas the fleet should have after this evaluation,
    and the policy's memory for the next one."""
    current = obs.num_active + obs.num_starting
    want = desired_replicas(spec, obs)
    if want > current:
        since = obs.now_s if state.up_since_s is None else state.up_since_s
        if obs.now_s - since >= spec.upscale_delay_s - _DELAY_EPS_S:
            return want, PolicyState()
        return current, PolicyState(up_since_s=since)
    if want < current:
        since = obs.now_s if state.down_since_s is None else state.down_since_s
        if obs.now_s - since >= spec.downscale_delay_s - _DELAY_EPS_S:
            return want, PolicyState()
        return current, PolicyState(down_since_s=since)
    return current, PolicyState()
