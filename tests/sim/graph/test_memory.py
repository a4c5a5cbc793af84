"""KV-cache capacity computed the way vLLM does, checked against a real vLLM run."""

from __future__ import annotations

import csv
from typing import Any

import pytest
from conftest import MEASURED_DATA, REPO, scenario_dict

from sim.api import check_feasible, load_scenario
from sim.errors import InfeasibleScenario
from sim.graph.memory import (
    attention_weight_bytes,
    memory_breakdown,
    moe_block_weight_bytes,
    stage_layer_ranges,
    weight_bytes_per_gpu,
)
from sim.measured import open_text
from sim.serde import parse_override
from sim.specs.scenario import scenario_from_dict


def test_rtx4090_llama8b_kv_blocks_within_3pct_of_measured() -> None:
    runs = MEASURED_DATA / "e2e" / "llmservingsim_vllm_traces" / "runs.csv"
    with open_text(runs) as f:
        run = next(r for r in csv.DictReader(f) if r["run_id"] == "RTX4090__Llama-3.1-8B")
    measured = float(run["num_gpu_blocks"])
    d = scenario_dict(
        hardware={"name": "rtx_4090"},
        engine={"max_num_seqs": int(run["max_num_seqs"]), "max_num_batched_tokens": int(run["max_num_batched_tokens"]),
                "max_model_len": int(float(run["max_model_len"])), "block_size": int(float(run["block_size"])),
                "gpu_memory_utilization": float(run["gpu_memory_utilization"])},
    )
    sc = scenario_from_dict(d, source="test")
    mem = memory_breakdown(sc.model, sc.engine, sc.precision, sc.hardware)
    assert mem.num_kv_blocks == pytest.approx(measured, rel=0.03)


def test_more_memory_utilization_means_more_blocks() -> None:
    low = scenario_from_dict(scenario_dict(engine={"gpu_memory_utilization": 0.5}), source="t")
    high = scenario_from_dict(scenario_dict(engine={"gpu_memory_utilization": 0.9}), source="t")
    m_low = memory_breakdown(low.model, low.engine, low.precision, low.hardware)
    m_high = memory_breakdown(high.model, high.engine, high.precision, high.hardware)
    extra = (0.4 * m_high.total_bytes) // (m_high.kv_bytes_per_token * 16)
    assert m_high.num_kv_blocks - m_low.num_kv_blocks == pytest.approx(extra, abs=1)


def test_fp8_kv_cache_halves_bytes_per_token() -> None:
    auto = scenario_from_dict(scenario_dict(), source="t")
    fp8 = scenario_from_dict(scenario_dict(engine={"kv_cache_dtype": "fp8"}), source="t")
    a = memory_breakdown(auto.model, auto.engine, auto.precision, auto.hardware)
    b = memory_breakdown(fp8.model, fp8.engine, fp8.precision, fp8.hardware)
    assert b.kv_bytes_per_token * 2 == a.kv_bytes_per_token


def test_pipeline_stages_split_layers_as_each_engine_does() -> None:
    def sizes(n: int, pp: int, backend: str) -> list[int]:
        ranges = stage_layer_ranges(n, pp, backend)
        assert [r.start for r in ranges[1:]] == [r.stop for r in ranges[:-1]] and ranges[-1].stop == n
        return [len(r) for r in ranges]

    assert sizes(61, 2, "vllm") == [31, 30] and sizes(32, 3, "sglang") == [11, 11, 10]
    assert sizes(94, 4, "vllm") == [23, 24, 24, 23] and sizes(94, 4, "trtllm") == [24, 24, 23, 23]
    assert sizes(80, 4, "vllm") == [20] * 4


