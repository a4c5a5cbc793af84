"""What an autoscaled fleet provisioned: replicas over time, its peak, GPU-hours, and the SLO
attainment it bought.

GPU-hours are replica-seconds x GPUs per replica / 3600, each replica paid from its start (start-up
included; t = 0 for the initial replicas) to its release or the run's end (the last request's
finish in the engine, without the API server's latency outside it). SLO attainment is the goodput
share: completed requests meeting their targets over completed requests, the targets being a
request's traffic class's (`[[workload.classes]]`, an unset one the scenario's `[slo]`) or, without
classes, the scenario's `[slo]`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sim.metrics.classes import ClassSummary
from sim.metrics.summary import SimSummary


@dataclass(frozen=True, slots=True, kw_only=True)
class AutoscalingSummary:
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    gpus_per_replica: int
    peak_replicas: int
    """Most replicas provisioned at once (active, starting and draining)."""
    peak_gpus: int
    mean_replicas: float
    """Replica-seconds over the accounting window."""
    window_s: float
    """The accounting window: t = 0 to the last request's finish in the engine."""
    replica_hours: float
    gpu_hours: float
    startup_gpu_hours: float
    """The part of `gpu_hours` paid while replicas were loading."""
    num_replicas_started: int
    num_replicas_drained: int
    slo_attainment: float
    """Goodput share: completed requests meeting their targets (their class's, else `[slo]`'s) /
    completed requests."""
    cost_usd: float | None
    """`gpu_hours` x the GPU-hour price; None without a price."""
    timeline: tuple[tuple[float, int, int, int], ...]
    """(time_s, active, starting, draining) after each change, from (0, initial, 0, 0)."""


def autoscaling_summary(*, min_replicas: int, max_replicas: int, initial_replicas: int, gpus_per_replica: int,
                        peak_replicas: int, window_s: float, replica_s: float, startup_s: float,
                        num_started: int, num_drained: int, summary: SimSummary,
                        timeline: list[tuple[float, int, int, int]],
                        classes: Sequence[ClassSummary] = ()) -> AutoscalingSummary:
    """`classes`: the run's per-class summaries; with them each request is judged by its class's
    targets (a fleet-day's chat, RAG and batch SLOs), as the per-class goodput is."""
    gpu_hours = replica_s * gpus_per_replica / 3600.0
    price = summary.price_per_gpu_hour_usd
    # The good requests are a count: recover it exactly from the rate (rate x duration rounds to
    # e.g. 5.000000000000001 for 5 requests over 11.3 s, an attainment above 1).
    if classes:
        good = sum(round(c.goodput_frac * c.num_completed) for c in classes if c.num_completed)
    else:
        good = round(summary.goodput_requests_per_s * summary.duration_s) if summary.duration_s > 0 else 0
    return AutoscalingSummary(
        min_replicas=min_replicas, max_replicas=max_replicas, initial_replicas=initial_replicas,
        gpus_per_replica=gpus_per_replica, peak_replicas=peak_replicas, peak_gpus=peak_replicas * gpus_per_replica,
        mean_replicas=replica_s / window_s if window_s > 0 else math.nan, window_s=window_s,
        replica_hours=replica_s / 3600.0, gpu_hours=gpu_hours, startup_gpu_hours=startup_s * gpus_per_replica / 3600.0,
        num_replicas_started=num_started, num_replicas_drained=num_drained,
        slo_attainment=good / summary.num_completed if summary.num_completed else math.nan,
        cost_usd=None if price is None else gpu_hours * price, timeline=tuple(timeline))


def provisioned_cost(summary: SimSummary, autoscaling: AutoscalingSummary) -> SimSummary:
    """The run's cost metrics from the GPU-hours provisioned: `cost_per_hour_usd` is their cost over
    the accounting window (a mean), `cost_per_million_output_tokens_usd` their cost per output token.
    `num_gpus` stays the fleet's slots (`max_replicas` x GPUs per replica is their bound)."""
    if autoscaling.cost_usd is None:
        return summary
    output_tokens = summary.output_throughput_tokens_per_s * summary.duration_s
    hours = autoscaling.window_s / 3600.0
    per_hour = autoscaling.cost_usd / hours if hours > 0 else math.nan
    per_million = autoscaling.cost_usd / output_tokens * 1e6 if output_tokens > 0 else math.inf
    return replace(summary, cost_per_hour_usd=per_hour, cost_per_million_output_tokens_usd=per_million)
