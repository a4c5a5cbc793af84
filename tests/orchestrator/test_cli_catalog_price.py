"""`list models` says what can be simulated; a hardware TOML without a price: `check` and `run` agree."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import REPO

from orchestrator.cli import main
from orchestrator.commands_sim import simulable
from orchestrator.sweep.capacity import CandidatePlan
from orchestrator.sweep.metrics import trial_metrics
from sim.api import missing_price_message, simulate
from sim.specs.scenario import load_scenario_file


def test_list_models_marks_what_can_be_simulated_with_the_loader_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "simulable"
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows["meta-llama/Llama-3.1-8B"].rstrip().endswith("yes")
    assert rows["Qwen/Qwen3.5-397B-A17B"].rstrip().endswith("yes")  # Gated DeltaNet hybrid
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 10}')
    assert simulable(str(config)).startswith("no: architecture not supported")


def _unpriced(tmp_path: Path, price: str = "") -> Path:
    hw = (REPO / "sim" / "data" / "hardware" / "h100_sxm.toml").read_text().replace('name = "h100_sxm"',
                                                                                     'name = "my_gpu"')
    (tmp_path / "my_gpu.toml").write_text(hw)
    path = tmp_path / "s.toml"
    path.write_text(f'[hardware]\nname = "my_gpu.toml"\n{price}\n[model]\nname = "meta-llama/Llama-3.1-8B"\n'
                    '[engine]\nmax_model_len = 4096\n[workload]\nnum_prompts = 6\nrandom_input_len = 64\n'
                    'random_output_len = 4\n')
    return path


def test_check_and_run_agree_on_a_hardware_file_without_a_price(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _unpriced(tmp_path)
    assert main(["check", str(path)]) == 0
    check_err = capsys.readouterr().err
    assert main(["run", str(path), "--json"]) == 0
    out, run_err = capsys.readouterr()
    summary = json.loads(out)["summary"]  # stdout stays pure JSON
    assert summary["price_per_gpu_hour_usd"] is None and summary["cost_per_hour_usd"] is None
    assert summary["cost_per_million_output_tokens_usd"] is None and summary["num_completed"] == 6
    for err in (check_err, run_err):
        assert f"warning: {path}: no GPU price for hardware 'my_gpu'" in err
        assert "hardware.price_per_gpu_hour_usd" in err
    assert main(["check", str(tmp_path / "my_gpu.toml")]) == 0
    assert "hardware.price_per_gpu_hour_usd" in capsys.readouterr().err


def test_a_scenario_price_makes_the_warning_go_away_and_missing_cost_is_nan_in_sweeps(tmp_path: Path) -> None:
    priced = load_scenario_file(_unpriced(tmp_path, "price_per_gpu_hour_usd = 2.0"))
    assert missing_price_message(priced) is None
    assert simulate(priced).summary.cost_per_hour_usd == 2.0
    unpriced = simulate(load_scenario_file(_unpriced(tmp_path))).summary
    metrics = trial_metrics(unpriced)
    assert math.isnan(metrics["cost_per_hour_usd"]) and math.isnan(metrics["cost_per_million_output_tokens_usd"])
    assert metrics["num_gpus"] == 1.0


def test_capacity_rows_name_replica_and_fleet_quantities() -> None:
    from orchestrator.sweep.capacity import CapacityReport
    from orchestrator.sweep.parse import load_sweep

    spec = load_sweep(REPO / "sweeps" / "llama3_70b-capacity.toml")
    plan = CandidatePlan(params={"hardware.name": "h100_sxm"}, status="ok", capacity_rate_per_replica=2.0,
                         replicas=3, gpus_per_replica=4, cost_per_hour_usd=36.0)
    (row,) = CapacityReport(spec=spec, candidates=(plan,), chosen=0).rows()
    assert (row["gpus_per_replica"], row["fleet_num_gpus"]) == (4, 12)
    assert (row["cost_per_hour_per_replica_usd"], row["fleet_cost_per_hour_usd"]) == (12.0, 36.0)
    assert (row["num_gpus"], row["cost_per_hour_usd"]) == (12, 36.0)  # the older names stay
