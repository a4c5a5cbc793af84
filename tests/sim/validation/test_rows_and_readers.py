"""Suites, the hold-out guard, and turning measured rows into scenarios (hand-made CSVs)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from sim.api import load_engine_profile, predict_step
from sim.graph.batch import BatchShape
from sim.specs.scenario import scenario_from_dict
from sim.validation.aiconfigurator import read_aiconfigurator
from sim.validation.engine_args import sglang_mem_fraction_static, sglang_memory_defaults, trtllm_bench_settings
from sim.validation.finalize import finalize
from sim.validation.llmservingsim import read_llmservingsim
from sim.validation.rows import EvalRowRefused, ValidationRow, is_eval, require_dev, suite_of
from sim.validation.specs_cache import SpecCache
from sim.validation.trtllm import read_trtllm_static, read_trtllm_throughput

PROFILES = {b: load_engine_profile(b) for b in ("vllm", "sglang", "trtllm")}

AIC_COLUMNS = ["id", "backend", "backend_version", "model_path", "system", "precision", "mode", "isl", "osl",
               "gemm_quant_mode", "moe_quant_mode", "batch_size", "tp_size", "pp_size", "attention_dp_size",
               "moe_tp_size", "moe_ep_size", "silicon_ttft_ms", "silicon_tpot_ms", "src_file", "src_concurrency",
               "conc_over_bs_x_dp", *(f"{p}_{k}" for p in ("prefill", "decode") for k in (
                   "num_workers", "tp_size", "pp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size",
                   "batch_size"))]


@pytest.mark.parametrize(("model", "hardware", "suite"), [
    ("meta-llama/Llama-3.1-70B", "h100_sxm", "eval"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "h200_sxm", "eval"),
    ("LLaMA v3 70B", "h100_sxm", "eval"),
    ("Llama 3.3 70B", "rtx_pro_6000_server", "eval"),
    ("LLaMA 70B", "L40S", "eval"),
    ("Qwen/Qwen3-32B", "b200_sxm", "eval"),
    ("Qwen/Qwen3-32B", "B200_180GB", "eval"),
    ("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm", "dev"),
    ("Llama 3.1 405B", "h200_sxm", "dev"),
    ("Llama 4 Scout", "gb200", "dev"),
    ("moonshotai/Kimi-K2.5", "h200_sxm", "eval"),
    ("zhipuai/GLM-5", "h200_sxm", "eval"),
    ("deepseek-ai/DeepSeek-R1", "h200_sxm", "dev"),
])
def test_suite_rule(model: str, hardware: str, suite: str) -> None:
    assert suite_of(model, hardware) == suite
    assert is_eval(model, hardware) == (suite == "eval")


def _row(model: str, hardware: str, suite: str) -> ValidationRow:
    return ValidationRow(row_id=f"x:{model}", source="aiconfigurator", suite=suite,  # type: ignore[arg-type]
                         model=model, hardware=hardware, backend="vllm", backend_version="0", label="x",
                         measured={}, skip_reason="test")


def test_require_dev_passes_dev_rows_and_refuses_eval_rows() -> None:
    dev = _row("Qwen/Qwen3-32B", "h100_sxm", "dev")
    assert require_dev([dev], purpose="t") == [dev]
    with pytest.raises(EvalRowRefused, match="evaluation row"):
        require_dev([dev, _row("Qwen/Qwen3-32B", "b200_sxm", "eval")], purpose="t")


def test_require_dev_rederives_the_suite_instead_of_trusting_the_field() -> None:
    with pytest.raises(EvalRowRefused):
        require_dev([_row("meta-llama/Llama-3.1-70B", "h100_sxm", "dev")], purpose="t")


def _aic_csv(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=AIC_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({c: r.get(c, "") for c in AIC_COLUMNS})
    return path


AGG = {"id": "1", "backend": "vllm", "backend_version": "0.12.0", "model_path": "Qwen/Qwen3-32B",
       "system": "h100_sxm", "precision": "fp8", "mode": "agg", "isl": "1024", "osl": "128",
       "gemm_quant_mode": "fp8", "batch_size": "16", "tp_size": "2", "pp_size": "1", "silicon_ttft_ms": "150",
       "silicon_tpot_ms": "20", "src_file": "2026-03-25.csv", "src_concurrency": "16", "conc_over_bs_x_dp": "1.0"}


def test_inferencex_row_becomes_a_closed_loop_with_lengths_in_0p8_to_1_of_isl(tmp_path: Path) -> None:
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [AGG]), PROFILES, SpecCache())
    assert row.skip_reason is None and row.suite == "dev"
    assert row.measured == {"ttft_mean_s": pytest.approx(0.150), "tpot_mean_s": pytest.approx(0.020)}
    assert row.sections is not None and row.replay is not None
    w, e = row.sections["workload"], row.sections["engine"]
    assert (w["num_prompts"], w["max_concurrency"], w["request_rate"]) == (160, 16, math.inf)
    assert w["random_input_len"] == 922 and w["random_output_len"] == 115
    lo, hi = w["random_input_len"] * (1 - w["random_range_ratio"]), w["random_input_len"] * (1 + w["random_range_ratio"])
    assert lo == pytest.approx(0.8 * 1024, abs=1.5) and hi == pytest.approx(1024, abs=1.5)
    assert (e["tensor_parallel_size"], e["quantization"], e["backend"]) == (2, "fp8", "vllm")
    assert row.replay.kind == "closed_loop" and row.replay.concurrency == 16


def test_nvidia_collection_row_uses_fixed_lengths(tmp_path: Path) -> None:
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, "src_file": "/Users/x/data.csv"}]), PROFILES,
                                 SpecCache())
    assert row.sections is not None
    assert row.sections["workload"]["dataset_name"] == "fixed"
    assert (row.sections["workload"]["random_input_len"], row.sections["workload"]["random_output_len"]) == (1024, 128)
    assert "api_server_latency_s" not in row.sections["engine"]  # a client measured it through the server


def test_disaggregated_row_becomes_a_prefill_and_a_decode_pool(tmp_path: Path) -> None:
    change = {"mode": "disagg", "batch_size": "", "tp_size": "", "src_file": "/Users/x/data.csv",
              "prefill_num_workers": "3", "prefill_tp_size": "1", "prefill_batch_size": "1",
              "decode_num_workers": "1", "decode_tp_size": "4", "decode_batch_size": "64"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.disaggregated and row.sections is not None
    d = row.sections["disaggregation"]
    assert (d["prefill"]["num_workers"], d["prefill"]["engine"]["tensor_parallel_size"]) == (3, 1)
    assert d["prefill"]["engine"]["max_num_seqs"] == 1
    assert (d["decode"]["num_workers"], d["decode"]["engine"]["tensor_parallel_size"]) == (1, 4)
    assert d["decode"]["engine"]["max_num_seqs"] == 64
    assert "p3x(tp1 moe?x?) d1x(tp4 moe?x?)" in row.label
    # The InferenceX date exports record neither worker counts nor MTP: such a row is not simulated.
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "b.csv", [{**AGG, **change, "src_file": "2026-03-25.csv",
                                                                "prefill_num_workers": ""}]), PROFILES, SpecCache())
    assert row.skipped and row.skip_reason is not None
    assert row.skip_reason.startswith("prefill_num_workers not recorded by 2026-03-25.csv and no db-dump twin")


def test_a_gated_deltanet_hybrid_row_is_simulable(tmp_path: Path) -> None:
    change = {"model_path": "Qwen/Qwen3.5-397B-A17B", "backend": "sglang", "backend_version": "0.5.9",
              "system": "h200_sxm", "tp_size": "8", "moe_tp_size": "1", "moe_ep_size": "8",
              "attention_dp_size": "1", "moe_quant_mode": "fp8_block", "gemm_quant_mode": "fp8"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.skip_reason is None and row.family == "moe"


@pytest.mark.parametrize(("version", "system", "tp", "capture", "chunk"), [
    ("0.5.6.post2", "h200_sxm", 1, 256, 8192),
    ("0.5.6.post2", "h200_sxm", 4, 512, 8192),   # from TP 4 SGLang captures decode batches up to 512
    ("0.5.6.post2", "h100_sxm", 8, 512, 8192),
    ("0.5.9", "b200_sxm", 1, 512, 16384),        # >= 160 GB: 512 graphs, 16k chunks
    ("0.5.1.post1", "h100_sxm", 8, 160, 8192),   # before 0.5.3: 160 on every GPU of 25 GB or more
])
def test_sglang_rows_take_the_cuda_graph_cap_and_chunk_of_their_release(
        tmp_path: Path, version: str, system: str, tp: int, capture: int, chunk: int) -> None:
    """SGLang's `ServerArgs._handle_gpu_memory_settings` (since 0.5.3) picks `cuda_graph_max_bs` by GPU
    memory and TP size: on an H100 / H200 256 below TP 4, 512 from TP 4. A decode batch above the cap
    runs eagerly (77.75 us a kernel), so a fixed 256 priced SGLang's TP 4 / 8 rows at C > 256 eager."""
    change = {"backend": "sglang", "backend_version": version, "system": system, "tp_size": str(tp),
              "model_path": "meta-llama/Llama-3.1-8B-Instruct", "batch_size": "352", "src_concurrency": "352",
              "src_file": "/Users/x/data.csv"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.sections is not None, row.skip_reason
    engine = row.sections["engine"]
    assert (engine["max_cudagraph_capture_size"], engine["max_num_batched_tokens"]) == (capture, chunk)
    hbm = {"h100_sxm": 80, "h200_sxm": 141, "b200_sxm": 180}[system] << 30
    assert sglang_memory_defaults(version, tp_size=tp, hbm_capacity_bytes=hbm) == (
        capture, None if version == "0.5.1.post1" else chunk)


@pytest.mark.parametrize(("version", "system", "tp", "fraction"), [
    ("0.5.8.post1", "h100_sxm", 1, 0.836),  # 512 + 8192 x 1.5 + 256 x 2 + 128 MiB of 81,920
    ("0.5.6.post2", "h200_sxm", 8, 0.897),  # 512 + 12,288 + 512 x 2 + 1,024 MiB of 144,384
    ("0.5.1.post1", "h100_sxm", 1, 0.88),   # before 0.5.3: the profile's fraction
])
def test_sglang_rows_take_the_mem_fraction_static_of_their_release(
        tmp_path: Path, version: str, system: str, tp: int, fraction: float) -> None:
    """SGLang >= 0.5.3 derives `mem_fraction_static` from the chunk, the graph cap and TP
    (`_handle_gpu_memory_settings`); a fixed 0.88 gave Qwen3-32B on one H100 64% more KV cache."""
    change = {"backend": "sglang", "backend_version": version, "system": system, "tp_size": str(tp),
              "model_path": "Qwen/Qwen3-32B", "batch_size": "16", "src_concurrency": "16",
              "src_file": "/Users/x/data.csv"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.sections is not None, row.skip_reason
    assert row.sections["engine"]["gpu_memory_utilization"] == pytest.approx(fraction)


def test_sglang_mem_fraction_static_reserves_for_attention_dp_graphs() -> None:
    # 512 + 12,288 + 1,024 + 1,024 + 512 x 8 x 3 + 512 x 8 x 1.5 MiB of 144,384 (DP 8, 512 graphs)
    assert sglang_mem_fraction_static("0.5.9", tp_size=8, dp_size=8, hbm_capacity_bytes=141 << 30,
                                      chunked_prefill_size=8192, cuda_graph_max_bs=512) == pytest.approx(0.77)


def test_sglang_attention_dp_rows_count_all_ranks_as_sglangs_tp(tmp_path: Path) -> None:
    change = {"backend": "sglang", "backend_version": "0.5.9", "system": "h200_sxm", "tp_size": "1",
              "attention_dp_size": "8", "model_path": "deepseek-ai/DeepSeek-R1", "moe_tp_size": "1",
              "moe_ep_size": "8", "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block",
              "batch_size": "8", "src_concurrency": "64", "src_file": "2026-03-25.csv"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.sections is not None, row.skip_reason
    assert row.sections["engine"]["data_parallel_size"] == 8
    assert row.sections["engine"]["max_cudagraph_capture_size"] == 512  # `--tp 8 --dp 8 --enable-dp-attention`


def test_sglang_attention_dp_ranks_each_take_the_chunk_over_dp(tmp_path: Path) -> None:
    """SGLang's `_handle_data_parallelism` gives each attention-DP rank chunked_prefill_size // dp_size
    (H200, 0.5.9: 8,192 // 8 = 1,024 tokens a rank); `mem_fraction_static` reads the undivided chunk."""
    change = {"backend": "sglang", "backend_version": "0.5.9", "system": "h200_sxm", "tp_size": "1",
              "attention_dp_size": "8", "model_path": "deepseek-ai/DeepSeek-R1", "moe_tp_size": "1",
              "moe_ep_size": "8", "gemm_quant_mode": "fp8_block", "moe_quant_mode": "fp8_block",
              "batch_size": "8", "src_concurrency": "64", "src_file": "2026-03-25.csv"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.sections is not None, row.skip_reason
    assert row.sections["engine"]["max_num_batched_tokens"] == 1024
    assert row.sections["engine"]["gpu_memory_utilization"] == pytest.approx(0.77)  # as with 8,192-token chunks
    (tp8,) = read_aiconfigurator(_aic_csv(tmp_path / "b.csv", [{**AGG, **change, "tp_size": "8",
                                                                "attention_dp_size": "1"}]), PROFILES, SpecCache())
    assert tp8.sections is not None and tp8.sections["engine"]["max_num_batched_tokens"] == 8192


@pytest.mark.parametrize(("change", "reason"), [
    ({"model_path": "acme/unknown"}, "no model config ships"),
    ({"conc_over_bs_x_dp": "4.0"}, "not batch_size x attention_dp"),
    ({"gemm_quant_mode": "int4_wo"}, "int4_wo"),
    ({"model_path": "openai/gpt-oss-120b", "moe_tp_size": "4", "moe_ep_size": "2", "tp_size": "4",
      "attention_dp_size": "1"}, "experts split as moe_tp=4 x moe_ep=2 over tp=4 x dp=1 GPUs"),
])
def test_rows_the_simulator_cannot_represent_are_skipped_with_the_reason(tmp_path: Path, change: dict[str, str],
                                                                         reason: str) -> None:
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.skipped and reason in (row.skip_reason or "")
    assert row.measured["ttft_mean_s"] == pytest.approx(0.150)


def test_moe_row_with_expert_parallel_over_all_ranks_is_kept(tmp_path: Path) -> None:
    change = {"model_path": "openai/gpt-oss-120b", "precision": "fp4", "gemm_quant_mode": "nvfp4",
              "system": "h200_sxm", "tp_size": "4", "moe_tp_size": "1", "moe_ep_size": "4"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [{**AGG, **change}]), PROFILES, SpecCache())
    assert row.sections is not None
    engine = row.sections["engine"]
    assert (engine["moe_tensor_parallel_size"], engine["moe_expert_parallel_size"]) == (1, 4)
    assert "quantization" not in engine  # gpt-oss keeps its MXFP4 checkpoint


def test_trtllm_profile_sizes_kv_from_memory_left_after_weights(tmp_path: Path) -> None:
    raw = {**AGG, "backend": "trtllm", "src_file": "/Users/x.csv"}
    (row,) = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [raw]), PROFILES, SpecCache())
    cache = SpecCache()
    done = finalize(row, PROFILES, cache)
    assert done.sections is not None
    util = done.sections["engine"]["gpu_memory_utilization"]
    mem = cache.memory("Qwen/Qwen3-32B", "h100_sxm", done.sections["engine"])
    fixed = mem.weight_bytes + mem.activation_peak_bytes + mem.runtime_overhead_bytes + mem.cuda_graph_bytes
    assert mem.kv_cache_bytes == pytest.approx(0.9 * (mem.total_bytes - fixed), rel=1e-4)
    assert 0.9 < util < 1.0
    assert done.sections["engine"]["kv_cache_dtype"] == "fp8"


def test_trtllm_bench_settings_by_hand() -> None:
    gib = 1 << 30
    # 80 GiB GPU, 16 GiB of weights, 1 MiB of KV per token, 1000 + 1000 tokens: 0.95 x 64 GiB / 2000 MiB
    # = 31.1 requests -> batch rounded up to 64 (minimum); tokens 31.1 x 2 = 62 -> 2048 (minimum).
    assert trtllm_bench_settings(total_memory_bytes_per_gpu=80 * gib, weight_bytes_total=16 * gib,
                                 kv_bytes_per_token_total=1 << 20, num_gpus=1, pp=1, isl=1000, osl=1000) == (64, 2048)
    # 8 GPUs, 1 KiB per token, 128 + 128: requests capped at 4096 -> batch 4096, tokens 8192.
    assert trtllm_bench_settings(total_memory_bytes_per_gpu=80 * gib, weight_bytes_total=16 * gib,
                                 kv_bytes_per_token_total=1 << 10, num_gpus=8, pp=1, isl=128, osl=128) == (4096, 8192)


def test_llmservingsim_run_is_replayed_from_queue_times(tmp_path: Path) -> None:
    d = tmp_path / "lss"
    d.mkdir()
    (d / "runs.csv").write_text(
        "run_id,hardware,model,engine,engine_version,tensor_parallel_size,data_parallel_size,enable_expert_parallel,"
        "max_num_seqs,max_num_batched_tokens,max_model_len,dtype,kv_cache_dtype,gpu_memory_utilization,"
        "enable_prefix_caching\n"
        "R,RTXPRO6000,meta-llama/Llama-3.1-8B,vllm,0.19.0,1,1,False,128,2048,,bfloat16,auto,,\n")
    (d / "requests.csv").write_text(
        "run_id,input_toks,output_toks,queued_rel_s,queued_ts,first_token_ts,last_token_ts\n"
        "R,100,3,0.5,10.5,11.0,11.2\n"
        "R,200,1,0.0,10.0,10.1,10.1\n"
        "R,300,5,1.0,11.0,11.5,12.3\n")
    (row,) = read_llmservingsim(d, PROFILES["vllm"])
    assert row.replay is not None and row.sections is not None
    assert [t.arrival_s for t in row.replay.trace] == [0.0, 0.5, 1.0]
    assert [t.input_tokens for t in row.replay.trace] == [200, 100, 300]
    assert row.measured["ttft_mean_s"] == pytest.approx((0.5 + 0.1 + 0.5) / 3)
    assert row.measured["tpot_mean_s"] == pytest.approx((0.1 + 0.2) / 2)  # single-token requests have no TPOT
    assert row.measured["output_throughput_tokens_per_s"] == pytest.approx(9 / 2.3)
    assert row.sections["engine"]["max_num_batched_tokens"] == 2048
    assert row.sections["engine"]["enable_prefix_caching"] is True
    assert row.sections["engine"]["api_server_latency_s"] == 0.0  # engine timestamps: no API server
    assert row.sections["hardware"]["name"] == "rtx_pro_6000_server"


def test_static_batch_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text(
        "engine,engine_version,gpu,gpu_label,precision,model,batch_size,tp,isl,kind,osl,out_tok_per_s_per_gpu,"
        "first_token_latency_ms\n"
        "T,0.9.0,A100_SXM4_80GB,A100,FP16,Mixtral 8x7B,64,2,128,peak_throughput,2048,1000,\n"
        "T,0.9.0,A100_SXM4_80GB,A100,FP16,Mixtral 8x7B,1,2,2048,first_token_latency_bs1,,,160.9\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,GPT-J 6B,1,1,128,first_token_latency_bs1,,,5.5\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,GPT-J 6B,64,1,2048,peak_throughput,2048,3212,\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,Phi-2,1,1,128,first_token_latency_bs1,,,5.5\n")
    peak, bs1, gptj, gptj_long, phi = read_trtllm_static(path, PROFILES, SpecCache())
    assert peak.measured == {"output_throughput_tokens_per_s": 2000.0}
    assert peak.sections is not None and peak.sections["engine"]["enable_chunked_prefill"] is False
    assert peak.sections["engine"]["max_num_batched_tokens"] == 64 * 128
    assert bs1.replay is not None and bs1.replay.kind == "single_request"
    assert bs1.measured == {"ttft_mean_s": pytest.approx(0.1609)}
    assert not gptj.skipped and gptj.sections is not None
    assert gptj.sections["model"] == {"name": "EleutherAI/gpt-j-6b"}
    # 2,048 + 2,048 tokens: past GPT-J's 2,048 positions, as TensorRT-LLM built the engine.
    assert gptj_long.sections is not None and gptj_long.sections["model"]["max_position_embeddings"] == 4096
    assert any("max_position_embeddings=2048" in n for n in gptj_long.notes)
    assert phi.skipped and phi.skip_reason == "no model config ships for Phi-2"


def test_static_batch_older_dense_checkpoints_are_represented(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text(
        "engine,engine_version,gpu,gpu_label,precision,model,batch_size,tp,isl,kind,osl,out_tok_per_s_per_gpu,"
        "first_token_latency_ms\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,Mistral 7B,1,1,128,first_token_latency_bs1,,,5.5\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,LLaMA 7B,1,1,128,first_token_latency_bs1,,,5.5\n"
        "T,0.9.0,H100_SXM_80GB,H100,FP8,LLaMA 70B,1,4,128,first_token_latency_bs1,,,20.0\n")
    mistral, llama7, llama70 = read_trtllm_static(path, PROFILES, SpecCache())
    assert not mistral.skipped and mistral.sections is not None
    assert mistral.sections["model"]["name"] == "mistralai/Mistral-7B-v0.1" and mistral.suite == "dev"
    assert not llama7.skipped and llama7.suite == "dev" and llama7.sections is not None
    assert not llama70.skipped and llama70.suite == "eval"  # a Llama 70B checkpoint: evaluation only
    # TensorRT-LLM 0.9 (engine flow) attends over the whole context: Mistral's config window is off.
    assert mistral.sections["engine"]["max_attention_window"] == 0 and "full attention" in mistral.notes[-1]
    assert "max_attention_window" not in llama7.sections["engine"]  # no window to turn off


def test_engine_flow_throughput_rows_attend_the_whole_context(tmp_path: Path) -> None:
    """Before 1.0 TensorRT-LLM applies no sliding window unless max_attention_window_size is set; from
    1.0 (the PyTorch flow) the config's windows stand."""
    path = tmp_path / "t.csv"
    head = ("engine,doc_version,model,model_hf,gpu,gpu_label,precision,num_gpus,tp,pp,isl,osl,num_requests,"
            "output_tok_per_s,metric,benchmark,source_repo,source_commit,source_path\n")
    path.write_text(head + "".join(
        f"TensorRT-LLM,{doc},Mistral 7B,,H100_SXM_80GB,H100,FP8,1,1,1,20000,2000,1000.0,1373.2,m,b,r,c,p\n"
        for doc in ("0.17", "1.0")))
    old, new = read_trtllm_throughput(path, PROFILES, SpecCache())
    assert old.sections is not None and old.sections["engine"]["max_attention_window"] == 0
    assert new.sections is not None and "max_attention_window" not in new.sections["engine"]
    full = scenario_from_dict(old.sections, source="t.csv")
    windowed = scenario_from_dict(new.sections, source="t.csv")
    assert set(full.model.layer_window_tokens) == {0} and set(windowed.model.layer_window_tokens) == {4096}
    # A decode step at a 20,000-token context reads 4.9x the KV of the windowed one: it is dearer.
    decode = BatchShape(decode_context_tokens=(20_000,) * 32)
    assert predict_step(full, decode).device_s() > 1.5 * predict_step(windowed, decode).device_s()


def test_pytorch_flow_throughput_rows_raise_the_token_budget_to_a_whole_prompt(tmp_path: Path) -> None:
    """trtllm-bench's PyTorch path (the 0.19+ tables) raises the heuristic's max_num_tokens to the longest
    prompt + max_batch_size (`get_settings`: chunked prefill reads as off); the 0.17 engine flow keeps
    the heuristic's."""
    path = tmp_path / "t.csv"
    head = ("engine,doc_version,model,model_hf,gpu,gpu_label,precision,num_gpus,tp,pp,isl,osl,num_requests,"
            "output_tok_per_s,metric,benchmark,source_repo,source_commit,source_path\n")
    path.write_text(head + "".join(
        f"TensorRT-LLM,{doc},Llama 3.1 8B,,H100_SXM_80GB,H100,FP8,1,1,1,20000,2000,1000.0,1351.0,m,b,r,c,p\n"
        for doc in ("0.17", "0.20", "1.0")))
    engine_flow, *pytorch_flow = read_trtllm_throughput(path, PROFILES, SpecCache())
    assert engine_flow.sections is not None
    assert engine_flow.sections["engine"]["max_num_batched_tokens"] == 2048  # the heuristic's minimum
    for row in pytorch_flow:
        assert row.sections is not None
        engine = row.sections["engine"]
        assert engine["max_num_batched_tokens"] == 20_000 + engine["max_num_seqs"]
        assert "ISL + max_batch_size" in row.notes[-1]


def test_inferencex_disaggregated_row_takes_its_db_dump_twins_pool_columns(tmp_path: Path) -> None:
    # The same run in two exports: the date export without workers or batch sizes, its pools written
    # tp8; the db-dump with 1 prefill worker at attention DP 8 and 9 decode workers at TP 8, batch 8.
    pools = {"mode": "disagg", "batch_size": "", "tp_size": "", "isl": "1024", "osl": "1024",
             "src_concurrency": "72", "silicon_ttft_ms": "881.15", "silicon_tpot_ms": "16.25"}
    dated = {**AGG, **pools, "id": "2026_03_25_x", "src_file": "2026-03-25.csv",
             "prefill_tp_size": "8", "prefill_attention_dp_size": "1", "decode_tp_size": "8",
             "decode_attention_dp_size": "1"}
    dump = {**AGG, **pools, "id": "x_cfg590", "src_file": "db-dump/2026-04-27",
            "prefill_num_workers": "1", "prefill_tp_size": "1", "prefill_attention_dp_size": "8",
            "prefill_batch_size": "1", "decode_num_workers": "9", "decode_tp_size": "8",
            "decode_attention_dp_size": "1", "decode_batch_size": "8"}
    other = {**dated, "id": "2026_03_25_y", "silicon_tpot_ms": "16.26"}  # not the same measurement
    rows = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [dated, dump, other]), PROFILES, SpecCache())
    by_id = {r.row_id: r for r in rows}
    twin = by_id["aiconfigurator:2026_03_25_x"]
    assert twin.sections is not None
    d = twin.sections["disaggregation"]
    assert (d["prefill"]["num_workers"], d["prefill"]["engine"]["data_parallel_size"]) == (1, 8)
    assert (d["decode"]["num_workers"], d["decode"]["engine"]["tensor_parallel_size"]) == (9, 8)
    assert d["decode"]["engine"]["max_num_seqs"] == 8
    assert any("from x_cfg590" in n for n in twin.notes)
    alone = by_id["aiconfigurator:2026_03_25_y"]
    assert alone.skipped and alone.skip_reason is not None and "not pinned down" in alone.skip_reason