def test_the_most_loaded_pipeline_stage_of_deepseek_holds_its_moe_layers() -> None:
    """DeepSeek-R1 at TP 4 x PP 2 under vLLM: stage 0 holds the three dense layers and 28 MoE layers
    with the embedding, stage 1 30 MoE layers with the LM head, the heavier one (before 0.6.2 the MoE
    layers were spread evenly: 1.18 GiB short)."""
    sc = load_scenario(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml",
                       dict(parse_override(s) for s in ["engine.tensor_parallel_size=4",
                                                        "engine.pipeline_parallel_size=2"]))
    m, e, p = sc.model, sc.engine, sc.precision
    attn = attention_weight_bytes(m, e, p)
    moe = moe_block_weight_bytes(m, e, p)
    vocab = -(-m.vocab_size // 4) * m.hidden_size * p.activation_dtype.bytes_per_element()
    stage1 = 30 * attn + 30 * moe + vocab + m.hidden_size * p.activation_dtype.bytes_per_element()
    assert weight_bytes_per_gpu(m, e, p) == int(stage1)


def test_an_expert_parallel_size_that_does_not_divide_the_experts_prices_the_busiest_rank() -> None:
    """vLLM's `determine_expert_map` gives the first E % EP ranks one expert more: Mixtral's 8
    experts over EP 3 put 3 on rank 0, which is sized and priced (before simulator 0.6.3 such a layout
    was refused)."""
    from sim.api import load_scenario, predict_step, scenario_memory
    from sim.graph.batch import BatchShape

    def scenario(dp: int) -> Any:
        return load_scenario(REPO / "scenarios" / "mixtral_8x7b-h100-tp2.toml", {
            "engine.tensor_parallel_size": 1, "engine.data_parallel_size": dp, "engine.enable_expert_parallel": True,
            "perf.tier": "roofline"})

    expert = 3 * 4096 * 14336 * 2  # one Mixtral expert, bf16
    by_dp = {dp: scenario_memory(scenario(dp)).weight_bytes for dp in (2, 3, 4)}
    assert by_dp[2] - by_dp[3] == pytest.approx(32 * expert, rel=1e-9)  # 4 -> 3 experts a rank, 32 layers
    assert by_dp[3] - by_dp[4] == pytest.approx(32 * expert, rel=1e-9)  # 3 -> 2
    batch = BatchShape(decode_context_tokens=(1000,) * 64)
    moe_s = {dp: sum(k.total_s() for k in predict_step(scenario(dp), batch).kernels if k.estimate.work.kind.value == "moe")
             for dp in (2, 3, 4)}
    assert moe_s[2] > moe_s[3] > moe_s[4]


def test_sglang_sizes_its_pool_from_mem_fraction_static_less_the_weights_only() -> None:
    # SGLang's profile_max_num_token: rest = free after the weights - free before x (1 - mem_fraction_static);
    # the activations and CUDA graphs live in the 1 - mem_fraction_static it leaves, unprofiled.
    def mem(backend: str) -> Any:
        sc = scenario_from_dict(scenario_dict(engine={"backend": backend, "gpu_memory_utilization": 0.88}), source="t")
        return memory_breakdown(sc.model, sc.engine, sc.precision, sc.hardware)

    sglang, vllm = mem("sglang"), mem("vllm")
    assert not sglang.overheads_in_budget and vllm.overheads_in_budget
    assert sglang.requested_bytes == int((sglang.total_bytes - sglang.runtime_overhead_bytes) * 0.88)
    assert sglang.kv_cache_bytes == sglang.requested_bytes - sglang.weight_bytes
    assert sglang.num_kv_blocks == sglang.kv_cache_bytes // (sglang.kv_bytes_per_token * 16)
    assert sglang.static_bytes() == sglang.weight_bytes
    # vLLM takes its profiled activation peak, CUDA graphs and runtime out of the same fraction.
    assert vllm.kv_cache_bytes == vllm.requested_bytes - vllm.static_bytes()
    gap = vllm.activation_peak_bytes + vllm.cuda_graph_bytes + int(0.12 * vllm.runtime_overhead_bytes)
    assert sglang.kv_cache_bytes - vllm.kv_cache_bytes == pytest.approx(gap, abs=2)


def test_an_sglang_engine_whose_weights_fit_its_fraction_is_feasible_where_vllm_is_not() -> None:
    # Llama-3.1-8B on an L4 at 0.7: 14.96 GiB of weights under SGLang's (22.5 - 0.5) x 0.7 = 15.4 GiB, so
    # SGLang starts with a small pool; vLLM also subtracts its 1.2 GiB of activations and runtime and refuses.
    def scenario(backend: str) -> Any:
        return scenario_from_dict(scenario_dict(hardware={"name": "l4"}, engine={
            "backend": backend, "gpu_memory_utilization": 0.7, "max_model_len": 1024}), source="t")

    mem = check_feasible(scenario("sglang"))
    assert mem.kv_capacity_tokens() > 1024
    with pytest.raises(InfeasibleScenario) as err:
        check_feasible(scenario("vllm"))
    assert "activations and runtime" in err.value.rule
