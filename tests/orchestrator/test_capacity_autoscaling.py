"""Capacity planning with an `[autoscaling]` base: fixed one-replica probes, an autoscaled verified
fleet, and the plan's cost from the GPU-hours it provisioned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import pytest
from conftest import REPO

from orchestrator.cli import main
from orchestrator.commands_run import hourly_replicas
from orchestrator.sweep.capacity import CandidatePlan, CapacityPlanner, CapacityReport
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.results import TrialInput, TrialResult, TrialStatus
from sim.errors import ConfigError

BASE = (REPO / "scenarios" / "llama3_8b-h100.toml").read_text()
AUTOSCALING = """
[autoscaling]
min_replicas = 1
target_ongoing_requests = 4.0
interval_s = 2.0
upscale_delay_s = 0.0
downscale_delay_s = 20.0
startup_delay_s = 5.0
"""


def _sweep(tmp_path: Path, scenario_text: str) -> Path:
    scenario = tmp_path / "base.toml"
    scenario.write_text(scenario_text)
    path = tmp_path / "cap.toml"
    path.write_text(f"""
[study]
name = "cap-autoscale"
[capacity]
target_request_rate = 150.0
rate_rel_tol = 0.2
[slo]
ttft_p90_s = 2.0
[base]
scenario = "{scenario}"
set = {{ "workload.num_prompts" = 60, "workload.random_input_len" = 512, "workload.random_output_len" = 32 }}
[space]
"engine.tensor_parallel_size" = {{ choices = [1] }}
""")
    return path


def test_a_profile_base_is_refused_with_the_reason(tmp_path: Path) -> None:
    text = BASE.replace("request_rate = 10.0", 'request_rate_profile = "diurnal"\ndiurnal_peak_rate = 2.0\n'
                                               "diurnal_trough_rate = 1.0")
    with pytest.raises(ConfigError, match="probes constant request rates") as info:
        load_sweep(_sweep(tmp_path, text + AUTOSCALING))
    assert info.value.key == "base.scenario"


def test_the_chosen_fleet_is_verified_autoscaled_and_costed_by_its_gpu_hours(
        ray_runtime: None, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    uri = tracking_uri
    path = _sweep(tmp_path, BASE + AUTOSCALING)
    assert main(["sweep", str(path), "--tracking-uri", uri, "--study-dir", str(tmp_path), "--json",
                 "--actors", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    chosen = out["chosen"]
    fleet = out["verified_fleet_metrics"]
    assert chosen["status"] == "ok" and chosen["replicas"] >= 2
    # the verified fleet is autoscaled within the planned replicas, from min_replicas = 1
    assert 1 <= chosen["peak_replicas"] <= chosen["replicas"] and fleet["peak_replicas"] == chosen["peak_replicas"]
    assert chosen["fleet_gpu_hours"] == fleet["gpu_hours"] > 0
    assert 0.0 <= chosen["slo_attainment"] <= 1.0
    # its cost is the provisioned GPU-hours', at most the fixed fleet's
    assert chosen["fleet_cost_per_hour_usd"] == fleet["cost_per_hour_usd"]
    assert chosen["fleet_cost_per_hour_usd"] <= chosen["max_replicas_cost_per_hour_usd"] + 1e-9
    assert chosen["max_replicas_cost_per_hour_usd"] == pytest.approx(chosen["replicas"] * 2.99)
    assert chosen["cost_per_hour_per_replica_usd"] == pytest.approx(2.99)  # one fixed replica's, as before


def test_the_hourly_replica_table_of_run() -> None:
    # 2 replicas for 1.5 h, 4 (2 of them starting) until 2 h, 4 (1 draining) until 2.25 h, then 3:
    # hour 1 pays 0.5 x 2 + 0.5 x 4, hour 2 (to 2.5 h) 0.25 x 4 + 0.25 x 3
    timeline = ((0.0, 2, 0, 0), (5400.0, 2, 2, 0), (7200.0, 3, 0, 1), (8100.0, 3, 0, 0))
    assert hourly_replicas(timeline, 9000.0) == [("0", "2", "2"), ("1", "4", "3"), ("2", "4", "1.75")]


def test_a_capacity_slo_bound_on_an_autoscaling_metric_is_refused(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Capacity probes are one fixed replica (the base's [autoscaling] removed): they report no
    `slo_attainment`, so a bound on it is refused on load, naming the key (before, `check` passed
    it and `sweep` died in the first probe's SLO check: ValueError: max() arg is an empty sequence)."""
    path = _sweep(tmp_path, BASE + AUTOSCALING)
    path.write_text(path.read_text().replace("ttft_p90_s = 2.0", "ttft_p90_s = 2.0\nslo_attainment = { min = 0.9 }"))
    with pytest.raises(ConfigError, match="one fixed replica per probe") as info:
        load_sweep(path)
    assert (info.value.key, info.value.value) == ("slo.slo_attainment", 0.9)
    assert main(["check", str(path)]) == 2
    assert "slo.slo_attainment=0.9" in capsys.readouterr().err