def test_one_measurement_in_several_exports_is_scored_once(tmp_path: Path) -> None:
    """A nightly's build suffix (`nightly-dev-20260216-d3bae71e` in the db-dump, `nightly-dev` in the
    dated export) and the gap-analysis exports' 0.01 ms rounding do not make one run two measurements;
    a db-dump twin is found when the exports write the same float with different last digits (before
    2026-12-02, 138 copies were scored twice or three times and 12 twins were missed)."""
    base = {**AGG, "backend": "sglang", "silicon_ttft_ms": "423.3116962888744", "silicon_tpot_ms": "12.0098645253875"}
    dated = {**base, "id": "a_1", "backend_version": "nightly-dev"}
    dump = {**base, "id": "b_2", "backend_version": "nightly-dev-20260216-d3bae71e", "src_file": "db-dump/2026-04-27"}
    rounded = {**base, "id": "c_3", "backend_version": "nightly-dev", "silicon_ttft_ms": "423.31",
               "silicon_tpot_ms": "12.01", "src_file": "qwen3.5-397b-gap-analysis.csv"}
    distinct = {**base, "id": "d_4", "backend_version": "nightly-dev", "silicon_tpot_ms": "12.03"}
    rows = read_aiconfigurator(_aic_csv(tmp_path / "a.csv", [dated, dump, rounded, distinct]), PROFILES, SpecCache())
    assert [r.skip_reason is None for r in rows] == [True, False, False, True]
    assert all(r.skip_reason is not None and r.skip_reason.startswith("duplicate of aiconfigurator:a_1")
               for r in rows[1:3])
    # The twin of a disaggregated date-export row, its TTFT written ...164 there and ...163 in the dump.
    pools = {"mode": "disagg", "batch_size": "", "tp_size": "", "isl": "1024", "osl": "1024",
             "src_concurrency": "72", "silicon_tpot_ms": "20.158781638606424"}
    date = {**AGG, **pools, "id": "2026_03_25_x", "src_file": "2026-03-25.csv", "silicon_ttft_ms": "978.2979881643164",
            "prefill_tp_size": "8", "prefill_attention_dp_size": "1", "decode_tp_size": "8",
            "decode_attention_dp_size": "1"}
    twin = {**AGG, **pools, "id": "x_cfg590", "src_file": "db-dump/2026-04-27", "silicon_ttft_ms": "978.2979881643163",
            "prefill_num_workers": "1", "prefill_tp_size": "1", "prefill_attention_dp_size": "8",
            "prefill_batch_size": "1", "decode_num_workers": "9", "decode_tp_size": "8",
            "decode_attention_dp_size": "1", "decode_batch_size": "8"}
    (kept, copy) = read_aiconfigurator(_aic_csv(tmp_path / "b.csv", [date, twin]), PROFILES, SpecCache())
    assert kept.sections is not None and kept.sections["disaggregation"]["decode"]["num_workers"] == 9
    assert copy.skip_reason is not None and copy.skip_reason.startswith("duplicate of aiconfigurator:2026_03_25_x")


