"""Per-pool metrics of a disaggregated run, and its KV transfers.

Utilisation: busy step seconds over (ranks x run duration). Queueing delay: prefill pool, send to
first scheduled on a prefill rank; decode pool, transfer end to admission on a decode rank. KV
usage: over the per-step samples of the pool's ranks. Transfers: per request, prefill end to the
KV complete on the decode worker (the exposed transfer time), and the bytes moved.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sim.metrics.kv_usage import KvUsageTrace
from sim.metrics.summary import kv_usage_stats


def _stats(values: Sequence[float]) -> tuple[float, float, float, float]:
    a = np.asarray(values, dtype=np.float64)
    if a.size == 0:
        return (math.nan,) * 4
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return float(a.mean()), float(p50), float(p90), float(p99)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSummary:
    pool: str
    """`prefill` or `decode`."""
    hardware: str
    num_workers: int
    num_ranks: int
    """Schedulers: workers x attention-DP ranks."""
    num_gpus: int
    utilization_frac: float
    queue_delay_mean_s: float
    queue_delay_median_s: float
    queue_delay_p90_s: float
    queue_delay_p99_s: float
    kv_usage_mean_frac: float
    kv_usage_max_frac: float
    num_preemptions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferSummary:
    connector: str
    link: str
    """`nvlink` or `inter_node`."""
    num_transfers: int
    bytes_moved: float
    bytes_per_request_mean: float
    transfer_mean_s: float
    transfer_median_s: float
    transfer_p90_s: float
    transfer_p99_s: float


def pool_summary(*, pool: str, hardware: str, num_workers: int, num_ranks: int, num_gpus: int,
                 busy_s: Sequence[float], duration_s: float, queue_delay_s: Sequence[float],
                 kv_usage: Sequence[float] | KvUsageTrace, num_preemptions: int) -> PoolSummary:
    q_mean, q_p50, q_p90, q_p99 = _stats(queue_delay_s)
    kv_mean, kv_max = kv_usage_stats(kv_usage)
    util = sum(busy_s) / (num_ranks * duration_s) if duration_s > 0 else math.nan
    return PoolSummary(
        pool=pool, hardware=hardware, num_workers=num_workers, num_ranks=num_ranks, num_gpus=num_gpus,
        utilization_frac=util, queue_delay_mean_s=q_mean, queue_delay_median_s=q_p50,
        queue_delay_p90_s=q_p90, queue_delay_p99_s=q_p99, kv_usage_mean_frac=kv_mean,
        kv_usage_max_frac=kv_max, num_preemptions=num_preemptions,
    )


def transfer_summary(*, connector: str, link: str, transfer_s: Sequence[float],
                     transfer_bytes: Sequence[float]) -> TransferSummary:
    t_mean, t_p50, t_p90, t_p99 = _stats(transfer_s)
    moved = float(sum(transfer_bytes))
    n = len(transfer_bytes)
    return TransferSummary(
        connector=connector, link=link, num_transfers=n, bytes_moved=moved,
        bytes_per_request_mean=moved / n if n else math.nan, transfer_mean_s=t_mean,
        transfer_median_s=t_p50, transfer_p90_s=t_p90, transfer_p99_s=t_p99,
    )
