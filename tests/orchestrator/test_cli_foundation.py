"""The CLI contracts of the foundation: step, check, list, predict-kernels (roofline tier)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from orchestrator.cli import main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=REPO,
                          capture_output=True, text=True, check=False)


def test_step_json_has_kernels_and_totals(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["step", str(REPO / "scenarios/llama3_70b-h100-tp4.toml"), "--prefill", "2048",
                 "--decode", "64x1024", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["worst_provenance"] != "roofline"  # the shipped H100 calibration prices it
    assert out["step_time_s"] == pytest.approx(out["gpu_s"] + out["comm_s"])
    assert sum(out["seconds_by_kind"].values()) == pytest.approx(out["step_time_s"])
    names = {k["name"] for k in out["kernels"]}
    assert {"qkv_proj", "attn_prefill", "attn_decode", "attn_all_reduce", "lm_head", "sampler"} <= names


def test_step_table_runs_as_a_module() -> None:
    proc = run_cli("step", "scenarios/llama3_8b-h100.toml", "--decode", "8x512", "--set", "perf.tier=roofline")
    assert proc.returncode == 0, proc.stderr
    assert "attn_decode" in proc.stdout and "worst provenance roofline" in proc.stdout


def test_perf_tier_selects_the_kernel_model(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(REPO / "scenarios/llama3_8b-h100.toml")
    totals = {}
    for tier in ("roofline", "cross-generation", "target-measured"):
        assert main(["step", scenario, "--decode", "32x1024", "--json", "--set", f"perf.tier={tier}"]) == 0
        out = json.loads(capsys.readouterr().out)
        totals[tier] = out["step_time_s"]
        gemm_prov = {k["provenance"] for k in out["kernels"] if k["kind"] == "gemm"}
        main_label = {"roofline": "roofline", "target-measured": "calibrated"}.get(tier, "transferred")
        # Shapes outside the fitted feature range are marked extrapolated.
        assert main_label in gemm_prov and gemm_prov <= {main_label, "extrapolated"}, (tier, gemm_prov)
    # A learned efficiency is <= 1, so both fitted tiers are slower than the roofline.
    assert totals["cross-generation"] > totals["roofline"] and totals["target-measured"] > totals["roofline"]


def test_calibration_needs_a_tier_that_reads_it() -> None:
    proc = run_cli("check", "scenarios/llama3_8b-h100.toml")
    assert proc.returncode == 0
    proc = run_cli("step", "scenarios/llama3_8b-h100.toml", "--decode", "1x8", "--set", "perf.tier=roofline",
                   "--set", "perf.calibration=x.json")
    assert proc.returncode == 2 and "perf.calibration" in proc.stderr


def test_every_shipped_toml_passes_check() -> None:
    files = sorted(str(p) for p in [*REPO.glob("scenarios/*.toml"), *REPO.glob("sim/data/hardware/*.toml")])
    proc = run_cli("check", *files)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("ok ") == len(files)


def test_bad_scenario_exits_2_naming_the_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[hardware]\nname = "h100_sxm"\n[model]\nname = "meta-llama/Llama-3.1-8B"\n[engine]\nmax_num_seq = 3\n')
    proc = run_cli("check", str(bad))
    assert proc.returncode == 2
    assert "engine.max_num_seq" in proc.stderr and "unknown key" in proc.stderr


def test_model_that_does_not_fit_is_rejected(tmp_path: Path) -> None:
    bad = tmp_path / "big.toml"
    bad.write_text('[hardware]\nname = "l4"\n[model]\nname = "meta-llama/Llama-3.1-70B"\n')
    assert main(["check", str(bad)]) == 2


def test_check_set_applies_overrides_to_scenarios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ok = tmp_path / "ok.toml"
    ok.write_text('[hardware]\nname = "h100_sxm"\n[model]\nname = "meta-llama/Llama-3.1-8B"\n')
    assert main(["check", str(ok)]) == 0
    # The override, not the file, makes it infeasible: 70B in BF16 does not fit one L4.
    assert main(["check", "--set", "hardware.name=l4", "--set", "model.name=meta-llama/Llama-3.1-70B", str(ok)]) == 2
    big = tmp_path / "big.toml"
    big.write_text('[hardware]\nname = "h100_sxm"\n[model]\nname = "meta-llama/Llama-3.1-70B"\n')
    assert main(["check", str(big)]) == 2
    capsys.readouterr()
    assert main(["check", "--set", "engine.tensor_parallel_size=4", str(big)]) == 0  # fits on four
    out = capsys.readouterr().out
    assert "ok " in out and "TTFT/E2E include 20 ms of API-server latency (vllm profile)" in out
    assert main(["check", "--set", "engine.api_server_latency_s=0.1", str(ok)]) == 0
    assert "include 100 ms of API-server latency ([engine])" in capsys.readouterr().out
    assert main(["check", "--set", "engine.max_num_seq=3", str(ok)]) == 2
    assert "engine.max_num_seq" in capsys.readouterr().err


def test_check_names_a_hybrid_models_state_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "qwen35.toml"
    path.write_text('[hardware]\nname = "h200_sxm"\n[model]\nname = "Qwen/Qwen3.5-397B-A17B"\n'
                    '[engine]\ntensor_parallel_size = 8\nquantization = "fp8_block"\nmax_model_len = 8192\n')
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "linear-attention states for " in out and "MiB each" in out
    assert main(["check", "--set", "engine.mamba_full_memory_ratio=1e-9", str(path)]) == 2
    assert "engine.mamba_full_memory_ratio" in capsys.readouterr().err


def test_check_set_refuses_non_scenario_files(capsys: pytest.CaptureFixture[str]) -> None:
    hw = str(REPO / "sim/data/hardware/h100_sxm.toml")
    assert main(["check", hw]) == 0
    assert main(["check", "--set", "engine.max_num_seqs=3", hw]) == 2
    assert "scenario files only" in capsys.readouterr().err


def test_list_hardware_and_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "hardware"]) == 0
    out = capsys.readouterr().out
    assert "rtx_4090" in out
    lines = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert lines["l40s"].rstrip().endswith("8 per node, pcie 32GB/s, P2P in groups of 2")
    assert lines["h100_sxm"].rstrip().endswith("8 per node, nvlink 450GB/s")
    assert lines["gb200"].rstrip().endswith("72 per NVLink domain, nvlink 900GB/s")
    assert main(["list", "models"]) == 0
    assert "meta-llama/Llama-3.1-70B" in capsys.readouterr().out


def _write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    cols = ["kernel", "dtype", "m", "n", "k", "batch_size", "seq_len", "kv_len", "num_heads", "num_kv_heads",
            "head_dim", "num_gpus", "message_bytes"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def test_predict_kernels_roofline_contract(tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    _write_rows(rows, [
        {"kernel": "gemm", "dtype": "bfloat16", "m": "4096", "n": "4096", "k": "4096"},
        {"kernel": "context_attention", "batch_size": "1", "seq_len": "1024", "num_heads": "32", "num_kv_heads": "8", "head_dim": "128"},
        {"kernel": "generation_attention", "batch_size": "8", "kv_len": "1000", "num_heads": "32", "num_kv_heads": "8", "head_dim": "128"},
        {"kernel": "nccl_all_reduce", "num_gpus": "8", "message_bytes": "1048576"},
    ])
    out = tmp_path / "pred.csv"
    assert main(["predict-kernels", "--hardware", "h100_sxm", "--tier", "roofline", "--in", str(rows), "--out", str(out)]) == 0
    with out.open() as f:
        pred = list(csv.DictReader(f))
    assert len(pred) == 4
    assert float(pred[0]["predicted_latency_ms"]) == pytest.approx(2 * 4096**3 / 989e12 * 1e3, rel=1e-4)
    assert {p["provenance"] for p in pred} == {"roofline"}
    assert "variant" in pred[0]


@pytest.mark.parametrize("fast_reader", [True, False])
def test_predict_kernels_copies_columns_it_does_not_read(tmp_path: Path, fast_reader: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """An id or the measured latency of a data table comes back beside the prediction (they were
    dropped, so joining the output to the input needed the row order), after the table-keyed
    columns and before the interval's ends, on both readers."""
    import orchestrator.commands_kernels as ck

    if not fast_reader:
        monkeypatch.setattr(ck, "_read_fast", lambda src, header: None)
    src = tmp_path / "rows.csv"
    src.write_text("row_id,kernel,dtype,m,n,k,latency_ms,note,predicted_latency_ms\n"
                   '7,gemm,bfloat16,128,4096,4096,0.05,"a, b",9\n9,gemm,bfloat16,1,8192,8192,0.07,x,9\n')
    out = tmp_path / "pred.csv"
    assert main(["predict-kernels", "--hardware", "h100_sxm", "--tier", "roofline", "--in", str(src),
                 "--out", str(out)]) == 0
    with out.open() as f:
        header = next(csv.reader(f))
        f.seek(0)
        pred = list(csv.DictReader(f))
    assert header[-5:] == ["row_id", "latency_ms", "note", "predicted_latency_lo_ms", "predicted_latency_hi_ms"]
    assert header.count("predicted_latency_ms") == 1  # an input column named as an output is recomputed
    assert [(p["row_id"], p["latency_ms"], p["note"]) for p in pred] == [("7", "0.05", "a, b"), ("9", "0.07", "x")]
    assert all(p["predicted_latency_ms"] != "9" for p in pred)


