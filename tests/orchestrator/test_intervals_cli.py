"""Intervals at the command line: predict-kernels lo/hi columns, run --intervals (seeded, identical
on repeat), and the sweep's slo_confidence (a trial whose interval's upper end misses an [slo]
bound is rejected although its point meets it)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import REPO
from mlflow import MlflowClient
from test_sweep_ray import child_runs

from orchestrator.cli import main
from orchestrator.sweep.evaluate import TrialEvaluator
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.results import TrialInput
from sim.api import simulate
from sim.calibration.e2e_widening import shipped_widening
from sim.errors import ConfigError
from sim.uncertainty import run_intervals

SCENARIO = REPO / "scenarios" / "llama3_8b-h100.toml"
SMALL = ["--set", "workload.num_prompts=12", "--set", "workload.random_input_len=256",
         "--set", "workload.random_output_len=8"]


def test_predict_kernels_writes_interval_columns(tmp_path: Path) -> None:
    rows = tmp_path / "rows.csv"
    rows.write_text("kernel,dtype,m,n,k,num_gpus,message_bytes\n"
                    "gemm,bfloat16,4096,4096,4096,,\n"
                    "gemm,bfloat16,16,4096,14336,,\n"
                    "nccl_all_reduce,bfloat16,,,,8,1048576\n")
    out = tmp_path / "pred.csv"
    for tier in ("cross-generation", "target-measured"):
        assert main(["predict-kernels", "--hardware", "h100_sxm", "--tier", tier, "--in", str(rows),
                     "--out", str(out)]) == 0
        with out.open() as f:
            pred = list(csv.DictReader(f))
        assert list(pred[0])[-2:] == ["predicted_latency_lo_ms", "predicted_latency_hi_ms"]
        for p in pred:
            lo, t, hi = (float(p[c]) for c in ("predicted_latency_lo_ms", "predicted_latency_ms",
                                               "predicted_latency_hi_ms"))
            assert 0 < lo < t < hi, p


def test_predict_kernels_interval_follows_the_architecture_class(tmp_path: Path) -> None:
    """A GPU whose SM version no dev GPU has (b200_sxm) takes the new-architecture intervals, wider
    than those of a seen architecture (h100_sxm) for the same kernel."""
    rows = tmp_path / "rows.csv"
    rows.write_text("kernel,dtype,m,n,k\ngemm,bfloat16,4096,4096,4096\n")
    width = {}
    for hw in ("h100_sxm", "b200_sxm"):
        out = tmp_path / f"{hw}.csv"
        assert main(["predict-kernels", "--hardware", hw, "--tier", "cross-generation", "--in", str(rows),
                     "--out", str(out)]) == 0
        with out.open() as f:
            (p,) = list(csv.DictReader(f))
        width[hw] = (float(p["predicted_latency_hi_ms"]) - float(p["predicted_latency_lo_ms"])) / float(
            p["predicted_latency_ms"])
    assert width["h100_sxm"] < width["b200_sxm"]


def test_a_target_measured_prediction_the_calibration_does_not_correct_takes_cross_generation_intervals(
        tmp_path: Path) -> None:
    """h200_sxm's calibration has no pointwise correction (no pointwise tables for it): its
    target-measured norm prediction is the cross-generation one and gets that tier's interval, while
    a corrected GEMM gets the narrower target-measured one; `run --intervals` draws the same way."""
    import numpy as np

    from sim.calibration.intervals import shipped_intervals
    from sim.uncertainty import draw_log_factors

    rows = tmp_path / "rows.csv"
    rows.write_text("kernel,dtype,m,n,k,variant,backend\nnorm,bfloat16,1024,8192,,rms_norm,vllm\n"
                    "gemm,bfloat16,4096,4096,4096,,vllm\n")
    ratio = {}
    for tier in ("cross-generation", "target-measured"):
        out = tmp_path / f"{tier}.csv"
        assert main(["predict-kernels", "--hardware", "h200_sxm", "--tier", tier, "--in", str(rows),
                     "--out", str(out)]) == 0
        with out.open() as f:
            ratio[tier] = [(float(p["predicted_latency_lo_ms"]) / float(p["predicted_latency_ms"]),
                            float(p["predicted_latency_hi_ms"]) / float(p["predicted_latency_ms"]))
                           for p in csv.DictReader(f)]
    assert ratio["target-measured"][0] == pytest.approx(ratio["cross-generation"][0])  # norm: uncorrected
    tm_gemm, cg_gemm = ratio["target-measured"][1], ratio["cross-generation"][1]
    assert tm_gemm[1] - tm_gemm[0] < cg_gemm[1] - cg_gemm[0]
    table = shipped_intervals()
    assert table is not None
    draws = draw_log_factors(table, "target-measured", 40, 3, 90, frozenset({"pointwise"}))
    cross = draw_log_factors(table, "cross-generation", 40, 3, 90)
    assert [d["pointwise"] for d in draws] == [d["pointwise"] for d in cross]
    assert np.ptp([d["gemm"] for d in draws]) < np.ptp([d["gemm"] for d in cross])


def _run_json(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, object]:
    assert main(["run", str(SCENARIO), *SMALL, "--json", *extra]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_run_intervals_fields_seeded_and_bracketing(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _run_json(capsys)
    first = _run_json(capsys, "--intervals", "3")
    again = _run_json(capsys, "--intervals", "3")
    other = _run_json(capsys, "--intervals", "3", "--interval-seed", "5")
    assert first == again  # same seed, same intervals
    summary = first["summary"]
    assert isinstance(summary, dict) and isinstance(plain["summary"], dict)
    assert "ttft_p90_s_lo" not in plain["summary"]
    assert {k: v for k, v in summary.items() if k in plain["summary"]} == plain["summary"]  # points unchanged
    widths = first["intervals"].pop("e2e_log_widths")  # type: ignore[union-attr]
    assert first["intervals"] == {"k": 3, "seed": 0, "tier": "target-measured", "nominal": 0.9}
    shipped = shipped_widening()
    assert widths == (shipped.log_widths.get("target-measured", {}) if shipped else {})
    narrow = _run_json(capsys, "--intervals", "3", "--kernel-only-intervals")
    assert narrow["intervals"]["e2e_log_widths"] == {}  # type: ignore[index]
    n_sum, w_sum = narrow["summary"], first["summary"]
    assert isinstance(n_sum, dict) and isinstance(w_sum, dict)
    for m in ("ttft_mean_s", "tpot_mean_s", "output_throughput_tokens_per_s"):
        assert w_sum[f"{m}_lo"] <= n_sum[f"{m}_lo"] <= n_sum[f"{m}_hi"] <= w_sum[f"{m}_hi"] or not widths, m
    for m in ("ttft_mean_s", "ttft_p90_s", "tpot_mean_s", "output_throughput_tokens_per_s",
              "cost_per_million_output_tokens_usd"):
        assert summary[f"{m}_lo"] <= summary[m] <= summary[f"{m}_hi"], m
    assert summary["ttft_mean_s_lo"] < summary["ttft_mean_s_hi"]
    assert other["summary"] != summary  # another seed draws other factors


def test_widened_rates_stay_within_the_offered_load(capsys: pytest.CaptureFixture[str]) -> None:
    """An arrival-bound run (60 requests at 10 req/s, far below saturation) cannot finish its
    requests faster than they arrive: the widened throughput and goodput ends stop at completed /
    last arrival (before 2026-12-02 the widening put them at ~1.55x the offered rate)."""
    from sim.api import last_arrival_s, load_scenario

    out = _run_json(capsys, "--set", "workload.num_prompts=60", "--intervals", "3")  # SMALL's lengths
    summary = out["summary"]
    assert isinstance(summary, dict)
    span = last_arrival_s(load_scenario(SCENARIO, {"workload.num_prompts": 60, "workload.random_input_len": 256,
                                                   "workload.random_output_len": 8}))
    assert 0 < span < summary["duration_s"]
    for m in ("request_throughput_per_s", "goodput_requests_per_s"):
        assert summary[m] <= summary[f"{m}_hi"] <= summary["num_completed"] / span * (1 + 1e-12), m
    assert summary["output_throughput_tokens_per_s_hi"] <= summary["output_throughput_tokens_per_s"] * (
        summary["duration_s"] / span) * (1 + 1e-12)
    assert summary["cost_per_million_output_tokens_usd_lo"] >= summary["cost_per_million_output_tokens_usd"] * (
        span / summary["duration_s"]) * (1 - 1e-12)


def test_run_out_summary_json_holds_the_intervals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """summary.json is what --json prints, the intervals' fields included (they were left out)."""
    printed = _run_json(capsys, "--intervals", "2", "--out", str(tmp_path / "run"))
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written == printed and "ttft_p90_s_lo" in written["summary"] and written["intervals"]["k"] == 2


