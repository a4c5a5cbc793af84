"""Run-ahead decode runs (replicas run decode-only steps past other replicas' events) give exactly the
results of the loop that stops every replica's run at the next event anywhere."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import scenario_dict

from sim.api import SimResult, load_host_params, scenario_efficiency, simulate
from sim.engine.pricer import StepPricer
from sim.engine.simulation import SimLimits, Simulation
from sim.perf.step import StepCostModel
from sim.specs.scenario import Scenario, scenario_from_dict

FLEETS: dict[str, dict[str, dict[str, Any]]] = {
    # Light load on many replicas: long runs, each cut by an arrival to its own replica.
    "light-round-robin": {"engine": {"data_parallel_size": 4},
                          "workload": {"num_prompts": 120, "request_rate": 3.0, "random_input_len": 400,
                                       "random_output_len": 120, "random_range_ratio": 0.5}},
    # Busier, least-outstanding routing (reads the replicas' request counts mid-run).
    "busy-least-outstanding": {"engine": {"data_parallel_size": 3, "router": "least_outstanding",
                                          "max_num_seqs": 16},
                               "workload": {"num_prompts": 150, "request_rate": 30.0, "random_input_len": 300,
                                            "random_output_len": 80, "random_range_ratio": 0.8}},
    # A client concurrency cap: held requests are sent as runs end.
    "max-concurrency": {"engine": {"data_parallel_size": 2},
                        "workload": {"num_prompts": 80, "max_concurrency": 5, "random_input_len": 200,
                                     "random_output_len": 60, "random_range_ratio": 0.5}},
    # KV blocks run out: runs stop where a step would preempt.
    "preemption": {"engine": {"data_parallel_size": 2, "gpu_memory_utilization": 0.25},
                   "workload": {"num_prompts": 120, "random_input_len": 1000, "random_output_len": 300,
                                "random_range_ratio": 0.5}},
}
# SGLang's prefill priority: runs start only once every bulk decode sampled in the previous step.
FLEETS.update({f"sglang-{name}": {**spec, "engine": {**spec["engine"], "backend": "sglang"}}
               for name, spec in list(FLEETS.items())})


def _scenario(sections: dict[str, dict[str, Any]]) -> Scenario:
    return scenario_from_dict(scenario_dict(**sections), source="t")


def _same(a: SimResult, b: SimResult, *, exact_breakdown: bool = True) -> None:
    assert a.records == b.records  # same values and the same finish order
    assert a.summary == b.summary
    assert a.kv_usage == b.kv_usage
    if exact_breakdown:
        assert a.breakdown == b.breakdown  # keys counted in the same order: bitwise equal sums
    for x, y in ((a.breakdown.seconds_by_name, b.breakdown.seconds_by_name),
                 (a.breakdown.seconds_by_kind, b.breakdown.seconds_by_kind)):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-12)


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_run_ahead_gives_the_results_of_the_event_by_event_loop(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sc = _scenario(FLEETS[name])
    ahead = simulate(sc)
    monkeypatch.setattr(Simulation, "RUN_AHEAD", False)
    _same(ahead, simulate(sc))
    # The reference path counts bulk steps in another order (sums to ~1e-16), as in test_bulk.
    _same(ahead, simulate(sc, limits=SimLimits(bulk_decode=False)), exact_breakdown=False)


def test_arrivals_to_other_replicas_do_not_cut_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Light load on 4 replicas: with run-ahead, about one run per request (one heap event for its
    decode phase), against runs cut at every other replica's event without it."""
    sc = _scenario(FLEETS["light-round-robin"])
    ends: list[int] = []
    finish_run = Simulation._finish_run

    def counting(self: Simulation, idx: int) -> Any:
        ends.append(idx)
        return finish_run(self, idx)

    monkeypatch.setattr(Simulation, "_finish_run", counting)
    result = simulate(sc)
    assert result.summary.num_steps > 20 * result.summary.num_requests
    assert len(ends) <= 2 * result.summary.num_requests


@pytest.mark.parametrize("num_decode,context,max_steps,horizon_steps", [
    (1, 300, 500, None), (3, 3 * 1000 + 7, 200, 50.5), (7, 7 * 8, 100, 0.5), (2, 17, 40, 40.0)])
def test_array_decode_run_matches_the_step_by_step_one(num_decode: int, context: int, max_steps: int,
                                                       horizon_steps: float | None) -> None:
    sc = _scenario({})
    pricers = [StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))
               for _ in range(2)]
    step = pricers[0].step_s(((), num_decode, 64))
    horizon = np.inf if horizon_steps is None else 1.0 + horizon_steps * step
    run = pricers[0].decode_run(num_decode, context, 1.0, max_steps, horizon, 1e9)
    groups, ends = pricers[1].decode_steps(num_decode, context, 1.0, max_steps, horizon, 1e9)
    assert run.ends[:run.num_steps].tolist() == ends  # the same running sums, bit for bit
    keys = [pricers[0].run_key(run, j) for j in range(run.num_steps)]
    firsts = [g[2] for g in groups if g[2] < run.num_steps]
    assert [keys[j] for j in firsts] == [g[0] for g in groups if g[2] < run.num_steps]
    assert pricers[0]._memo == pricers[1]._memo  # the same keys priced (the crossing step's too)


def test_an_autoscaler_reading_kv_usage_sees_the_blocks_of_steps_run_ahead(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica in a run-ahead run has not run its steps yet when an evaluation tick reads its KV
    usage; it reports the blocks its steps started by then have taken, so a `target_kv_usage`
    fleet scales exactly as in the event-by-event loop (before 0.6.1 it read the usage as of each
    run's start, without the blocks the run's decodes had grown into since: other decisions here)."""
    from conftest import REPO

    from sim.api import load_scenario
    from sim.serde import parse_override

    sets = ["workload.profile_duration_s=300", "engine.data_parallel_size=16", "autoscaling.max_replicas=16",
            "autoscaling.target_ongoing_requests=1000", "autoscaling.target_kv_usage=0.003",
            "autoscaling.upscale_delay_s=0.0", "autoscaling.downscale_delay_s=0.0", "autoscaling.startup_delay_s=5.0"]
    sc = load_scenario(REPO / "scenarios" / "llama3_8b-fleet-day-autoscale.toml",
                       dict(parse_override(s) for s in sets))
    ahead = simulate(sc)
    monkeypatch.setattr(Simulation, "RUN_AHEAD", False)
    reference = simulate(sc)
    assert ahead.autoscaling is not None and ahead.autoscaling.peak_replicas > 2
    assert ahead.autoscaling == reference.autoscaling
    assert ahead.records == reference.records
    assert ahead.summary == reference.summary


@pytest.mark.parametrize("limit", [97, 500, 2_000])
def test_a_step_limit_stops_a_fleet_where_the_reference_path_stops(limit: int) -> None:
    """Under a step limit a fleet runs no steps ahead: it stops at the limit with the records and
    summary of the request-by-request reference path (queued runs counted all their steps, future
    ones too: two replicas stopped at 112 steps of a 137-step limit, and with 4 replicas before
    simulator 0.6.2 runs overshot it)."""
    sc = _scenario(FLEETS["light-round-robin"])
    bulk = simulate(sc, limits=SimLimits(max_num_steps=limit))
    reference = simulate(sc, limits=SimLimits(max_num_steps=limit, bulk_decode=False))
    assert bulk.summary.truncated and reference.summary.truncated
    assert bulk.summary.num_steps == reference.summary.num_steps == limit
    assert bulk.records == reference.records