def test_predict_kernels_reads_a_csv_with_a_byte_order_mark(tmp_path: Path) -> None:
    """Excel writes UTF-8 CSVs with a BOM; the header's first name was read as "\ufeffkernel" and the
    file refused with "kernel=None: column is required". Both readers (the row-by-row one on a bad
    cell) take it as the plain file."""
    text = "kernel,dtype,m,n,k\ngemm,bfloat16,1,2,3\n"
    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(text, encoding="utf-8")
    bom.write_text(text, encoding="utf-8-sig")
    outs = []
    for src in (plain, bom):
        out = tmp_path / f"pred-{src.stem}.csv"
        assert main(["predict-kernels", "--hardware", "h100_sxm", "--tier", "roofline", "--in", str(src),
                     "--out", str(out)]) == 0
        outs.append(out.read_text())
    assert outs[0] == outs[1]
    bad = tmp_path / "bad.csv"
    bad.write_text("kernel,dtype,m,n,k\ngemm,bfloat16,x,2,3\n", encoding="utf-8-sig")
    proc = run_cli("predict-kernels", "--hardware", "h100_sxm", "--tier", "roofline", "--in", str(bad),
                   "--out", str(tmp_path / "o.csv"))
    assert proc.returncode == 2 and "row 1" in proc.stderr and "m=" in proc.stderr


