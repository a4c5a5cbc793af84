"""The autoscaling policy: what the fleet looks like at an evaluation -> how many replicas it wants.

A pure function of an observation and the policy's own memory (`decide`); the simulation
(`sim.engine.autoscaled`) owns the clock, calls it at each evaluation tick and carries out its
decision. The rule is the Kubernetes HPA's with Ray Serve's delays:

- for each metric with a target, the replicas it asks for are ceil(total over the active replicas /
  target) (HPA: desired = ceil(current x average / target)), or the current count while the
  average is within target x (1 +- tolerance); the largest over the metrics wins, clamped to
  [min_replicas, max_replicas];
- with `upscaling_factor` / `downscaling_factor`, an ask x = total / target moves the active count
  a only that share of the way: ceil(a + factor x (x - a)), and a scale-down that this rounds back
  to a removes one replica (Ray Serve's `_apply_scaling_factors`);
- with `look_back_period_s`, the totals are sums over the active replicas of each one's mean over
  its samples of the window (`windowed_observation`; Ray Serve's replicas report their window
  averages and the controller sums them), the samples being the engine's;
- "current" counts active and starting replicas (a replica still loading is capacity on its way,
  as the HPA counts unready pods), not draining ones;
- a change happens only once every evaluation has asked for a change in the same direction for
  `upscale_delay_s` (more) or `downscale_delay_s` (fewer), as Ray Serve's decision counter does;
  the count applied is the one the latest evaluation asked for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
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
    ongoing_requests: float
    """Running plus waiting requests (a count, or with a look-back window a sum of means)."""
    waiting_requests: float
    kv_usage: float
    """Sum of the replicas' used KV fractions."""
    running_frac: float
    """Sum of the replicas' running requests / max_num_seqs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyState:
    """Since when every evaluation has asked for more (`up_since_s`) or fewer replicas."""

    up_since_s: float | None = None
    down_since_s: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    """One active replica's metrics at one instant (a sample of its look-back window)."""

    time_s: float
    ongoing_requests: int
    waiting_requests: int
    kv_usage: float
    """Used KV fraction."""
    num_running: int


def windowed_observation(*, now_s: float, samples: Sequence[Sequence[ReplicaSample]], num_starting: int,
                         look_back_s: float, max_num_seqs: int) -> FleetObservation:
    """The fleet as the policy sees it with a look-back window: `samples` holds each active
    replica's samples (ascending times, the latest at `now_s`); each replica's metrics are the means
    of its samples in (now_s - look_back_s, now_s] (Ray Serve's `InMemoryMetricsStore` window), and
    the fleet's totals their sums over the replicas."""
    ongoing = waiting = kv = running = 0.0
    start_s = now_s - look_back_s
    for replica in samples:
        window = [s for s in replica if s.time_s > start_s]
        if not window:
            continue
        n = len(window)
        ongoing += sum(s.ongoing_requests for s in window) / n
        waiting += sum(s.waiting_requests for s in window) / n
        kv += math.fsum(s.kv_usage for s in window) / n
        running += sum(s.num_running for s in window) / n
    return FleetObservation(now_s=now_s, num_active=len(samples), num_starting=num_starting,
                            ongoing_requests=ongoing, waiting_requests=waiting, kv_usage=kv,
                            running_frac=running / max_num_seqs)


def _scaled_ask(spec: AutoscalingSpec, asked: float, num_active: int) -> int:
    """A metric's ask `asked` (total / target, unrounded) as a replica count, with the scaling
    factors applied to its change from the active count (Ray Serve `_apply_scaling_factors`)."""
    # A float error below a millionth of a replica must not round up to a whole one.
    whole = math.ceil(asked - 1e-9)
    factor = spec.upscaling_factor if asked > num_active else spec.downscaling_factor
    if factor is None or factor == 1.0:
        return whole
    scaled = math.ceil(num_active + factor * (asked - num_active) - 1e-9)
    if whole < num_active and scaled == num_active:
        scaled -= 1  # a factor must not stall a scale-down
    return scaled


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
        asked = current if abs(ratio - 1.0) <= spec.tolerance else _scaled_ask(spec, total / target, obs.num_active)
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
