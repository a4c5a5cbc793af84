"""Planning disaggregated fleets: the `serving` switch, pool keys in `[space]`, per-pool launch lines,
and a real sweep on local Ray comparing aggregated and disaggregated candidates."""

from __future__ import annotations

import json
import math
import shlex
import textwrap
from pathlib import Path

import pytest
import ray
from conftest import REPO

from orchestrator.cli import main
from orchestrator.plot_style import config_label
from orchestrator.sweep.capacity import CandidatePlan, dynamo_command
from orchestrator.sweep.evaluate import build_scenario
from orchestrator.sweep.keys import key_type
from orchestrator.sweep.launch import launch_commands
from orchestrator.sweep.metrics import METRIC_NAMES
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.serving import scale_workers, scenario_overrides
from orchestrator.sweep.session import calibration_files
from sim.calibration.select import shipped_calibration
from sim.errors import ConfigError

SCENARIO = REPO / "scenarios" / "llama3_8b-h100.toml"

SWEEP = f"""
[study]
name = "disagg-unit"
sampler = "grid"
n_trials = 8
objectives = [{{ metric = "num_gpus", direction = "minimize" }}]

[slo]
ttft_p90_s = 1e-9     # no trial meets it, so the report lists every trial as a closest miss

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 8, "workload.random_input_len" = 64, "workload.random_output_len" = 4 }}

[space]
"serving" = {{ choices = ["aggregated", "disaggregated"] }}
"disaggregation.prefill.num_workers" = {{ choices = [2], when = {{ serving = "disaggregated" }} }}
"disaggregation.decode.engine.max_num_seqs" = {{ choices = [32], when = {{ serving = "disaggregated" }} }}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_pool_keys_have_their_fields_types() -> None:
    assert key_type("disaggregation.prefill.num_workers") is not None
    engine = key_type("disaggregation.decode.engine.max_num_seqs")
    assert engine == key_type("engine.max_num_seqs")
    assert key_type("serving") is not None and key_type("serving").literals == ("aggregated", "disaggregated")  # type: ignore[union-attr]
    assert key_type("disaggregation.decode.engine.max_num_seqz") is None
    assert key_type("disaggregation.middle.num_workers") is None


@pytest.mark.parametrize(("edit", "key", "rule"), [
    (('"disaggregation.decode.engine.max_num_seqs"', '"disaggregation.decode.engine.max_num_seqz"'),
     'space."disaggregation.decode.engine.max_num_seqz"', "did you mean"),
    (('choices = [2], when', 'choices = [0], when'),
     'space."disaggregation.prefill.num_workers".choices[0]', "must be in [1, 4,096]"),
    (('max_num_seqs" = { choices = [32]', 'block_size" = { choices = [48]'),
     'space."disaggregation.decode.engine.block_size".choices[0]', "block_size"),
    (('["aggregated", "disaggregated"]', '["aggregated", "hybrid"]'),
     'space."serving".choices[1]', "aggregated, disaggregated"),
    (('"disaggregation.prefill.num_workers" = { choices = [2]', '"disaggregation.prefill.hardware" = { choices = ["h100_sxmm"]'),
     'space."disaggregation.prefill.hardware".choices[0]', "h100_sxmm"),
])
def test_bad_pool_key_or_value_names_it(edit: tuple[str, str], key: str, rule: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert edit[0] in SWEEP
    path = write(tmp_path, SWEEP.replace(*edit))
    with pytest.raises(ConfigError) as exc:
        load_sweep(path)
    assert exc.value.key == key and rule in str(exc.value)
    assert main(["check", str(path)]) == 2
    assert key in capsys.readouterr().err


def test_serving_switch_resolves_to_scenario_overrides(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, SWEEP))
    base = spec.load_base()
    sections = base.sections()
    # aggregated: pool keys dropped; disaggregated: the missing decode pool gets 1 worker
    assert scenario_overrides({"serving": "aggregated", "disaggregation.prefill.num_workers": 2}, sections) == {}
    assert scenario_overrides({"serving": "disaggregated", "disaggregation.prefill.num_workers": 2}, sections) == {
        "disaggregation.prefill.num_workers": 2, "disaggregation.decode.num_workers": 1}
    agg = build_scenario(base, {"serving": "aggregated"})
    dis = build_scenario(base, {"serving": "disaggregated", "disaggregation.prefill.num_workers": 2})
    assert agg.disaggregation is None and dis.disaggregation is not None
    assert (dis.disaggregation.prefill.num_workers, dis.disaggregation.decode.num_workers) == (2, 1)
    # an aggregated trial over a disaggregated base removes the base's pools
    disagg_base = build_scenario(base, {"disaggregation.prefill.num_workers": 1})
    assert build_scenario(disagg_base, {"serving": "aggregated"}).disaggregation is None
    # capacity replicas of a disaggregated candidate scale both pools' workers
    assert scale_workers({"disaggregation.prefill.num_workers": 2}, sections, 3) == {
        "disaggregation.prefill.num_workers": 6, "disaggregation.decode.num_workers": 3}
    assert config_label({"serving": "disaggregated", "disaggregation.prefill.num_workers": 2,
                         "disaggregation.decode.engine.tensor_parallel_size": 8}) == "disagg 2P D:tp8"


@pytest.mark.parametrize(("space", "gpus"), [
    # both pools on swept GPUs: the base's H100 runs no trial
    ('"disaggregation.prefill.hardware" = { choices = ["a100_sxm", "l40s"] }\n'
     '"disaggregation.decode.hardware" = { choices = ["h200_sxm"] }', {"a100_sxm", "l40s", "h200_sxm"}),
    # aggregated trials run on [hardware]; a disaggregated trial's prefill pool on its own GPU
    ('"serving" = { choices = ["aggregated", "disaggregated"] }\n'
     '"disaggregation.prefill.hardware" = { choices = ["a100_sxm"], when = { serving = "disaggregated" } }\n'
     '"disaggregation.decode.engine.max_num_seqs" = { choices = [32], when = { serving = "disaggregated" } }',
     {"h100_sxm", "a100_sxm"}),
    # a pool without its own GPU runs on the swept [hardware]
    ('"hardware.name" = { choices = ["h200_sxm"] }\n'
     '"disaggregation.decode.hardware" = { choices = ["l40s"] }', {"h200_sxm", "l40s"}),
])
def test_parent_run_calibrations_are_the_gpus_each_pool_runs_on(space: str, gpus: set[str], tmp_path: Path) -> None:
    text = SWEEP.replace(SWEEP[SWEEP.index("[space]"):], "[space]\n" + space + "\n")
    spec = load_sweep(write(tmp_path, text))
    base = spec.load_base()
    assert all(shipped_calibration(g) is not None for g in gpus)  # so each GPU has its own file
    assert {f.name for f in calibration_files(base, spec)} == {f"{g}.json" for g in gpus}


def test_disaggregated_launch_lines_one_per_pool(tmp_path: Path) -> None:
    base = load_sweep(write(tmp_path, SWEEP)).load_base()
    scenario = build_scenario(base, {"serving": "disaggregated", "disaggregation.prefill.num_workers": 2,
                                     "disaggregation.decode.engine.max_num_seqs": 32})
    cmds = launch_commands(scenario)
    nixl = """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
    assert cmds["vllm_serve_prefill"].startswith("vllm serve ") and nixl in cmds["vllm_serve_prefill"]
    assert "--max-num-seqs 32" in cmds["vllm_serve_decode"] and "--max-num-seqs" not in cmds["vllm_serve_prefill"]
    assert "--disaggregation-mode prefill" in cmds["sglang_launch_prefill"]
    assert "--disaggregation-mode decode" in cmds["sglang_launch_decode"]
    assert cmds["vllm_serve"].splitlines()[0] == "# prefill pool: 2 workers x 1 GPUs (h100_sxm)"
    agg = launch_commands(build_scenario(base, {"serving": "aggregated"}))
    assert set(agg) == {"vllm_serve", "sglang_launch"} and "kv-transfer" not in agg["vllm_serve"]
    assert "output_tokens_per_s_per_user" in METRIC_NAMES