@pytest.mark.parametrize("verb", [["predict-kernels", "--tier", "roofline", "--in", "x.csv", "--out", "y.csv"],
                                  ["microbench", "plan"], ["calibrate", "--microbench", ".", "--out", "c.json"]])
def test_an_unknown_hardware_flag_is_named_as_the_flag(verb: list[str]) -> None:
    """The error named the scenario key `hardware.name` with no source, not the `--hardware` flag."""
    proc = run_cli(*verb, "--hardware", "h100")
    assert proc.returncode == 2
    assert "--hardware='h100': unknown hardware; did you mean 'h100_sxm'" in proc.stderr, proc.stderr


def test_predict_kernels_bad_row_names_row_and_column(tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    _write_rows(rows, [{"kernel": "gemm", "dtype": "bfloat16", "m": "1", "n": "2", "k": "3"},
                       {"kernel": "gemm", "dtype": "bfloat16", "m": "x", "n": "2", "k": "3"}])
    proc = run_cli("predict-kernels", "--hardware", "l40s", "--tier", "roofline", "--in", str(rows), "--out", str(tmp_path / "o.csv"))
    assert proc.returncode == 2
    assert "row 2" in proc.stderr and "m=" in proc.stderr


def test_step_names_the_profiles_kernel_sources(capsys: pytest.CaptureFixture[str]) -> None:
    scenario = str(REPO / "scenarios/deepseek_r1-h200-tp8.toml")
    assert main(["step", scenario, "--decode", "4x1024", "--set", "engine.backend=sglang", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kernel_sources"] == {"mla_prefill": "trtllm", "mla_decode": "trtllm"}
    assert main(["step", scenario, "--decode", "4x1024", "--set", "engine.backend=trtllm"]) == 0
    assert "kernel sources" not in capsys.readouterr().out
    assert main(["step", scenario, "--decode", "4x1024", "--set", "engine.backend=sglang"]) == 0
    assert "mla_prefill=trtllm, mla_decode=trtllm" in capsys.readouterr().out


def test_step_on_a_disaggregated_scenario_prices_the_pool_that_runs_it(capsys: pytest.CaptureFixture[str]) -> None:
    disagg = str(REPO / "scenarios/deepseek_r1-h200-disagg-4p8d.toml")

    def step_s(path: str, *args: str) -> tuple[float, str | None]:
        assert main(["step", path, *args, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        return out["step_time_s"], out.get("pool")

    # A decode batch runs on the decode pool (DP8 + EP8 there, as in the aggregated DP8 EP8 scenario);
    # the top-level [engine] of a disaggregated file runs nothing.
    decode, pool = step_s(disagg, "--decode", "64x1000")
    assert pool == "decode"
    assert decode == pytest.approx(step_s(str(REPO / "scenarios/deepseek_r1-h200-dp8ep8.toml"), "--decode", "64x1000")[0])
    prefill, pool = step_s(disagg, "--prefill", "2048")
    assert pool == "prefill"
    assert step_s(disagg, "--prefill", "2048", "--pool", "decode") != (prefill, "prefill")
    assert main(["step", str(REPO / "scenarios/llama3_8b-h100.toml"), "--decode", "4x100", "--pool", "decode"]) == 2
    assert "applies to disaggregated scenarios only" in capsys.readouterr().err


def test_check_warns_where_vllm_would_refuse_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM refuses an engine whose KV cache cannot hold one max_model_len request, whatever the
    traffic; the simulation still runs the workload's (shorter) requests, and check and run say so."""
    path = str(REPO / "scenarios/llama3_8b-h100.toml")
    tight = ["--set", "engine.max_model_len=131072", "--set", "engine.gpu_memory_utilization=0.3"]
    assert main(["check", path, *tight]) == 0
    err = capsys.readouterr().err
    assert "warning: vLLM would refuse to start this engine" in err and "max_model_len=131072" in err
    assert main(["check", path]) == 0
    assert "vLLM would refuse" not in capsys.readouterr().err