def test_gh200_throughput_rows_run_on_the_gh200_spec(tmp_path: Path) -> None:
    """TensorRT-LLM's GH200 480GB rows map to the catalog's `gh200` (96 GB HBM3 at 4 TB/s, one
    superchip per node): simulable, dev for Llama-3.1-8B and evaluation for Llama-3.1-70B."""
    path = tmp_path / "t.csv"
    head = ("engine,doc_version,model,model_hf,gpu,gpu_label,precision,num_gpus,tp,pp,isl,osl,num_requests,"
            "output_tok_per_s,metric,benchmark,source_repo,source_commit,source_path\n")
    path.write_text(head + "".join(
        f"TensorRT-LLM,0.17,{model},,GH200_480GB,GH200 480GB,FP8,1,1,1,1000,1000,3000.0,{tps},m,b,r,c,p\n"
        for model, tps in (("LLaMA v3.1 8B", 16482.77), ("LLaMA v3.1 70B", 1746.12))))
    small, large = read_trtllm_throughput(path, PROFILES, SpecCache())
    for row in (small, large):
        assert not row.skipped and row.hardware == "gh200" and row.sections is not None
        assert row.sections["hardware"]["name"] == "gh200"
        assert row.sections["engine"]["api_server_latency_s"] == 0.0  # trtllm-bench: no API server
    assert (small.suite, large.suite) == ("dev", "eval") and small.sections is not None
    hw = scenario_from_dict(small.sections, source="t.csv").hardware
    assert hw.hbm_capacity_bytes == 96 * 2**30 and hw.hbm_bandwidth_bytes_per_s == 4.0e12
    assert hw.num_gpus_per_node == 1 and hw.sm_version == 90


