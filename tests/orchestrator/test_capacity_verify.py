"""Capacity planning's fleet verification: a fleet that never meets the SLOs is not reported as
the plan, and a fleet that needed more replicas than planned hands the choice to a candidate that is
then cheaper (real local Ray actors simulate every fleet)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import cast

import pytest
import ray
from conftest import REPO

from orchestrator.sweep.capacity import _MAX_VERIFY_STEPS, CandidatePlan, CapacityPlanner, _Chain
from orchestrator.sweep.objective import meets_slo
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.results import TrialResult, TrialStatus

SCENARIO = REPO / "scenarios" / "llama3_8b-h100.toml"


@pytest.mark.ray
def test_a_fleet_that_misses_hands_the_choice_to_the_next_cheapest(ray_address: str, tmp_path: Path) -> None:
    path = tmp_path / "cap.toml"
    path.write_text(f"""
[study]
name = "capverify"
[capacity]
target_request_rate = 40.0
max_replicas = 16
[slo]
ttft_p90_s = 0.5
[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 60, "workload.random_input_len" = 512, "workload.random_output_len" = 16 }}
[space]
"hardware.name" = {{ choices = ["l4", "h100_sxm"] }}
""")
    spec = load_sweep(path)
    base = spec.load_base()
    pool = ShardPool(ray.put(base), num_actors=1, render_artifacts=False, name_prefix="test-capverify")
    try:
        planner = CapacityPlanner(spec, base, pool)
        # Candidate 0 claims an L4 replica takes 40 requests/s alone (it does not: every fleet of up
        # to _MAX_VERIFY_STEPS L4s misses), at the lowest price; candidate 1 is an honest H100 plan.
        l4 = CandidatePlan(params={"hardware.name": "l4"}, status="ok", capacity_rate_per_replica=40.0,
                           replicas=1, gpus_per_replica=1, cost_per_hour_usd=0.5)
        h100 = CandidatePlan(params={"hardware.name": "h100_sxm"}, status="ok", capacity_rate_per_replica=20.0,
                             replicas=2, gpus_per_replica=1, cost_per_hour_usd=6.0)
        plans, chosen, verified, notes = planner._verify_cheapest((l4, h100), 0)
    finally:
        pool.close()
    assert plans[0].status == "fleet_misses_slo"
    # The plan keeps the last fleet it simulated, not one more (before 2026-12-02: 1 + _MAX_VERIFY_STEPS).
    assert plans[0].replicas == _MAX_VERIFY_STEPS
    assert plans[0].cost_per_hour_usd == pytest.approx(0.5 * _MAX_VERIFY_STEPS)
    assert chosen == 1 and verified is not None and meets_slo(verified.metrics, spec.slo)
    assert plans[1].replicas >= 2 and math.isfinite(plans[1].cost_per_hour_usd)
    assert any("after 4 fleet simulation(s)" in n for n in notes)



@pytest.mark.ray
def test_an_moe_replica_is_a_whole_lockstep_engine(ray_address: str, tracking_uri: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """An MoE model's data-parallel ranks are one engine (experts over TP x DP): a capacity plan keeps
    the base's DP inside a replica, and a fleet of N replicas is N such engines, never one engine
    with N times the DP (before 2026-12-02 the plan dropped the base's DP 4 and verified a fleet of 2
    TP 2 replicas as one lockstep DP 2 engine with EP 4)."""
    from orchestrator.cli import main

    path = tmp_path / "capmoe.toml"
    path.write_text(f"""
[study]
name = "capmoe"
[capacity]
target_request_rate = 8.0
rate_rel_tol = 0.2
[slo]
ttft_p90_s = 1.0
tpot_p90_s = 0.05
[base]
scenario = "{REPO / 'scenarios' / 'mixtral_8x7b-h100-tp2.toml'}"
set = {{ "workload.num_prompts" = 60, "engine.data_parallel_size" = 2, "engine.enable_expert_parallel" = true }}
[space]
"hardware.name" = {{ choices = ["h100_sxm"] }}
""")
    assert main(["sweep", str(path), "--actors", "1", "--study-dir", str(tmp_path / "study"), "--tracking-uri",
                 tracking_uri, "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    chosen = out["chosen"]
    assert chosen["gpus_per_replica"] == 4  # TP 2 x DP 2: one engine
    assert "--data-parallel-size 2" in out["vllm_serve"] and "add --data-parallel-size" not in out["vllm_serve"]
    verified = out["verified_fleet_metrics"]
    assert verified is not None and verified["num_gpus"] == 4  # one engine of the fleet, at its share
    if chosen["replicas"] > 1:
        assert any("lockstep" in n for n in out["notes"])


def test_a_candidate_without_a_gpu_price_is_reported_unpriced_and_never_chosen(tmp_path: Path) -> None:
    """A hardware TOML of your own has no price: its cost is NaN, which compares as neither cheaper
    nor dearer, so the file's order chose it (`cheapest: ... $nan/hour`) when it came first."""
    path = tmp_path / "cap.toml"
    path.write_text(f"""
[study]
name = "capprice"
[capacity]
target_request_rate = 4.0
[slo]
ttft_p90_s = 2.0
[base]
scenario = "{SCENARIO}"
[space]
"hardware.name" = {{ choices = ["h200_sxm", "h100_sxm"] }}
""")
    spec = load_sweep(path)
    planner = CapacityPlanner(spec, spec.load_base(), cast(ShardPool, None))

    def plan(hardware: str, cost_per_hour_usd: float) -> CandidatePlan:
        probe = TrialResult(number=0, status=TrialStatus.OK, params={"hardware.name": hardware},
                            metrics={"cost_per_hour_usd": cost_per_hour_usd, "ttft_p90_s": 0.1})
        return planner._plan(_Chain(index=0, params={"hardware.name": hardware}, lo=25.0, best=probe, status="ok"))

    unpriced, priced = plan("h200_sxm", math.nan), plan("h100_sxm", 2.99)
    assert unpriced.status == "unpriced" and "hardware.price_per_gpu_hour_usd" in unpriced.reason
    assert priced.status == "ok"
    assert planner._choose((unpriced, priced)) == 1
