"""Predicted metrics of a measured run from a (possibly shorter) simulated run.

Closed loops (`closed_loop_means`): the measured run sends N = 10 x C requests with C in
flight. Its first C requests arrive together (a prefill burst), its last C drain an emptying
engine, and the ones in between see the steady state. A simulation of n < N requests (n >= 2C,
requests numbered in send order) keeps the first C and last C as they are and gives the middle
requests the weight of all N - 2C steady ones:

    mean = (sum(first) + sum(last) + (N - 2C) x mean(middle)) / N

(with n = 2C there is no middle; the last C stand for it). With n = N this is the plain mean.

Offline runs (`offline_throughput`): all N requests queued at t=0. A simulation of the first n
requests ends at T_n; the remaining N - n complete at the steady rate r measured after the first
batch of B requests finished, r = (n - B) / (T_n - t_B), so T_N = T_n + (N - n) / r and the
throughput is N x OSL / T_N. With n = N it is the simulated throughput itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sim.engine.records import RequestRecord


def _per_request(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    recs = sorted(records, key=lambda r: r.request_id)
    ids = np.array([r.request_id for r in recs])
    ttft = np.array([r.ttft_s() for r in recs])
    tpot = np.array([r.tpot_s() for r in recs])
    multi = np.array([r.output_tokens > 1 for r in recs])
    return ids, ttft, tpot, multi


def _weighted_mean(values: np.ndarray, ranks: np.ndarray, n_sim: int, n_full: int, conc: int) -> float:
    if values.size == 0:
        return math.nan
    if n_sim >= n_full or n_sim < 2 * conc:
        return float(values.mean())
    first = ranks < conc
    last = ranks >= n_sim - conc
    middle = ~(first | last)
    steady = values[middle] if middle.any() else values[last]
    total = values[first].sum() + values[last].sum() + (n_full - 2 * conc) * steady.mean()
    return float(total / (first.sum() + last.sum() + (n_full - 2 * conc)))


def closed_loop_means(records: Sequence[RequestRecord], *, concurrency: int, num_simulated: int,
                      num_measured: int) -> dict[str, float]:
    """Mean TTFT and TPOT of the measured closed-loop run (see module docstring)."""
    ids, ttft, tpot, multi = _per_request(records)
    ranks = np.searchsorted(np.sort(ids), ids)
    return {
        "ttft_mean_s": _weighted_mean(ttft, ranks, num_simulated, num_measured, concurrency),
        "tpot_mean_s": _weighted_mean(tpot[multi], ranks[multi], num_simulated, num_measured, concurrency),
    }


def offline_throughput(records: Sequence[RequestRecord], *, batch: int, num_measured: int) -> float:
    """Output tokens/s of the measured offline run (see module docstring)."""
    n = len(records)
    if n == 0:
        return math.nan
    finish = np.sort(np.array([r.finish_s for r in records]))
    start = min(r.arrival_s for r in records)
    tokens_per_request = float(np.mean([r.output_tokens for r in records]))
    t_n = float(finish[-1] - start)
    if n >= num_measured:
        return n * tokens_per_request / t_n
    b = min(max(batch, 1), n - 1)
    span = float(finish[-1] - finish[b - 1])
    if span <= 0:
        return n * tokens_per_request / t_n
    rate = (n - b) / span
    return num_measured * tokens_per_request / (t_n + (num_measured - n) / rate)