def test_run_intervals_must_not_be_negative(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(SCENARIO), *SMALL, "--intervals", "-1"]) == 2
    assert "--intervals" in capsys.readouterr().err


def _sweep(tmp_path: Path, name: str, bound: float, extra: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[study]
name = "{name}"
sampler = "grid"
n_trials = 1
seed = 1
objective = "ttft_mean_s"
direction = "minimize"
{extra}
[slo]
ttft_mean_s = {bound!r}

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 12, "workload.random_input_len" = 256, "workload.random_output_len" = 8 }}

[space]
"engine.max_num_seqs" = {{ choices = [64] }}
""")
    return path


def test_slo_confidence_is_checked(tmp_path: Path) -> None:
    for bad in ("slo_confidence = 0.95", "slo_confidence = true", "interval_runs = 4",
                "slo_confidence = 0.9\ninterval_runs = 0"):
        with pytest.raises(ConfigError, match=r"study\.(slo_confidence|interval_runs)"):
            load_sweep(_sweep(tmp_path, "bad", 1.0, bad))
    spec = load_sweep(_sweep(tmp_path, "ok", 1.0, "slo_confidence = 0.9\ninterval_runs = 3"))
    assert (spec.slo_confidence, spec.trial_interval_runs()) == (0.9, 3)
    plain = load_sweep(_sweep(tmp_path, "ok", 1.0, ""))
    assert plain.trial_interval_runs() == 0
    base = plain.load_base()
    assert spec.identity(base) != plain.identity(base)


def test_sweep_trial_intervals_are_the_runs_widened_intervals(tmp_path: Path) -> None:
    """A robust trial's `_lo` / `_hi` are `kernelsight run --intervals`'s: the kernel draws stretched by
    the shipped end-to-end widening (before 2026-12-02 the sweep dropped the widening), and the
    per-user and per-GPU rates follow from those ends."""
    spec = load_sweep(_sweep(tmp_path, "probe", 1.0, "slo_confidence = 0.9\ninterval_runs = 3"))
    base = spec.load_base()
    result = TrialEvaluator(base, render_artifacts=False).evaluate(
        TrialInput(number=0, params={"engine.max_num_seqs": 64}, interval_runs=3, slo_confidence=0.9))
    scenario = base.with_overrides({"engine.max_num_seqs": 64})
    point = simulate(scenario).summary
    widened = run_intervals(scenario, point, 3, confidence=0.9)
    kernel_only = run_intervals(scenario, point, 3, confidence=0.9, kernel_only=True)
    m = result.metrics
    for name in ("ttft_mean_s", "tpot_p90_s", "cost_per_million_output_tokens_usd"):
        assert (m[f"{name}_lo"], m[f"{name}_hi"]) == pytest.approx((widened.lo[name], widened.hi[name]))
    assert m["ttft_mean_s_hi"] > kernel_only.hi["ttft_mean_s"] * 1.01
    assert m["output_tokens_per_s_per_user_lo"] == pytest.approx(1.0 / widened.hi["tpot_median_s"])
    assert m["output_throughput_tokens_per_s_per_gpu_hi"] == pytest.approx(
        widened.hi["output_throughput_tokens_per_s"] / point.num_gpus)


@pytest.mark.ray
def test_sweep_with_slo_confidence_rejects_a_trial_whose_upper_end_misses(
        ray_runtime: None, tracking_uri: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The bound sits between the trial's point TTFT and the upper end of its interval: the plain sweep
    accepts the trial, the robust one rejects it and shows the interval in its table."""
    spec = load_sweep(_sweep(tmp_path, "probe", 1.0, "slo_confidence = 0.9\ninterval_runs = 3"))
    probe = TrialEvaluator(spec.load_base(), render_artifacts=False).evaluate(
        TrialInput(number=0, params={"engine.max_num_seqs": 64}, interval_runs=3, slo_confidence=0.9))
    point, hi = probe.metrics["ttft_mean_s"], probe.metrics["ttft_mean_s_hi"]
    assert point < hi
    bound = (point + hi) / 2
    uri = tracking_uri
    plain = _sweep(tmp_path, "plain", bound, "")
    assert main(["sweep", str(plain), "--tracking-uri", uri, "--study-dir", str(tmp_path / "plain"),
                 "--no-trial-plots", "--json"]) == 0
    assert [t["number"] for t in json.loads(capsys.readouterr().out)["best"]] == [0]
    robust = _sweep(tmp_path, "robust", bound, "slo_confidence = 0.9\ninterval_runs = 3")
    assert main(["sweep", str(robust), "--tracking-uri", uri, "--study-dir", str(tmp_path / "robust"),
                 "--no-trial-plots"]) == 0
    text = capsys.readouterr().out
    assert "no trial met the [slo] bounds; closest misses:" in text
    row = next(line for line in text.splitlines() if line.lstrip().startswith("0 "))
    assert f"{point:.4g} [" in row and f", {hi:.4g}]" in row  # the point and its interval
    assert "90% interval from 3 perturbed runs" in text
    (child,) = child_runs(MlflowClient(tracking_uri=uri), "robust")
    logged = child.data.metrics
    assert logged["ttft_mean_s_hi"] == pytest.approx(hi) and logged["ttft_mean_s"] == pytest.approx(point)
    assert logged["tpot_p90_s_lo"] <= logged["tpot_p90_s"] <= logged["tpot_p90_s_hi"]
