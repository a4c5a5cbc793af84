"""End-to-end intervals of a disaggregated run perturb each pool's own kernel model."""

from __future__ import annotations

import pytest
from conftest import REPO

from sim.api import load_scenario, simulate
from sim.calibration.intervals import IntervalTable
from sim.uncertainty import kernel_tier, run_intervals

pytestmark = pytest.mark.unit

SCENARIO = REPO / "scenarios" / "llama3_8b-h100-disagg-1p1d.toml"
SMALL = {"workload.num_prompts": 40, "workload.random_input_len": 256, "workload.random_output_len": 16}


def test_zero_draws_reproduce_a_disaggregated_run_on_two_gpu_types() -> None:
    # Decode on H200 under prefill on H100: each pool has its own target-measured calibration, so a
    # draw whose factors are all 1 must give back the point run exactly (a perturbation of the
    # prefill GPU's model priced the decode pool with the H100's correction before).
    sc = load_scenario(str(SCENARIO), {**SMALL, "disaggregation.decode.hardware": "h200_sxm"})
    point = simulate(sc).summary
    zero = IntervalTable(tiers={"target-measured": {}, "cross-generation": {}}, data_sha256={})
    iv = run_intervals(sc, point, 2, table=zero, kernel_only=True)
    assert iv.k == 2
    for s in iv.samples:
        assert s.tpot_mean_s == point.tpot_mean_s
        assert s.ttft_mean_s == point.ttft_mean_s
    assert iv.lo["tpot_mean_s"] == iv.hi["tpot_mean_s"] == point.tpot_mean_s


def test_disaggregated_tier_is_cross_generation_when_a_pool_is() -> None:
    both = load_scenario(str(SCENARIO), SMALL)
    assert kernel_tier(both) == "target-measured"  # h100_sxm ships a calibration
    mixed = load_scenario(str(SCENARIO), {**SMALL, "disaggregation.decode.hardware": "b200_sxm"})
    assert kernel_tier(mixed) == "cross-generation"  # b200_sxm is evaluation only: none ships
    roof = load_scenario(str(SCENARIO), {**SMALL, "disaggregation.decode.hardware": "b200_sxm",
                                         "perf.tier": "roofline"})
    assert kernel_tier(roof) == "roofline"


def test_a_sweep_trial_of_a_mixed_gpu_fleet_prices_each_pool_with_its_own_model() -> None:
    from orchestrator.sweep.evaluate import TrialEvaluator
    from orchestrator.sweep.results import TrialInput, TrialStatus

    base = load_scenario(str(SCENARIO), SMALL)
    params = {"disaggregation.decode.hardware": "h200_sxm"}
    evaluator = TrialEvaluator(base, render_artifacts=False)
    trial = evaluator.evaluate(TrialInput(number=0, params=params))
    assert trial.status is TrialStatus.OK
    alone = simulate(base.with_overrides(params)).summary  # what `kernelsight run` gives
    assert trial.metrics["tpot_mean_s"] == alone.tpot_mean_s
    assert trial.metrics["ttft_mean_s"] == alone.ttft_mean_s
    # The next trial reuses the worker's models and priced parts: same numbers.
    again = evaluator.evaluate(TrialInput(number=1, params=params, interval_runs=2))
    assert again.metrics["tpot_mean_s"] == alone.tpot_mean_s
    assert again.metrics["tpot_mean_s_lo"] <= alone.tpot_mean_s <= again.metrics["tpot_mean_s_hi"]
