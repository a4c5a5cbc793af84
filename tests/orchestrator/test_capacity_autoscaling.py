"""Capacity planning with an `[autoscaling]` base: fixed one-replica probes, an autoscaled verified
fleet, and the plan's cost from the GPU-hours it provisioned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO

from orchestrator.cli import main
from orchestrator.commands_run import hourly_replicas
from orchestrator.sweep.parse import load_sweep
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
