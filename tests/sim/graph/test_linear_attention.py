"""Gated DeltaNet hybrids (Qwen3.5): the kernel graph's linear and gated full-attention layers, the
per-request state in memory, and the running-request cap it sets."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import check_feasible, simulate
from sim.errors import ConfigError, InfeasibleScenario
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.linear_attention import CHUNK_TOKENS, decode_nodes, prefill_nodes
from sim.graph.memory import (
    attention_weight_bytes,
    kv_bytes_per_token,
    memory_breakdown,
    token_mixer_weight_bytes,
    weight_bytes_per_gpu,
)
from sim.graph.transformer import build_step_graph, is_attention_work
from sim.specs.scenario import Scenario, scenario_from_dict

QWEN35 = "Qwen/Qwen3.5-397B-A17B"


def _scenario(*, hardware: str = "h200_sxm", **engine: Any) -> Scenario:
    d = scenario_dict(hardware={"name": hardware}, model={"name": QWEN35},
                      engine={"tensor_parallel_size": 8, "quantization": "fp8_block", "max_model_len": 8192,
                              "backend": "sglang", **engine},
                      workload={"num_prompts": 40, "request_rate": 8.0, "random_input_len": 512,
                                "random_output_len": 64})
    return scenario_from_dict(d, source="t")


def _nodes(sc: Scenario, batch: BatchShape) -> dict[str, tuple[float, int]]:
    graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch)
    return {n.work.name: (n.work.flops, n.repeat) for n in graph.nodes}


def test_linear_layers_run_gated_deltanet_and_full_layers_run_gated_attention() -> None:
    sc = _scenario()
    nodes = _nodes(sc, BatchShape(prefills=(PrefillChunk(new_tokens=1024),)))
    # 45 Gated DeltaNet layers, 15 softmax-attention layers, every layer norm, all-reduce and MoE block.
    for name in ("in_proj_qkvz", "in_proj_ba", "gdn_conv1d", "gdn_chunk_state", "gdn_chunk_output", "out_proj"):
        assert nodes[name][1] == 45, name
    for name in ("qkv_proj", "attn_prefill", "attn_output_gate", "o_proj"):
        assert nodes[name][1] == 15, name
    assert nodes["input_layernorm"][1] == nodes["moe_experts"][1] == nodes["attn_all_reduce"][1] == 60
    assert nodes["gdn_qk_l2norm"][1] == 90  # q and k, two launches a layer
    # The shared expert's sigmoid gate (hidden -> 1) and its scaling, every MoE layer.
    assert nodes["shared_expert_gate"] == (2.0 * 1024 * 4096, 60) and nodes["shared_expert_gate_mul"][1] == 60
    # q_proj carries the output gate: (2 x 32 heads + 2 x 2 KV heads) x 256 over TP 8, KV heads replicated.
    assert nodes["qkv_proj"][0] == 2 * 1024 * ((2 * 4 + 2 * 1) * 256) * 4096
    # in_proj_qkvz: q, k (16 heads x 128) and v, z (64 heads x 128) over TP 8.
    assert nodes["in_proj_qkvz"][0] == 2 * 1024 * ((2 * 2 + 2 * 8) * 128) * 4096
    decode = _nodes(sc, BatchShape(decode_context_tokens=(2048,) * 32))
    assert decode["gdn_recurrent"][1] == 45 and "gdn_chunk_state" not in decode
    assert decode["attn_decode"][1] == 15


def test_gated_deltanet_work_is_independent_of_the_context_and_linear_in_tokens() -> None:
    sc = _scenario()
    chunk = {w.name: w for w, _ in prefill_nodes(sc.model, sc.precision, 8, new_tokens=CHUNK_TOKENS * 4, count=2)}
    double = {w.name: w for w, _ in prefill_nodes(sc.model, sc.precision, 8, new_tokens=CHUNK_TOKENS * 8, count=2)}
    # Per token and value head: 4 dk dv for the state pass; 8 value heads per rank at TP 8.
    assert chunk["gdn_chunk_state"].flops == 4.0 * (CHUNK_TOKENS * 4 * 2 * 8) * 128 * 128
    assert double["gdn_chunk_state"].flops == 2 * chunk["gdn_chunk_state"].flops
    # The recurrent state is read and written once per sequence whatever the chunk's length (fp32).
    state = 2 * 8 * 128 * 128 * 4
    assert chunk["gdn_chunk_state"].kv_read_bytes == double["gdn_chunk_state"].kv_read_bytes == state
    short = _nodes(sc, BatchShape(decode_context_tokens=(100,) * 16))
    long = _nodes(sc, BatchShape(decode_context_tokens=(7000,) * 16))
    assert short["gdn_recurrent"] == long["gdn_recurrent"] and short["attn_decode"] != long["attn_decode"]
    (conv, _), (recurrent, _) = decode_nodes(sc.model, sc.precision, 8, 16)
    assert recurrent.kv_read_bytes == recurrent.kv_write_bytes == 16 * 8 * 128 * 128 * 4
    assert all(is_attention_work(w) for w in (conv, recurrent))


def test_kv_cache_covers_the_full_attention_layers_and_the_state_pool_caps_running_requests() -> None:
    sc = _scenario()
    # 15 full-attention layers x (K + V) x one replicated KV head of 256 (2 KV heads < TP 8), bf16.
    assert kv_bytes_per_token(sc.model, sc.engine, sc.precision) == 15 * 2 * 256 * 2
    mem = memory_breakdown(sc.model, sc.engine, sc.precision, sc.hardware)
    # Per request and rank: 45 layers x (8 heads x 128 x 128 fp32 state + 1536 channels x 3 conv taps bf16).
    assert mem.state_bytes_per_request == 45 * (8 * 128 * 128 * 4 + 1536 * 3 * 2)
    # SGLang: (total - runtime) x mem_fraction_static less the weights (its activations and graphs live outside).
    assert mem.requested_bytes == int((mem.total_bytes - mem.runtime_overhead_bytes) * 0.9)
    cache = mem.requested_bytes - mem.weight_bytes
    pool = int(cache * 0.9 / 1.9)
    # With its radix cache on (prefix caching, the default), SGLang runs a third as many requests as it has slots.
    assert mem.max_state_requests == pool // mem.state_bytes_per_request // 3
    assert mem.kv_cache_bytes == cache - pool
    assert mem.running_request_cap(64) == 64
    assert mem.running_request_cap(10**6) == mem.max_state_requests
    # A smaller state share holds fewer requests and leaves more KV cache.
    low = _scenario(mamba_full_memory_ratio=0.1)
    low_mem = memory_breakdown(low.model, low.engine, low.precision, low.hardware)
    assert low_mem.max_state_requests is not None and mem.max_state_requests is not None
    assert low_mem.max_state_requests < mem.max_state_requests and low_mem.num_kv_blocks > mem.num_kv_blocks


def test_weights_count_both_kinds_of_token_mixer() -> None:
    sc = _scenario()
    per_gpu = weight_bytes_per_gpu(sc.model, sc.engine, sc.precision)
    # fp8 block weights: ~397 GB of parameters, mostly experts at one byte, over 8 GPUs (~50 GB each).
    assert 45e9 < per_gpu < 60e9
    # One Gated DeltaNet layer on one of 8 ranks, by hand: in_proj_qkvz (4096 -> 2 x 256 + 2 x 1024) and
    # out_proj (1024 -> 4096) in FP8; in_proj_ba (4096 -> 16), the conv (1,536 x 4), A_log and dt_bias
    # (8 each), the gated norm (128) and the two layer norms (2 x 4096) in bf16.
    linear = 4096 * 2560 + 1024 * 4096 + 2 * (4096 * 16 + 1536 * 4 + 16 + 128 + 2 * 4096)
    attn = attention_weight_bytes(sc.model, sc.engine, sc.precision)
    assert token_mixer_weight_bytes(sc.model, sc.engine, sc.precision) * 60 == pytest.approx(15 * attn + 45 * linear)
    # The gated attention layer's q_proj is twice as wide: 4 heads of 256 per rank, plus the gate.
    assert attn == 4096 * (2 * 1024 + 2 * 256) + 1024 * 4096 + 2 * 2 * 4096 + 2 * 2 * 256


def test_a_state_pool_that_holds_no_request_is_infeasible_and_names_the_key() -> None:
    sc = _scenario(hardware="b200_sxm", tensor_parallel_size=4, mamba_full_memory_ratio=1e-6)
    with pytest.raises(InfeasibleScenario) as err:
        check_feasible(sc)
    assert err.value.key == "engine.mamba_full_memory_ratio"


def test_tensor_parallelism_must_divide_the_gated_deltanet_heads() -> None:
    with pytest.raises(ConfigError) as err:
        _scenario(hardware="b200_sxm", tensor_parallel_size=32)  # divides 32 query heads, not 16 key heads
    assert err.value.key == "engine.tensor_parallel_size" and "linear_num_key_heads=16" in err.value.rule


def test_disaggregated_hybrid_models_are_refused_with_a_reason() -> None:
    d = scenario_dict(model={"name": QWEN35}, hardware={"name": "h200_sxm"},
                      engine={"tensor_parallel_size": 8, "quantization": "fp8_block"},
                      disaggregation={"prefill": {"num_workers": 1}, "decode": {"num_workers": 1}})
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d, source="t")
    assert err.value.key == "disaggregation" and "linear-attention" in err.value.rule


def test_speculative_decoding_on_a_hybrid_model_is_refused_with_a_reason() -> None:
    d = scenario_dict(model={"name": QWEN35}, hardware={"name": "h200_sxm"},
                      engine={"tensor_parallel_size": 8, "quantization": "fp8_block",
                              "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}})
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(d, source="t")
    assert err.value.key == "engine.speculative_config.method" and "linear-attention" in err.value.rule


def test_a_hybrid_model_simulates_end_to_end() -> None:
    result = simulate(_scenario())
    assert result.summary.num_requests == 40
    assert result.summary.ttft_median_s > 0 and result.summary.tpot_median_s > 0
    names = set(result.breakdown.seconds_by_name)
    assert {"gdn_recurrent", "gdn_chunk_state", "attn_decode", "moe_experts"} <= names


def test_a_small_state_pool_limits_the_running_requests_of_a_simulation() -> None:
    roomy = _scenario()
    tight = _scenario(mamba_full_memory_ratio=2e-3)  # a few slots: a third of them run (radix cache on)
    mem = memory_breakdown(tight.model, tight.engine, tight.precision, tight.hardware)
    assert mem.max_state_requests is not None and 1 <= mem.max_state_requests <= 3
    a, b = simulate(roomy), simulate(tight)
    # With at most a few requests running, the others queue: first tokens come much later.
    assert b.summary.ttft_mean_s > 3 * a.summary.ttft_mean_s


def test_without_its_radix_cache_sglang_keeps_one_state_per_running_request() -> None:
    # `--disable-radix-cache`: handle_max_mamba_cache sizes the state pool at --max-running-requests
    # and gives the KV cache the rest, whatever mamba_full_memory_ratio says.
    sc = _scenario(enable_prefix_caching=False, max_num_seqs=256)
    mem = memory_breakdown(sc.model, sc.engine, sc.precision, sc.hardware)
    assert mem.max_state_requests == 256 and mem.running_request_cap(1024) == 256
    assert mem.kv_cache_bytes == mem.requested_bytes - mem.weight_bytes - 256 * mem.state_bytes_per_request
    other = _scenario(enable_prefix_caching=False, max_num_seqs=256, mamba_full_memory_ratio=0.1)
    assert memory_breakdown(other.model, other.engine, other.precision, other.hardware).kv_cache_bytes \
        == mem.kv_cache_bytes
