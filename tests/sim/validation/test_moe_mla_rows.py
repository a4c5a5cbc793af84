"""MoE / MLA rows of the AIConfigurator silicon sample -> scenario sections (real rows, hand-checked).

Each dict below is a verbatim copy of the row's columns in `e2e/aiconfigurator_silicon_sample.csv`.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sim.api import load_engine_profile
from sim.validation.aiconfigurator import read_aiconfigurator
from sim.validation.budget import work_of
from sim.validation.finalize import finalize
from sim.validation.report import family_table, per_model_table, skipped_table
from sim.validation.rows import Replay, ValidationRow
from sim.validation.runner import RowResult
from sim.validation.specs_cache import SpecCache

PROFILES = {b: load_engine_profile(b) for b in ("vllm", "sglang", "trtllm")}
COLUMNS = ["id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
           "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
           "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms", "src_file", "src_concurrency",
           "conc_over_bs_x_dp"]

# DeepSeek-R1 FP8, TRT-LLM, InferenceX `tp8_ep8` with attention DP: 8 H200s; the 2026-04-06 export
# writes it as attention_dp 64 with moe 8 x 8.
DSR1_DEP8 = {"id": "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_8192x1024_c64_tp8_ep8_941", "backend": "trtllm",
             "backend_version": "1.1.0rc2.post2", "model_path": "deepseek-ai/DeepSeek-R1", "system": "h200_sxm",
             "precision": "fp8", "mode": "agg", "isl": "8192", "osl": "1024", "gemm_quant_mode": "fp8",
             "moe_quant_mode": "fp8", "batch_size": "1", "tp_size": "1", "pp_size": "1", "attention_dp_size": "64",
             "moe_tp_size": "8", "moe_ep_size": "8", "silicon_ttft_ms": "6421.963939832494",
             "silicon_tpot_ms": "39.754702652637185", "src_file": "2026-04-06.csv", "src_concurrency": "64",
             "conc_over_bs_x_dp": "1.0"}
# Qwen3-235B-A22B-FP8, TRT-LLM, NVIDIA collection: TP 4 with experts split moe_tp 2 x moe_ep 2.
QWEN_TP2EP2 = {"id": "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h100_sxm_trtllm_agg_128x128_c16_tp4_epnone_16",
               "backend": "trtllm", "backend_version": "1.0.0rc3", "model_path": "Qwen/Qwen3-235B-A22B-FP8",
               "system": "h100_sxm", "precision": "fp8", "mode": "agg", "isl": "128", "osl": "128",
               "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block", "batch_size": "16", "tp_size": "4",
               "pp_size": "1", "attention_dp_size": "", "moe_tp_size": "2", "moe_ep_size": "2",
               "silicon_ttft_ms": "246.730755196875", "silicon_tpot_ms": "17.378247728124997",
               "src_file": "/Users/harrli/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.0.0rc3/"
                           "Qwen_Qwen3-235B-A22B-FP8.csv", "src_concurrency": "16", "conc_over_bs_x_dp": "1.0"}
# Kimi-K2.5 with its int4 (W4A16) experts, vLLM TP 8 on B200 (evaluation row).
KIMI_INT4 = {"id": "2026_03_25_kimi_k2_5_b200_sxm_vllm_int4_agg_1024x8192_c16_tp8_0_ep1_0_319", "backend": "vllm",
             "backend_version": "0.15.1", "model_path": "moonshotai/Kimi-K2.5", "system": "b200_sxm",
             "precision": "int4", "mode": "agg", "isl": "1024", "osl": "8192", "gemm_quant_mode": "int4_wo",
             "moe_quant_mode": "int4_wo", "batch_size": "16", "tp_size": "8", "pp_size": "1",
             "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "1", "silicon_ttft_ms": "169.94694257664378",
             "silicon_tpot_ms": "14.999136066987928", "src_file": "2026-03-25.csv", "src_concurrency": "16",
             "conc_over_bs_x_dp": "1.0"}
# gpt-oss-120b (MXFP4 experts; the row says nvfp4), TRT-LLM `tp2_ep2` on H200, written as tp 4, moe 2 x 2.
GPTOSS_TP2EP2 = {"id": "2026_04_06_gpt_oss_120b_h200_sxm_trtllm_fp4_agg_1024x1024_c16_tp2_ep2_990",
                 "backend": "trtllm", "backend_version": "gpt-oss-dev", "model_path": "openai/gpt-oss-120b",
                 "system": "h200_sxm", "precision": "fp4", "mode": "agg", "isl": "1024", "osl": "1024",
                 "gemm_quant_mode": "nvfp4", "moe_quant_mode": "nvfp4", "batch_size": "16", "tp_size": "4",
                 "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "2", "moe_ep_size": "2",
                 "silicon_ttft_ms": "99.11735262721777", "silicon_tpot_ms": "8.701100612462394",
                 "src_file": "2026-04-06.csv", "src_concurrency": "16", "conc_over_bs_x_dp": "1.0"}
# gpt-oss-120b, TRT-LLM, NVIDIA collection: tp 4, moe 2 x 2, batch_size = concurrency / 4 (attention DP 4).
GPTOSS_ADP = {"id": "openai_gpt_oss_120b_openai_gpt_oss_120b_h100_sxm_trtllm_agg_4000x1000_c320_tp4_epnone_4",
              "backend": "trtllm", "backend_version": "1.3.0rc1", "model_path": "openai/gpt-oss-120b",
              "system": "h100_sxm", "precision": "fp8", "mode": "agg", "isl": "4000", "osl": "1000",
              "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": "80", "tp_size": "4", "pp_size": "1",
              "attention_dp_size": "", "moe_tp_size": "2", "moe_ep_size": "2", "silicon_ttft_ms": "1275.4467219796877",
              "silicon_tpot_ms": "47.58388012068287",
              "src_file": "/Users/harrli/projects/aic-auto-gap-analysis/data/h100_sxm/trtllm/1.3.0rc1/"
                          "openai_gpt-oss-120b.csv", "src_concurrency": "320", "conc_over_bs_x_dp": "4.0"}


def _read(tmp_path: Path, *rows: dict[str, str]) -> list[ValidationRow]:
    path = tmp_path / "aic.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(r)
    cache = SpecCache()
    return [finalize(r, PROFILES, cache) for r in read_aiconfigurator(path, PROFILES, cache)]


def _engine(row: ValidationRow) -> dict[str, Any]:
    assert row.skip_reason is None, row.skip_reason
    assert row.sections is not None
    return dict(row.sections["engine"])


def test_mla_attention_dp8_ep8_row_runs_on_its_eight_gpus(tmp_path: Path) -> None:
    (row,) = _read(tmp_path, DSR1_DEP8)
    e = _engine(row)
    assert (e["tensor_parallel_size"], e["data_parallel_size"]) == (1, 8)
    assert (e["moe_tensor_parallel_size"], e["moe_expert_parallel_size"]) == (1, 8)
    assert e["max_num_seqs"] == 8  # 64 clients over 8 attention-DP ranks
    assert e["router"] == "least_outstanding" and e["backend"] == "trtllm"
    assert "quantization" not in e  # the checkpoint's block FP8, not per-tensor FP8
    assert e["kv_cache_dtype"] == "fp8"  # TensorRT-LLM profile: FP8 KV with FP8 weights
    assert row.family == "mla" and row.suite == "dev"
    assert row.replay == Replay(kind="closed_loop", num_requests=640, concurrency=64)
    assert any("tp8_ep8" in n and "8 GPUs" in n for n in row.notes)
    # 8 replicas each step 8 of the 64 running requests: 640 x 921.6 / 8 decode steps, plus prefill.
    steps, request_steps = work_of(row)
    assert steps == 640 * 922 / 8 + 640 * 7373 / 8192 and request_steps == 640 * 922


def test_moe_tp2_x_ep2_row_keeps_its_expert_split(tmp_path: Path) -> None:
    (row,) = _read(tmp_path, QWEN_TP2EP2)
    e = _engine(row)
    assert (e["tensor_parallel_size"], e["data_parallel_size"]) == (4, 1)
    assert (e["moe_tensor_parallel_size"], e["moe_expert_parallel_size"]) == (2, 2)
    assert "quantization" not in e and e["max_num_seqs"] == 16 and "router" not in e
    assert row.sections is not None and row.sections["model"]["name"] == "Qwen/Qwen3-235B-A22B-FP8"  # block FP8
    assert row.family == "moe" and "moe2x2" in row.label


def test_kimi_int4_experts_keep_the_checkpoint_format(tmp_path: Path) -> None:
    (row,) = _read(tmp_path, KIMI_INT4)
    e = _engine(row)
    assert "quantization" not in e and e.get("kv_cache_dtype", "auto") == "auto"
    assert (e["tensor_parallel_size"], e["moe_tensor_parallel_size"], e["moe_expert_parallel_size"]) == (8, 8, 1)
    assert row.suite == "eval" and row.family == "mla"


def test_gpt_oss_tp2_ep2_row_is_read_back_as_two_gpus_with_mxfp4_experts(tmp_path: Path) -> None:
    (row,) = _read(tmp_path, GPTOSS_TP2EP2)
    e = _engine(row)
    assert (e["tensor_parallel_size"], e["data_parallel_size"]) == (2, 1)
    assert (e["moe_tensor_parallel_size"], e["moe_expert_parallel_size"]) == (1, 2)
    assert "quantization" not in e  # gpt-oss ships MXFP4 experts whatever the row's label
    assert e["kv_cache_dtype"] == "fp8"  # FP4 weights on TensorRT-LLM
    assert row.suite == "dev" and row.family == "moe"


def test_trtllm_row_with_batch_size_concurrency_over_tp_is_attention_dp(tmp_path: Path) -> None:
    (row,) = _read(tmp_path, GPTOSS_ADP)
    e = _engine(row)
    assert (e["tensor_parallel_size"], e["data_parallel_size"]) == (1, 4)
    assert (e["moe_tensor_parallel_size"], e["moe_expert_parallel_size"]) == (2, 2)
    assert e["max_num_seqs"] == 80
    assert any("attention DP over the 4 GPUs" in n for n in row.notes)


def test_rows_that_cannot_be_mapped_say_exactly_why(tmp_path: Path) -> None:
    uneven = {**QWEN_TP2EP2, "id": "uneven", "attention_dp_size": "1", "moe_tp_size": "4", "moe_ep_size": "2"}
    int4_elsewhere = {**QWEN_TP2EP2, "id": "int4", "moe_quant_mode": "int4_wo"}
    other_id = {**DSR1_DEP8, "id": "2026_04_06_deepseek_r1_h200_sxm_trtllm_fp8_agg_8192x1024_c64_tp4_ep4_941"}
    rows = {r.row_id.split(":")[1]: r for r in _read(tmp_path, uneven, int4_elsewhere, other_id)}
    assert rows["uneven"].skip_reason == ("experts split as moe_tp=4 x moe_ep=2 over tp=4 x dp=1 GPUs: the columns "
                                          "do not give one GPU count")
    assert rows["int4"].skip_reason == ("weight format int4_wo (W4A16) is modelled only for checkpoints that ship "
                                        "it; Qwen/Qwen3-235B-A22B-FP8 does not")
    # The layout columns (8 x 8) disagree with the id (tp4_ep4): not guessed.
    assert rows[other_id["id"]].skip_reason == ("2026-04-06.csv layout columns (tp 1 x dp 64, moe 8 x 8) disagree "
                                                "with the row id's tp4_ep4: the deployment is unknown")


def _result(row: ValidationRow, tier: str, ttft: float, tpot: float) -> RowResult:
    return RowResult(row_id=row.row_id, tier=tier, status="scored", predicted={"ttft_mean_s": ttft, "tpot_mean_s": tpot})


def test_per_model_and_family_tables_put_moe_and_mla_beside_dense_rows(tmp_path: Path) -> None:
    mla, moe = _read(tmp_path, DSR1_DEP8, QWEN_TP2EP2)
    dense = ValidationRow(row_id="aiconfigurator:d", source="aiconfigurator", suite="dev", model="Qwen/Qwen3-32B",
                          hardware="h200_sxm", backend="vllm", backend_version="0", label="d", family="dense",
                          measured={"ttft_mean_s": 1.0, "tpot_mean_s": 0.02}, skip_reason="no concurrency or lengths")
    disagg = ValidationRow(row_id="aiconfigurator:x", source="aiconfigurator", suite="dev", model="x",
                           hardware="h200_sxm", backend="vllm", backend_version="0", label="x", family="mla",
                           measured={}, skip_reason="not simulated", disaggregated=True)
    rows = [mla, moe, dense, disagg]
    # DeepSeek: TTFT 6.42 s measured, 3.21 s predicted (-50%); TPOT 39.75 ms vs 43.73 ms (+10%).
    results = [_result(mla, "cross-generation", 6.421963939832494 / 2, 0.039754702652637185 * 1.1)]
    lines = per_model_table(rows, results, tiers=["cross-generation"], deferred={moe.row_id: "over the time budget"})
    body = lines[2:]
    assert len(body) == 3  # the disaggregated row is in its own table
    assert body[0].startswith("| h100_sxm | dev | moe | Qwen/Qwen3-235B-A22B-FP8 | cross-generation | 1 | 0 | 0 | 1 |")
    assert body[1].startswith("| h200_sxm | dev | dense | Qwen/Qwen3-32B | cross-generation | 1 | 0 | 1 | 0 |")
    assert body[2] == ("| h200_sxm | dev | mla | deepseek-ai/DeepSeek-R1 | cross-generation | 1 | 1 | 0 | 0 | 0 "
                       "| 50.0% (-50.0%) | 10.0% (+10.0%) |")
    fam = family_table(rows, results, tiers=["cross-generation"], deferred={})
    assert fam[2].startswith("| dense | dev | cross-generation | 1 | 0 | 1 | 0 | 0 | 0 (0%) |")
    assert fam[4].startswith("| mla | dev | cross-generation | 1 | 1 | 0 | 0 | 0 | 1 (100%) | 50.0% (-50.0%)")


# Llama-3.1-70B FP8, TRT-LLM, InferenceX 1k/1k at C = 4 on H200 (evaluation rows), TP 4 and TP 8.
LLAMA70B_TRT = {"id": "2026_04_06_llama_3_1_70b_h200_sxm_trtllm_fp8_agg_1024x1024_c4_tp4_ep1_670",
                "backend": "trtllm", "backend_version": "", "model_path": "meta-llama/Llama-3.1-70B",
                "system": "h200_sxm", "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "1024",
                "gemm_quant_mode": "fp8", "moe_quant_mode": "fp8", "batch_size": "4", "tp_size": "4",
                "pp_size": "1", "attention_dp_size": "1", "moe_tp_size": "4", "moe_ep_size": "1",
                "silicon_ttft_ms": "230.3721300791949", "silicon_tpot_ms": "7.981652196329792",
                "src_file": "2026-04-06.csv", "src_concurrency": "4", "conc_over_bs_x_dp": "1.0"}


def test_inferencex_trtllm_llama70b_1k_rows_below_tp8_run_with_the_recipes_batch_waiting(tmp_path: Path) -> None:
    tp8 = {**LLAMA70B_TRT, "id": LLAMA70B_TRT["id"].replace("_tp4_", "_tp8_"), "tp_size": "8", "moe_tp_size": "8"}
    longer = {**LLAMA70B_TRT, "id": LLAMA70B_TRT["id"].replace("1024x1024", "8192x1024"), "isl": "8192"}
    waiting, full_tp, long_prompt = _read(tmp_path, LLAMA70B_TRT, tp8, longer)
    e = _engine(waiting)
    assert (e["batch_wait_timeout_iters"], e["batch_wait_max_tokens_ratio"]) == (20, 0.9)
    assert e["max_num_batched_tokens"] == e["max_model_len"] == 2064  # H200 recipe: max_num_tokens = max_model_len
    assert any("batch_wait_timeout_iters 20" in n for n in waiting.notes)
    for row in (full_tp, long_prompt):
        assert "batch_wait_timeout_iters" not in _engine(row)


def test_inferencex_trtllm_deepseek_attention_dp_rows_run_with_the_recipes_adp_balance(tmp_path: Path) -> None:
    # dsr1_fp8_h200_trt.sh: DP_ATTENTION=true writes attention_dp_config {enable_balance: true,
    # timeout_iters: 60, batching_wait_iters: 0}; the same deployment without attention DP (TP 8)
    # and the same layout on another backend do not get it.
    tp8 = {**DSR1_DEP8, "attention_dp_size": "1", "tp_size": "64"}
    sglang = {**DSR1_DEP8, "backend": "sglang", "backend_version": "0.5.10"}
    balanced, no_dp, other = _read(tmp_path, DSR1_DEP8, tp8, sglang)
    e = _engine(balanced)
    assert e["data_parallel_size"] == 8
    assert (e["attention_dp_enable_balance"], e["attention_dp_timeout_iters"],
            e["attention_dp_batching_wait_iters"]) == (True, 60, 0)
    assert any("enable_balance true, timeout_iters 60" in n for n in balanced.notes)
    assert _engine(no_dp)["data_parallel_size"] == 1
    for row in (no_dp, other):
        assert row.skip_reason is None
        assert "attention_dp_enable_balance" not in _engine(row)


def test_a_measurement_in_two_exports_is_scored_once_keeping_the_row_whose_label_matches_its_id(
        tmp_path: Path) -> None:
    # The db-dump export carries the same DeepSeek-R1 run (id `dsr1_...`) labelled DeepSeek-V3; it
    # comes first in the file, yet the R1 row is kept. Another run of the deployment (its own TPOT)
    # and the same numbers at another concurrency are separate measurements.
    v3 = {**DSR1_DEP8, "id": "dsr1_h200_trtllm_fp8_agg_8192x1024_c64_cfg700", "model_path": "deepseek-ai/DeepSeek-V3",
          "src_file": "db-dump/2026-04-27"}
    rerun = {**DSR1_DEP8, "id": DSR1_DEP8["id"].replace("_941", "_942"), "silicon_tpot_ms": "41.0"}
    other_load = {**DSR1_DEP8, "id": DSR1_DEP8["id"].replace("_c64_", "_c128_").replace("_941", "_943"),
                  "src_concurrency": "128", "batch_size": "2"}
    rows = _read(tmp_path, v3, DSR1_DEP8, rerun, other_load)
    dup, kept, *others = rows
    assert dup.skip_reason == (f"duplicate of aiconfigurator:{DSR1_DEP8['id']}: same measurement, model label "
                               "disagrees with the row id")
    assert [r.skip_reason for r in (kept, *others)] == [None, None, None]
    # Reported once in the skipped table (grouped, without the row id), left out of the coverage tables.
    skipped = skipped_table(rows, [], {})
    assert ("| dev | aiconfigurator | skipped | duplicate of another row (scored once): same measurement, model "
            "label disagrees with the row id | 1 |") in skipped
    (line,) = [ln for ln in family_table(rows, [], tiers=["cross-generation"], deferred={}) if ln.startswith("| mla")]
    assert line.startswith("| mla | dev | cross-generation | 3 | 0 | 0 |")
    # Without a label disagreement the first row in the file is kept.
    again = _read(tmp_path, {**DSR1_DEP8, "id": "x_1"}, {**DSR1_DEP8, "id": "x_2"})
    assert again[0].skip_reason is None
    assert again[1].skip_reason == ("duplicate of aiconfigurator:x_1: same deployment, concurrency and measured "
                                    "TTFT / TPOT")