def test_dynamo_launch_lines_are_the_pool_engines_under_dynamo_workers(tmp_path: Path) -> None:
    base = load_sweep(write(tmp_path, SWEEP)).load_base()
    scenario = build_scenario(base, {"serving": "disaggregated", "disaggregation.prefill.num_workers": 2,
                                     "disaggregation.decode.engine.max_num_seqs": 32})
    cmds = launch_commands(scenario)
    for pool in ("prefill", "decode"):
        vllm = shlex.split(cmds[f"vllm_serve_{pool}"])
        dyn = shlex.split(cmds[f"dynamo_vllm_{pool}"])
        # `vllm serve MODEL FLAGS` -> `python -m dynamo.vllm --model MODEL FLAGS --disaggregation-mode POOL`,
        # the kv-transfer-config kept once
        assert dyn[:5] == ["python", "-m", "dynamo.vllm", "--model", vllm[2]]
        assert vllm[-2] == "--kv-transfer-config"
        assert dyn[5:] == [*vllm[3:-2], "--disaggregation-mode", pool, *vllm[-2:]]
        sgl = shlex.split(cmds[f"sglang_launch_{pool}"])
        dsg = shlex.split(cmds[f"dynamo_sglang_{pool}"])
        assert dsg[:3] == ["python", "-m", "dynamo.sglang"] and dsg[3:] == sgl[3:]
        assert sgl[-4:] == ["--disaggregation-mode", pool, "--disaggregation-transfer-backend", "nixl"]
    assert "--max-num-seqs 32" in cmds["dynamo_vllm_decode"]
    assert "--is-prefill-worker" not in cmds["dynamo_vllm"]  # deprecated in Dynamo
    assert cmds["dynamo_vllm"].splitlines() == [
        "# NVIDIA Dynamo frontend", "python -m dynamo.frontend",
        "# prefill pool: 2 workers x 1 GPUs (h100_sxm)", cmds["dynamo_vllm_prefill"],
        "# decode pool: 1 worker x 1 GPUs (h100_sxm)", cmds["dynamo_vllm_decode"]]
    assert not any(k.startswith("dynamo") for k in launch_commands(build_scenario(base, {"serving": "aggregated"})))
    # A capacity plan's fleet of 3 xPyD units: both pools' workers times 3.
    fleet = dynamo_command(base, CandidatePlan(params={"serving": "disaggregated",
                                                       "disaggregation.prefill.num_workers": 2},
                                               status="ok", replicas=3))
    assert "# prefill pool: 6 workers x 1 GPUs" in fleet and "# decode pool: 3 workers x 1 GPUs" in fleet
    assert dynamo_command(base, CandidatePlan(params={"serving": "aggregated"}, status="ok", replicas=3)) == ""