def test_llama4_throughput_rows_are_simulated(tmp_path: Path) -> None:
    """TensorRT-LLM's Llama 4 rows load the shipped Scout / Maverick configs (no longer skipped as
    'no model config'); B200 rows stay evaluation only."""
    path = tmp_path / "t.csv"
    head = ("engine,doc_version,model,model_hf,gpu,gpu_label,precision,num_gpus,tp,pp,isl,osl,num_requests,"
            "output_tok_per_s,metric,benchmark,source_repo,source_commit,source_path\n")
    path.write_text(head
                    + "TensorRT-LLM,1.0,Llama 4 Scout,,H200_SXM_141GB,H200,FP8,4,4,1,1000,1000,3000.0,9000.0,m,b,r,c,p\n"
                    + "TensorRT-LLM,1.0,Llama 4 Maverick,,B200_180GB,B200,FP4,8,8,1,1000,1000,3000.0,9000.0,m,b,r,c,p\n")
    scout, maverick = read_trtllm_throughput(path, PROFILES, SpecCache())
    for row in (scout, maverick):
        assert not row.skipped and row.sections is not None and row.family == "moe"
    assert scout.sections is not None and scout.sections["model"]["name"] == "meta-llama/Llama-4-Scout-17B-16E"
    assert (scout.suite, maverick.suite) == ("dev", "eval")
    assert scenario_from_dict(scout.sections, source="t.csv").model.moe is not None