class _CannedFleets:
    """A pool answering verified fleets without simulating them: an H100 fleet meets the SLOs from
    2 replicas (provisioned $4.00/hour), an H200 fleet from 1 (provisioned $3.00/hour), an L4 fleet
    from 3 ($1.00/hour)."""

    num_restarts = 0

    def __init__(self) -> None:
        self.fleets: list[tuple[str, int]] = []
        self._done: list[TrialResult] = []

    def submit(self, trial: TrialInput) -> None:
        hw, n = str(trial.params["hardware.name"]), int(cast(int, trial.params["autoscaling.max_replicas"]))
        self.fleets.append((hw, n))
        ok = n >= {"h100_sxm": 2, "h200_sxm": 1, "l4": 3}[hw]
        self._done.append(TrialResult(number=trial.number, status=TrialStatus.OK, params=trial.params, metrics={
            "ttft_p90_s": 0.1 if ok else 5.0, "cost_per_hour_usd": {"h100_sxm": 4.0, "h200_sxm": 3.0, "l4": 1.0}[hw],
            "peak_replicas": float(n), "gpu_hours": 0.01, "mean_replicas": 1.5, "slo_attainment": 1.0}))

    def wait(self, timeout_s: float = 1.0) -> list[TrialResult]:
        done, self._done = self._done, []
        return done


def test_an_autoscaled_verified_fleet_is_ranked_by_its_fixed_fleet_cost(tmp_path: Path) -> None:
    """The H100 plan (1 replica, $2.99/hour) needs 2 as a fleet: $5.98/hour fixed, more than the
    H200 plan's $5.00, so the H200 fleet is verified and chosen. Before, the H100 fleet's
    provisioned $4.00/hour was ranked against the H200's fixed $5.00: the H100 stayed chosen and
    the H200 fleet was never simulated."""
    spec = load_sweep(_sweep(tmp_path, BASE + AUTOSCALING))
    base = spec.load_base()
    pool = _CannedFleets()
    h100 = CandidatePlan(params={"hardware.name": "h100_sxm"}, status="ok", capacity_rate_per_replica=150.0,
                         replicas=1, gpus_per_replica=1, cost_per_hour_usd=2.99)
    h200 = CandidatePlan(params={"hardware.name": "h200_sxm"}, status="ok", capacity_rate_per_replica=75.0,
                         replicas=2, gpus_per_replica=1, cost_per_hour_usd=5.0)
    planner = CapacityPlanner(spec, base, cast(ShardPool, pool))
    plans, chosen, verified, notes = planner._verify_cheapest((h100, h200), 0)
    assert pool.fleets == [("h100_sxm", 1), ("h100_sxm", 2), ("h200_sxm", 2)]
    assert chosen == 1 and verified is not None
    assert [p.fixed_cost_per_hour_usd() for p in plans] == [pytest.approx(5.98), 5.0]
    assert [p.cost_per_hour_usd for p in plans] == [4.0, 3.0]  # each the provisioned GPU-hours'
    assert any("candidate 1 is now cheaper" in n for n in notes)
    report = CapacityReport(spec=spec, candidates=plans, chosen=chosen)
    assert report.cheapest("aggregated") == 1
    assert [r["cost_per_hour_per_replica_usd"] for r in report.rows()] == [pytest.approx(2.99), 2.5]


def test_a_verified_fleet_too_short_for_the_autoscaler_says_so(tmp_path: Path) -> None:
    """The verified fleet of 2 starts at initial_replicas = 1 and its run (120 requests at 150/s,
    0.8 s) ends long before a replica the autoscaler starts takes traffic (2 + 0 + 60 s): the notes
    say so, rather than blaming only routing imbalance, which more replicas would help."""
    spec = load_sweep(_sweep(tmp_path, BASE + AUTOSCALING.replace("startup_delay_s = 5.0", "startup_delay_s = 60.0")))
    base = spec.load_base()
    l4 = CandidatePlan(params={"hardware.name": "l4"}, status="ok", capacity_rate_per_replica=75.0,
                       replicas=2, gpus_per_replica=1, cost_per_hour_usd=1.6)
    planner = CapacityPlanner(spec, base, cast(ShardPool, _CannedFleets()))
    _, chosen, _, notes = planner._verify_cheapest((l4,), 0)
    assert chosen == 0
    assert notes[0].startswith("the autoscaled fleet starts with initial_replicas=1, and its run (~0.8 s: 120 "
                               "requests at 150/s) ends before a replica the autoscaler starts can take traffic "
                               "(interval_s + upscale_delay_s + startup_delay_s = 62 s)")
    assert notes[1] == "2 replicas miss the SLOs as a fleet (routing imbalance, or the autoscaler's ramp); trying 3"
    assert len(notes) == 2 and not planner._ramp_note(1)  # a fleet of 1 starts whole: no ramp
