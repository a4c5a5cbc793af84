"""Goodput under SLOs, cost per hour and per million output tokens, truncated runs."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import simulate
from sim.engine.records import RequestRecord
from sim.metrics.summary import SimSummary, summarize
from sim.specs.prices import load_prices
from sim.specs.scenario import scenario_from_dict
from sim.specs.slo import SloSpec


def _record(rid: int, *, first_token_s: float, finish_s: float, output_tokens: int) -> RequestRecord:
    return RequestRecord(request_id=rid, replica=0, arrival_s=0.0, first_scheduled_s=0.0,
                         first_token_s=first_token_s, finish_s=finish_s, prompt_tokens=100,
                         output_tokens=output_tokens, prefix_hit_tokens=0, num_preemptions=0, recomputed_tokens=0)


NO_SLO = SloSpec()


def _summary(records: list[RequestRecord], *, slo: SloSpec = NO_SLO, num_requests: int | None = None,
             truncated: bool = False, **kw: Any) -> SimSummary:
    args: dict[str, Any] = dict(itl={}, kv_usage=[0.5], num_preemptions=0, prefix_query_tokens=0,
                                prefix_hit_tokens=0, num_gpus=2, price_per_gpu_hour_usd=3.0, num_steps=1,
                                worst_provenance="roofline default")
    args.update(kw)
    return summarize(records, num_requests=len(records) if num_requests is None else num_requests, slo=slo,
                     truncated=truncated, **args)


RECORDS = [
    _record(0, first_token_s=0.1, finish_s=10.0, output_tokens=1000),  # TPOT 9.9 / 999 s
    _record(1, first_token_s=0.5, finish_s=5.0, output_tokens=1000),   # TPOT 4.5 / 999 s
    _record(2, first_token_s=0.2, finish_s=2.0, output_tokens=10),     # TPOT 0.2 s
]


def test_goodput_counts_requests_meeting_every_slo_by_hand() -> None:
    assert _summary(RECORDS).goodput_requests_per_s == pytest.approx(3 / 10.0)  # no SLO: everyone
    assert _summary(RECORDS, slo=SloSpec(ttft_s=0.3)).goodput_requests_per_s == pytest.approx(2 / 10.0)
    assert _summary(RECORDS, slo=SloSpec(ttft_s=0.3, tpot_s=0.1)).goodput_requests_per_s == pytest.approx(1 / 10.0)
    assert _summary(RECORDS, slo=SloSpec(e2el_s=5.0)).goodput_requests_per_s == pytest.approx(2 / 10.0)
    assert _summary(RECORDS, slo=SloSpec(ttft_s=0.05)).goodput_requests_per_s == 0.0
    assert _summary(RECORDS).request_throughput_per_s == pytest.approx(3 / 10.0)


def test_latency_stats_have_vllm_bench_serves_std() -> None:
    """`vllm bench serve` reports std_{ttft,tpot,itl,e2el}_ms as np.std (ddof 0) of the same lists
    its means and percentiles come from: TPOT over requests with more than one output token."""
    import numpy as np

    records = [*RECORDS, _record(3, first_token_s=0.4, finish_s=0.4, output_tokens=1)]  # no TPOT
    itl = {0.01: 5, 0.03: 2, 0.2: 1}
    s = _summary(records, itl=itl)
    ttft = [0.1, 0.5, 0.2, 0.4]
    e2el = [10.0, 5.0, 2.0, 0.4]
    tpot = [9.9 / 999, 4.5 / 999, 1.8 / 9]
    gaps = [0.01] * 5 + [0.03] * 2 + [0.2]
    assert s.ttft_std_s == pytest.approx(float(np.std(ttft)), rel=1e-12)
    assert s.e2el_std_s == pytest.approx(float(np.std(e2el)), rel=1e-12)
    assert s.tpot_std_s == pytest.approx(float(np.std(tpot)), rel=1e-12)
    assert s.itl_std_s == pytest.approx(float(np.std(gaps)), rel=1e-12)
    assert s.itl_mean_s == pytest.approx(float(np.mean(gaps)), rel=1e-12)
    empty = _summary([_record(0, first_token_s=0.1, finish_s=0.1, output_tokens=1)])
    assert math.isnan(empty.tpot_std_s) and math.isnan(empty.itl_std_s) and empty.ttft_std_s == 0.0


def test_cost_per_hour_and_per_million_output_tokens_by_hand() -> None:
    s = _summary(RECORDS)  # 2010 output tokens in 10 s on 2 GPUs at $3/GPU-hour
    assert s.cost_per_hour_usd == 6.0
    assert s.output_throughput_tokens_per_s == pytest.approx(201.0)
    assert s.cost_per_million_output_tokens_usd == pytest.approx(6.0 / (201.0 * 3600) * 1e6, rel=1e-12)


def test_a_run_with_unfinished_requests_is_reported_truncated() -> None:
    assert not _summary(RECORDS).truncated
    s = _summary(RECORDS, num_requests=4)
    assert s.truncated and (s.num_completed, s.num_requests) == (3, 4)


def _scenario(**sections: dict[str, Any]) -> Any:
    base = {"engine": {"tensor_parallel_size": 2},
            "workload": {"num_prompts": 40, "request_rate": 30.0, "random_input_len": 1500,
                         "random_output_len": 60, "random_range_ratio": 0.5}}
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return scenario_from_dict(scenario_dict(**base), source="t")


def test_a_simulated_run_whose_slo_excludes_some_requests_has_lower_goodput() -> None:
    free = simulate(_scenario())
    ttfts = sorted(r.ttft_s() for r in free.records)
    limit_s = ttfts[len(ttfts) // 2]
    result = simulate(_scenario(slo={"ttft_s": limit_s, "tpot_s": 1.0}))
    good = sum(r.ttft_s() <= limit_s and r.tpot_s() <= 1.0 for r in result.records)
    s = result.summary
    assert 0 < good < s.num_completed == 40
    assert s.goodput_requests_per_s == pytest.approx(good / s.duration_s, rel=1e-12)
    assert s.goodput_requests_per_s < s.request_throughput_per_s
    assert free.summary.goodput_requests_per_s == pytest.approx(free.summary.request_throughput_per_s, rel=1e-12)


def test_simulated_cost_uses_the_price_table_or_the_scenario_override() -> None:
    table = simulate(_scenario()).summary
    assert table.num_gpus == 2
    assert table.price_per_gpu_hour_usd == load_prices()["h100_sxm"]
    assert table.cost_per_hour_usd == pytest.approx(2 * load_prices()["h100_sxm"], rel=1e-12)
    s = simulate(_scenario(hardware={"price_per_gpu_hour_usd": 1.25})).summary
    assert (s.price_per_gpu_hour_usd, s.cost_per_hour_usd) == (1.25, 2.5)
    assert s.cost_per_million_output_tokens_usd == pytest.approx(
        2.5 / (s.output_throughput_tokens_per_s * 3600) * 1e6, rel=1e-12)
    assert s.output_throughput_tokens_per_s == table.output_throughput_tokens_per_s  # the run is the same


def test_slo_attainment_of_an_autoscaled_run_never_exceeds_one() -> None:
    """Five requests all meeting the SLO over 11.3 s: goodput x duration is 5.000000000000001, but
    the attainment is the count over the count, exactly 1."""
    from sim.metrics.autoscaling import autoscaling_summary

    records = [_record(i, first_token_s=0.1, finish_s=11.3, output_tokens=10) for i in range(5)]
    summary = _summary(records)
    assert summary.duration_s == 11.3 and summary.goodput_requests_per_s * 11.3 > 5.0
    auto = autoscaling_summary(min_replicas=1, max_replicas=2, initial_replicas=1, gpus_per_replica=1,
                               peak_replicas=1, window_s=11.3, replica_s=11.3, startup_s=0.0, num_started=0,
                               num_drained=0, summary=summary, timeline=[(0.0, 1, 0, 0)])
    assert auto.slo_attainment == 1.0
