"""`accuracy modules`: the simulator's MLA module kernels, summed, against the engines' measured modules."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from orchestrator.cli import main
from sim.api import predict_step, scenario_efficiency
from sim.calibration.module_check import MODULE_KERNELS, check_modules, module_rows, module_scenario, simulated_module_s
from sim.graph.batch import BatchShape
from sim.measured import measured_data_root


def _table(root: Path, gpu: str, name: str, rows: list[dict[str, object]]) -> None:
    d = root / "aiconfigurator" / gpu
    d.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(d / f"{name}.csv", index=False)


def _row(backend: str, gemm: str, batch: int, length: int, **extra: object) -> dict[str, object]:
    return {"backend": backend, "kernel_source": "k", "gemm_type": gemm, "kv_cache_dtype": "fp8", "num_heads": 16,
            "batch_size": batch, "latency_ms": 1.0, **extra}


def test_rows_are_the_engines_fp8_block_rows_and_prefill_beyond_the_host_floor(tmp_path: Path) -> None:
    _table(tmp_path, "h200_sxm", "mla_module_context", [
        _row("sglang", "fp8_block", 1, 8192, seq_len=8192), _row("sglang", "fp8_block", 2, 1024, seq_len=1024),
        _row("sglang", "bfloat16", 1, 8192, seq_len=8192), _row("vllm", "fp8_block", 1, 8192, seq_len=8192),
        _row("sglang", "fp8_block", 4, 1024, seq_len=1024)])
    rows = module_rows(tmp_path, "h200_sxm", "sglang", "prefill", None)
    assert sorted(zip(rows["batch_size"], rows["seq_len"], strict=True)) == [(1, 8192), (4, 1024)]
    # The draw is a fixed hash order: the same rows whatever the file's order.
    first = module_rows(tmp_path, "h200_sxm", "sglang", "prefill", 1)
    assert len(first) == 1 and first.index[0] in rows.index[:1]
    assert module_rows(tmp_path, "h100_sxm", "sglang", "prefill", None).empty


def test_simulated_module_is_the_sum_of_its_kernels_in_the_step() -> None:
    sc = module_scenario("h200_sxm", "trtllm", 16, "fp8", "cross-generation")
    eff = scenario_efficiency(sc)
    total, attn = simulated_module_s(sc, eff, "decode", 4, 1024)
    step = predict_step(sc, BatchShape(decode_context_tokens=(1023,) * 4), efficiency=eff)
    parts = {k.estimate.work.name: k.estimate.time_s for k in step.kernels}
    assert set(MODULE_KERNELS["decode"]) <= set(parts)
    assert total == pytest.approx(sum(parts[n] for n in MODULE_KERNELS["decode"]), rel=1e-12)
    assert attn == pytest.approx(parts["mla_decode"], rel=1e-12) and 0 < attn < total


def test_trtllm_decode_module_matches_its_measured_module() -> None:
    # TensorRT-LLM's bare series are its serving path: the simulated module sums to its measured one.
    (score,) = [s for s in check_modules(measured_data_root(), ["h200_sxm"], ["trtllm"], sample=40)
                if s.phase == "decode"]
    assert score.rows == 40 and 0.85 < score.median_ratio < 1.15 and score.median_abs_log < 0.15


def test_cli_prints_a_subset_without_touching_the_doc(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = tmp_path / "accuracy.md"
    doc.write_text("# Accuracy\n")
    assert main(["accuracy", "modules", "--gpu", "h200_sxm", "--backend", "sglang", "--sample", "8",
                 "--doc", str(doc), "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert {(s["gpu"], s["backend"], s["phase"], s["rows"]) for s in scores} == {
        ("h200_sxm", "sglang", "prefill", 8), ("h200_sxm", "sglang", "decode", 8)}
    assert doc.read_text() == "# Accuracy\n"


def test_cli_bad_input_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["accuracy", "modules", "--gpu", "a100_sxm"]) == 2
    err = capsys.readouterr().err
    assert "--gpu" in err and "no measured MLA module rows" in err
    assert main(["accuracy", "modules", "--sample", "0", "--gpu", "h200_sxm"]) == 2
    assert "--sample" in capsys.readouterr().err


def test_candidates_reprice_only_the_attention_kernel() -> None:
    (score,) = [s for s in check_modules(measured_data_root(), ["h200_sxm"], ["sglang"], sample=30, candidates=True)
                if s.phase == "decode"]
    by = {src: (ratio, log) for src, ratio, log in score.by_attention_source}
    assert set(by) == {"sglang", "trtllm", "vllm"}
    # The shipped SGLang profile already prices its MLA decode with TensorRT-LLM's rows.
    assert by["trtllm"][0] == score.median_ratio and by["trtllm"][1] == score.median_abs_log
    # Its own series costs more than its whole measured module (docs/validation.md, Kernel sources).
    assert by["sglang"][0] > score.median_ratio and by["sglang"][1] > score.median_abs_log