def test_nvidia_pcie_rows_run_on_a_host_with_p2p_across_the_node(tmp_path: Path) -> None:
    """The l40s spec's GPUs are P2P in pairs (AIConfigurator's collection host); NVIDIA's published
    L40S rows run on a host with P2P across the node, and say so. NVLink rows are untouched."""
    path = tmp_path / "t.csv"
    head = ("engine,doc_version,model,model_hf,gpu,gpu_label,precision,num_gpus,tp,pp,isl,osl,num_requests,"
            "output_tok_per_s,metric,benchmark,source_repo,source_commit,source_path\n")
    path.write_text(head
                    + "TensorRT-LLM,0.17,Mixtral 8x7B,,L40S,L40S,FP8,8,8,1,1000,1000,3000.0,5948.0,m,b,r,c,p\n"
                    + "TensorRT-LLM,0.17,Mixtral 8x7B,,H100_SXM_80GB,H100,FP8,8,8,1,1000,1000,3000.0,9000.0,m,b,r,c,p\n"
                    + "TensorRT-LLM,0.14.0,Mixtral 8x7B,,A100_PCIE_80GB,A100,FP16,4,4,1,1000,1000,3000.0,4737.0,m,b,r,c,p\n")
    l40s, h100, a100_pcie = read_trtllm_throughput(path, PROFILES, SpecCache())
    assert a100_pcie.sections is not None
    assert a100_pcie.sections["hardware"] == {"name": "a100_pcie", "pcie_peer_group_size": 8}
    assert l40s.sections is not None and h100.sections is not None
    assert l40s.sections["hardware"] == {"name": "l40s", "pcie_peer_group_size": 8}
    assert any("pcie_peer_group_size = 8" in n for n in l40s.notes)
    assert scenario_from_dict(l40s.sections, source="t.csv").hardware.pcie_peer_group_size == 8
    assert h100.sections["hardware"] == {"name": "h100_sxm"}
    static = tmp_path / "s.csv"
    static.write_text(
        "engine,engine_version,gpu,gpu_label,precision,model,batch_size,tp,isl,kind,osl,out_tok_per_s_per_gpu,"
        "first_token_latency_ms\nT,0.9.0,L40S,L40S,FP8,Falcon 180B,64,8,128,peak_throughput,128,100,\n")
    (falcon,) = read_trtllm_static(static, PROFILES, SpecCache())
    assert falcon.sections is not None and falcon.sections["hardware"]["pcie_peer_group_size"] == 8
