"""The run's duration as `vllm bench serve` times it: from the benchmark's start, before the first
request's arrival gap, to the last finish."""

from __future__ import annotations

import pytest
from conftest import scenario_dict

from sim.api import simulate
from sim.specs.scenario import scenario_from_dict


def test_duration_runs_from_the_start_so_the_rate_never_exceeds_the_offered_one() -> None:
    """vLLM takes `benchmark_start_time` before `get_request`'s first sleep of one gap, and spaces the
    N arrivals so the last one lands at N / request_rate: a run's request throughput is at most the
    offered rate (before 2026-12-02 the duration ran from the first send: 10 requests at 1 req/s
    reported 1.27 req/s)."""
    sc = scenario_from_dict(scenario_dict(workload={"num_prompts": 10, "request_rate": 1.0, "random_input_len": 128,
                                                    "random_output_len": 16}, perf={"tier": "roofline"}),
                            source="test")
    result = simulate(sc)
    first_send = min(r.arrival_s for r in result.records)
    assert first_send > 0.5  # the first request waited its gap
    assert result.summary.duration_s == max(r.finish_s for r in result.records)
    assert result.summary.request_throughput_per_s <= 1.0
    assert result.summary.request_throughput_per_s == pytest.approx(10 / result.summary.duration_s, rel=1e-12)
