"""Run metrics with `vllm bench serve` meanings, cost, and the kernel-level time breakdown.

TTFT counts from the request's send to its first token; TPOT is per request
(finish - first token) / (output tokens - 1); ITL is every gap between consecutive streamed chunks
of a request (exact: kept as counts per distinct value; a truncated run's include the gaps of the
requests it did not finish); E2E is send to last token. Each has its mean, median, p90, p99 and
standard deviation (`numpy.std`, ddof 0, as `vllm bench serve`'s `std_*_ms`). KV usage
statistics are over the per-step samples (the used fraction after each step). Duration runs
from the first send to the last finish. Goodput counts requests meeting every `[slo]` target per
second of duration.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.engine.records import RequestRecord
from sim.metrics.histogram import counted_stats, counted_std
from sim.metrics.kv_usage import KvUsageTrace
from sim.specs.slo import SloSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelBreakdown:
    """GPU time per kernel kind and per named kernel, collectives and host, over the whole run."""

    seconds_by_kind: Mapping[str, float]
    seconds_by_name: Mapping[str, float]
    host_s: float
    launch_floor_s: float

    def total_s(self) -> float:
        return sum(self.seconds_by_kind.values()) + self.host_s + self.launch_floor_s

    def share_by_kind(self) -> dict[str, float]:
        total = self.total_s() or 1.0
        out = {k: v / total for k, v in self.seconds_by_kind.items()}
        out["host"] = self.host_s / total
        out["launch_floor"] = self.launch_floor_s / total
        return out

    def rows(self) -> list[dict[str, Any]]:
        """Kernel table (kernel, seconds, share), largest first, then host and launch floor: the rows
        of `kernelsight run --out`'s kernel_breakdown.parquet and of a sweep trial's artifact."""
        total = self.total_s() or 1.0
        items = sorted(self.seconds_by_name.items(), key=lambda kv: -kv[1])
        items += [("host", self.host_s), ("launch_floor", self.launch_floor_s)]
        return [{"kernel": name, "seconds": sec, "share": sec / total} for name, sec in items]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSummary:
    num_requests: int
    num_completed: int
    duration_s: float
    request_throughput_per_s: float
    output_throughput_tokens_per_s: float
    total_token_throughput_tokens_per_s: float
    ttft_mean_s: float
    ttft_median_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_std_s: float
    tpot_mean_s: float
    tpot_median_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    tpot_std_s: float
    itl_mean_s: float
    itl_median_s: float
    itl_p90_s: float
    itl_p99_s: float
    itl_std_s: float
    e2el_mean_s: float
    e2el_median_s: float
    e2el_p90_s: float
    e2el_p99_s: float
    e2el_std_s: float
    goodput_requests_per_s: float
    num_preemptions: int
    prefix_hit_frac: float
    kv_usage_mean_frac: float
    kv_usage_max_frac: float
    num_gpus: int
    price_per_gpu_hour_usd: float | None
    """None when no price is known for the hardware (a user hardware TOML with no price table
    entry and no `[hardware] price_per_gpu_hour_usd`); the cost metrics are None then too."""
    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None
    num_steps: int
    truncated: bool
    """The run did not finish every request: it stopped at a `SimLimits` limit, or requests could
    never be scheduled (`num_completed < num_requests`); its metrics cover the finished ones."""
    worst_provenance: str


def _stats(values: np.ndarray) -> tuple[float, float, float, float, float]:
    """Mean, median, p90, p99 and (population) standard deviation, as `vllm bench serve` computes
    them (`np.mean`, `np.percentile`, `np.std`); NaN without values."""
    if values.size == 0:
        return (math.nan,) * 5
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return float(values.mean()), float(p50), float(p90), float(p99), float(values.std())


def kv_usage_stats(kv_usage: Sequence[float] | np.ndarray | KvUsageTrace) -> tuple[float, float]:
    """Step-weighted mean and maximum used KV fraction (0.0, 0.0 without steps)."""
    if isinstance(kv_usage, KvUsageTrace):
        return kv_usage.mean_frac(), kv_usage.max_frac()
    usage = np.asarray(kv_usage, dtype=np.float64) if len(kv_usage) else np.zeros(1)
    return float(usage.mean()), float(usage.max())


def summarize(
    records: Sequence[RequestRecord], *, num_requests: int, itl: Mapping[float, int], slo: SloSpec,
    kv_usage: Sequence[float] | np.ndarray | KvUsageTrace, num_preemptions: int, prefix_query_tokens: int,
    prefix_hit_tokens: int, num_gpus: int, price_per_gpu_hour_usd: float | None, num_steps: int,
    truncated: bool, worst_provenance: str,
) -> SimSummary:
    n = len(records)
    arrival = np.fromiter((r.arrival_s for r in records), float, n)
    first = np.fromiter((r.first_token_s for r in records), float, n)
    finish = np.fromiter((r.finish_s for r in records), float, n)
    out_tok = np.fromiter((r.output_tokens for r in records), float, n)
    in_tok = np.fromiter((r.prompt_tokens for r in records), float, n)
    ttft = first - arrival
    tpot = np.where(out_tok > 1, (finish - first) / np.maximum(out_tok - 1, 1), 0.0)
    e2el = finish - arrival
    # `vllm bench serve` times the run from its start, before the first request's arrival gap
    # (`benchmark_start_time` precedes `get_request`'s first sleep): t = 0 here.
    duration = float(finish.max()) if n else 0.0
    good = np.ones(n, bool)
    if slo.ttft_s is not None:
        good &= ttft <= slo.ttft_s
    if slo.tpot_s is not None:
        good &= tpot <= slo.tpot_s
    if slo.e2el_s is not None:
        good &= e2el <= slo.e2el_s
    per_s = 1.0 / duration if duration > 0 else math.nan
    out_rate = float(out_tok.sum()) * per_s
    cost_per_hour = None if price_per_gpu_hour_usd is None else price_per_gpu_hour_usd * num_gpus
    cost_per_million: float | None = None
    if cost_per_hour is not None:
        cost_per_million = cost_per_hour / (out_rate * 3600.0) * 1e6 if out_rate > 0 else math.inf
    kv_mean, kv_max = kv_usage_stats(kv_usage)
    i_mean, i_p50, i_p90, i_p99 = counted_stats(itl)
    t_mean, t_p50, t_p90, t_p99, t_std = _stats(ttft)
    p_mean, p_p50, p_p90, p_p99, p_std = _stats(tpot[out_tok > 1])
    e_mean, e_p50, e_p90, e_p99, e_std = _stats(e2el)
    return SimSummary(
        num_requests=num_requests, num_completed=n, duration_s=duration,
        request_throughput_per_s=n * per_s, output_throughput_tokens_per_s=out_rate,
        total_token_throughput_tokens_per_s=float(out_tok.sum() + in_tok.sum()) * per_s,
        ttft_mean_s=t_mean, ttft_median_s=t_p50, ttft_p90_s=t_p90, ttft_p99_s=t_p99, ttft_std_s=t_std,
        tpot_mean_s=p_mean, tpot_median_s=p_p50, tpot_p90_s=p_p90, tpot_p99_s=p_p99, tpot_std_s=p_std,
        itl_mean_s=i_mean, itl_median_s=i_p50, itl_p90_s=i_p90, itl_p99_s=i_p99, itl_std_s=counted_std(itl),
        e2el_mean_s=e_mean, e2el_median_s=e_p50, e2el_p90_s=e_p90, e2el_p99_s=e_p99, e2el_std_s=e_std,
        goodput_requests_per_s=float(good.sum()) * per_s,
        num_preemptions=num_preemptions,
        prefix_hit_frac=prefix_hit_tokens / prefix_query_tokens if prefix_query_tokens else 0.0,
        kv_usage_mean_frac=kv_mean, kv_usage_max_frac=kv_max,
        num_gpus=num_gpus, price_per_gpu_hour_usd=price_per_gpu_hour_usd, cost_per_hour_usd=cost_per_hour,
        cost_per_million_output_tokens_usd=cost_per_million,
        num_steps=num_steps, truncated=truncated or n < num_requests, worst_provenance=worst_provenance,
    )