@pytest.mark.ray
def test_sweep_compares_aggregated_and_disaggregated(ray_runtime: None, tracking_uri: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    address = str(ray.get_runtime_context().gcs_address)
    path = write(tmp_path, SWEEP)
    assert main(["sweep", str(path), "--ray-address", address, "--actors", "1", "--study-dir", str(tmp_path / "s"),
                 "--tracking-uri", tracking_uri,
                 "--json", "--no-trial-plots"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"] == {"ok": 2}
    rows = {t["params"]["serving"]: t for t in out["closest_misses"]}
    assert set(rows) == {"aggregated", "disaggregated"}
    agg, dis = rows["aggregated"], rows["disaggregated"]
    assert agg["metrics"]["num_gpus"] == 1 and dis["metrics"]["num_gpus"] == 3  # 2 prefill + 1 decode worker
    assert dis["metrics"]["output_tokens_per_s_per_user"] > 0
    assert "vllm_serve_prefill" in dis and "vllm_serve_decode" in dis and "vllm_serve_prefill" not in agg
    assert "--set serving" not in dis["kernelsight_run"]
    # the kernelsight run line reproduces the disaggregated trial
    assert main([*shlex.split(dis["kernelsight_run"])[1:], "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["summary"]["num_gpus"] == 3
    assert run["summary"]["ttft_p90_s"] == pytest.approx(dis["metrics"]["ttft_p90_s"])
    # the parent run's Pareto plot is drawn with both kinds of points
    pngs = list((tmp_path / "s").rglob("pareto_front.png"))
    assert pngs and pngs[0].stat().st_size > 0


CAPACITY = f"""
[study]
name = "disagg-capacity"

[capacity]
target_request_rate = 40.0
rate_rel_tol = 0.5

[slo]
ttft_p90_s = 0.5
tpot_p90_s = 0.05

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 16, "workload.random_input_len" = 64, "workload.random_output_len" = 4 }}

[space]
"serving" = {{ choices = ["aggregated", "disaggregated"] }}
"disaggregation.prefill.num_workers" = {{ choices = [1], when = {{ serving = "disaggregated" }} }}
"""


@pytest.mark.ray
def test_capacity_plan_compares_aggregated_and_disaggregated_fleets(ray_runtime: None, tracking_uri: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # One aggregated replica (1 GPU) against one 1P1D unit (2 GPUs) of Llama-3.1-8B on H100 for
    # 40 requests/s of 64-in/4-out traffic: both are planned by bisection and priced as fleets.
    address = str(ray.get_runtime_context().gcs_address)
    path = tmp_path / "cap.toml"
    path.write_text(textwrap.dedent(CAPACITY))
    study = tmp_path / "s"
    assert main(["sweep", str(path), "--ray-address", address, "--actors", "1", "--study-dir", str(study),
                 "--tracking-uri", tracking_uri]) == 0
    text = capsys.readouterr().out
    # The table names both kinds and the cheapest fleet of each.
    assert "cheapest aggregated: candidate 0" in text and "cheapest disaggregated: candidate 1" in text
    out = json.loads(next(study.rglob("capacity_plan.json")).read_text())
    rows = out["candidates"]
    assert [r["serving"] for r in rows] == ["aggregated", "disaggregated"]
    agg, dis = rows
    assert agg["status"] == dis["status"] == "ok", rows
    assert agg["gpus_per_replica"] == 1 and dis["gpus_per_replica"] == 2
    for r in rows:
        assert r["replicas"] == max(1, math.ceil(40.0 / r["capacity_rate_per_replica"] - 1e-9))
        assert r["fleet_num_gpus"] == r["replicas"] * r["gpus_per_replica"]
        assert r["ttft_p90_s"] <= 0.5 and r["tpot_p90_s"] <= 0.05
        assert r["cost_per_million_output_tokens_usd"] > 0 and r["output_tokens_per_s_per_user"] > 0
    assert out["cheapest_by_serving"] == {"aggregated": 0, "disaggregated": 1}
    chosen = min((0, 1), key=lambda i: (rows[i]["fleet_cost_per_hour_usd"], rows[i]["fleet_num_gpus"]))
    assert out["chosen"] == rows[chosen]
    # The chosen fleet's launch lines: a disaggregated choice gets both pools' vllm serve lines
    # with the fleet's worker counts, and Dynamo's.
    if chosen == 1:
        assert "# prefill pool: " in out["vllm_serve"] and out["dynamo_launch"].startswith("# NVIDIA Dynamo")
        assert f"# decode pool: {dis['replicas']} worker" in out["dynamo_launch"]
    else:
        assert out["vllm_serve"].startswith("vllm serve ") and out["dynamo_launch"] == ""
    # The plan's artifacts: the CSV with its serving column and the side-by-side Pareto plot.
    csv = next(study.rglob("capacity_plan.csv")).read_text()
    assert "serving" in csv.splitlines()[0] and "disaggregated" in csv
    assert next(study.rglob("capacity_pareto.png")).stat().st_size > 0
    assert out["vllm_serve"] in text
