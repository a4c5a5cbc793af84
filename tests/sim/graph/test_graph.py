"""Step-graph FLOPs and bytes: hand-computed attention sums and Llama-3.1-8B totals."""

from __future__ import annotations

import pytest
from conftest import scenario_dict

from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind
from sim.graph.memory import kv_bytes_per_token, weight_bytes_per_gpu
from sim.graph.moe import rank0_load
from sim.graph.transformer import attention_keys, pp_hops_across_domains
from sim.specs.scenario import scenario_from_dict


def llama8b(**engine: object) -> object:
    return scenario_from_dict(scenario_dict(engine=engine), source="test")


def test_attention_keys_causal_sum() -> None:
    assert attention_keys(4, 0, 0) == 1 + 2 + 3 + 4
    assert attention_keys(2, 3, 0) == 4 + 5


def test_attention_keys_with_window_caps_each_query() -> None:
    # queries see 1, 2, 3, 3, 3 keys with a window of 3
    assert attention_keys(5, 0, 3) == 1 + 2 + 3 + 3 + 3
    assert attention_keys(2, 10, 3) == 6


def test_balanced_routing_spreads_pairs_evenly_over_expert_ranks() -> None:
    # 1 token x top-2 over 8 experts: 2 pairs, 2 experts touched; 100 tokens touch all 8
    assert rank0_load(num_tokens=1, num_experts=8, topk=2, ep=1, routing="balanced").active_experts == 2.0
    load = rank0_load(num_tokens=100, num_experts=8, topk=2, ep=2, routing="balanced")
    assert (load.routed_pairs, load.active_experts) == (100.0, 4.0)


def test_llama8b_weights_match_parameter_count() -> None:
    sc = llama8b()
    params = sc.model.num_params()
    assert params == pytest.approx(8.03e9, rel=1e-3)
    weights = weight_bytes_per_gpu(sc.model, sc.engine, sc.precision)
    assert weights == pytest.approx(2 * params, rel=0.005)


def test_llama8b_prefill_flops_are_two_params_per_token_plus_attention() -> None:
    from sim.api import step_graph

    sc = llama8b()
    n = 2048
    graph = step_graph(sc, BatchShape(prefills=(PrefillChunk(new_tokens=n),)))
    m = sc.model
    # Every token goes through all non-embedding weights; one sampled token through the LM head.
    body = m.num_params() - m.embedding_params() - m.lm_head_params()
    attention = 4 * m.num_attention_heads * m.head_dim * (n * (n + 1) // 2) * m.num_layers
    expected = 2 * body * n + 2 * m.lm_head_params() * 1 + attention
    gemm_and_attn = sum(f for k, f in graph.flops_by_kind().items()
                        if k in (KernelKind.GEMM, KernelKind.ATTN_PREFILL))
    assert gemm_and_attn == pytest.approx(expected, rel=0.01)
    assert graph.total_flops() == pytest.approx(expected, rel=0.01)


def test_tp_shards_gemms_and_adds_all_reduces() -> None:
    from sim.api import step_graph

    one = step_graph(llama8b(), BatchShape(decode_context_tokens=(100,) * 8))
    two = step_graph(llama8b(tensor_parallel_size=2), BatchShape(decode_context_tokens=(100,) * 8))
    assert not any(n.work.kind is KernelKind.ALL_REDUCE for n in one.nodes)
    ar = [n for n in two.nodes if n.work.kind is KernelKind.ALL_REDUCE]
    assert sum(n.repeat for n in ar) == 1 + 2 * 32
    g1 = one.flops_by_kind()[KernelKind.GEMM]
    g2 = two.flops_by_kind()[KernelKind.GEMM]
    assert g2 == pytest.approx(g1 / 2, rel=0.01)


def test_decode_attention_reads_each_context_once() -> None:
    from sim.api import step_graph

    sc = llama8b()
    graph = step_graph(sc, BatchShape(decode_context_tokens=(99, 199)))
    node = next(n for n in graph.nodes if n.work.kind is KernelKind.ATTN_DECODE)
    per_token = 2 * 8 * 128 * 2  # K and V, 8 KV heads, head_dim 128, bf16
    assert node.work.kv_read_bytes == (100 + 200) * per_token
    assert node.repeat == 32
    assert kv_bytes_per_token(sc.model, sc.engine, sc.precision) == 32 * per_token


def test_lm_head_only_for_sampled_tokens() -> None:
    from sim.api import step_graph

    graph = step_graph(llama8b(), BatchShape(prefills=(PrefillChunk(new_tokens=512, samples=False),),
                                             decode_context_tokens=(10,) * 3))
    head = next(n for n in graph.nodes if n.work.name == "lm_head")
    assert head.work.shape[0] == 3


def test_moe_graph_has_one_fused_moe_node_and_deepep_all_to_all_with_ep() -> None:
    from sim.api import step_graph

    d = scenario_dict(model={"name": "mistralai/Mixtral-8x7B-v0.1"},
                      engine={"tensor_parallel_size": 2, "enable_expert_parallel": True, "moe_routing": "balanced"})
    sc = scenario_from_dict(d, source="test")
    graph = step_graph(sc, BatchShape(decode_context_tokens=(100,) * 16))
    kinds = [n.work.kind for n in graph.nodes]
    assert KernelKind.MOE_GEMM not in kinds and kinds.count(KernelKind.MOE) == 1
    moe = next(n for n in graph.nodes if n.work.kind is KernelKind.MOE)
    assert moe.repeat == 32 and moe.work.variant == "balanced"
    assert moe.work.shape == (16, 4096, 14336, 2, 8, 1, 2)
    # rank 0: 16 tokens x top-2 / EP 2 = 16 pairs over 4 local experts of full width
    assert moe.work.flops == 2 * 3 * 16 * 4096 * 14336
    assert moe.work.weight_bytes == 4 * 3 * 4096 * 14336 * 2
    # Without attention DP both ranks hold the whole batch: no token moves, and the layer's TP
    # all-reduce sums the two ranks' expert outputs (vLLM's use_all2all_kernels needs dp_size > 1).
    assert KernelKind.EP_ALL_TO_ALL not in kinds
    reduce = next(n for n in graph.nodes if n.work.name == "mlp_all_reduce")
    assert reduce.repeat == 32 and reduce.work.group_size == 2
    # Over attention-DP ranks the tokens travel by DeepEP: each rank dispatches its own 16.
    dp = scenario_from_dict(scenario_dict(model={"name": "mistralai/Mixtral-8x7B-v0.1"},
                                          engine={"data_parallel_size": 2, "enable_expert_parallel": True,
                                                  "moe_routing": "balanced"}), source="test")
    graph = step_graph(dp, BatchShape(decode_context_tokens=(100,) * 16))
    assert next(n for n in graph.nodes if n.work.kind is KernelKind.MOE).work.shape == (32, 4096, 14336, 2, 8, 1, 2)
    a2a = next(n for n in graph.nodes if n.work.kind is KernelKind.EP_ALL_TO_ALL)
    # FP8 dispatch + BF16 combine per selection
    assert a2a.work.shape == (16, 4096, 2, 8, 2, 1) and a2a.work.variant == "low_latency"
    assert a2a.work.comm_bytes == 16 * 2 * ((4096 + 4096 / 128 * 4 + 16) + 2 * 4096)
    prefill = step_graph(dp, BatchShape(prefills=(PrefillChunk(new_tokens=16),)))
    assert next(n for n in prefill.nodes if n.work.kind is KernelKind.EP_ALL_TO_ALL).work.variant == "normal"


def test_sliding_window_layers_get_their_own_attention_nodes() -> None:
    from sim.api import step_graph

    d = scenario_dict(model={"name": "openai/gpt-oss-120b"}, engine={"tensor_parallel_size": 4})
    sc = scenario_from_dict(d, source="test")
    graph = step_graph(sc, BatchShape(decode_context_tokens=(1000,)))
    names = {n.work.name: n.repeat for n in graph.nodes if n.work.kind is KernelKind.ATTN_DECODE}
    assert names == {"attn_decode": 18, "attn_decode_swa": 18}
    swa = next(n for n in graph.nodes if n.work.name == "attn_decode_swa")
    assert swa.work.shape[2] == 128


def test_pp_hops_leave_the_nvlink_domain_only_between_domains() -> None:
    # vLLM's layout: rank r of stage s on GPU s * tp + r.
    assert pp_hops_across_domains(tp=4, pp=2, domain=8) == 0  # both stages in one node
    assert pp_hops_across_domains(tp=8, pp=2, domain=8) == 1  # a node per stage
    assert pp_hops_across_domains(tp=4, pp=4, domain=8) == 1  # stages 1 -> 2 change nodes
    assert pp_hops_across_domains(tp=3, pp=4, domain=8) == 2  # stage 1's GPUs 3-5 send to 6-8: GPU 8 is next node
    assert pp_hops_across_domains(tp=8, pp=4, domain=72) == 0  # one NVL72 rack


@pytest.mark.parametrize(("hardware", "tp", "pp", "intra", "inter"),
                         [("h100_sxm", 4, 2, 1, 0), ("h100_sxm", 8, 2, 0, 1), ("h100_sxm", 4, 4, 2, 1),
                          ("gb200", 8, 2, 1, 0)])
def test_pipeline_hops_across_nodes_take_the_inter_node_link(hardware: str, tp: int, pp: int, intra: int,
                                                             inter: int) -> None:
    from sim.api import predict_step, step_graph
    from sim.perf.roofline import roofline

    sc = scenario_from_dict(scenario_dict(hardware={"name": hardware}, model={"name": "meta-llama/Llama-3.1-70B"},
                                          engine={"tensor_parallel_size": tp, "pipeline_parallel_size": pp}),
                            source="test")
    batch = BatchShape(decode_context_tokens=(500,) * 64)
    hops = {n.work.name: n for n in step_graph(sc, batch).nodes if n.work.kind is KernelKind.SEND_RECV}
    assert (hops["pp_send_recv"].repeat if "pp_send_recv" in hops else 0) == intra
    assert (hops["pp_send_recv_internode"].repeat if "pp_send_recv_internode" in hops else 0) == inter
    message = 2 * 64 * 8192 * 2 / tp  # hidden states and residual, bf16: each TP rank sends its slice (vLLM)
    for name, link in (("pp_send_recv", sc.hardware.intra_node_link),
                       ("pp_send_recv_internode", sc.hardware.inter_node_link)):
        if name in hops:
            assert hops[name].work.comm_bytes == message
            assert roofline(hops[name].work, sc.hardware).network_s == message / link.bandwidth_bytes_per_s
    if inter:
        # The fitted tiers price a hop between domains by NCCL's alpha-beta model over the network
        # (their collective residuals are fitted inside one node): slower than NVLink, near the link.
        from sim.perf.collective_model import nccl_time

        timing = predict_step(sc, batch)
        hop = next(k.estimate for k in timing.kernels if k.estimate.work.name == "pp_send_recv_internode")
        group = sc.hardware.nvlink_domain() + 1
        assert hop.work.group_size == group and hop.provenance.name == "EXTRAPOLATED"
        assert hop.time_s == pytest.approx(float(nccl_time("send_recv", message, group, sc.hardware).time_s[0]),
                                           rel=1e-12)
        link = sc.hardware.inter_node_link
        assert message / link.bandwidth_bytes_per_s < hop.time_s < 3 * (
            message / link.bandwidth_bytes_per_s) + 2 * link.latency_s  # a TP slice: latency shows


def _collectives(model: str, engine: dict[str, object], batch: BatchShape) -> dict[str, tuple[float, int]]:
    from sim.api import step_graph
    sc = scenario_from_dict(scenario_dict(model={"name": model}, engine={"max_model_len": 2048, **engine},
                                          perf={"tier": "roofline"}), source="test")
    return {n.work.name: (n.work.comm_bytes, n.repeat) for n in step_graph(sc, batch).nodes if n.work.kind.is_collective()}


def test_gpt_j_reduces_attention_and_mlp_each_falcon_once() -> None:
    """vLLM's GPT-J out_proj and fc_out are row-parallel layers that reduce their own outputs (two
    all-reduces a layer); Falcon's parallel layer turns that off and reduces the sum once."""
    batch = BatchShape(decode_context_tokens=(512,) * 8)
    gptj = _collectives("EleutherAI/gpt-j-6b", {"tensor_parallel_size": 2}, batch)
    assert gptj["attn_all_reduce"] == gptj["mlp_all_reduce"] == (8 * 4096 * 2, 28) and "layer_all_reduce" not in gptj
    falcon = _collectives("tiiuae/falcon-180B", {"tensor_parallel_size": 8}, batch)
    assert "layer_all_reduce" in falcon and "attn_all_reduce" not in falcon


def test_all_gathers_carry_the_gathered_buffer_and_pp_hops_send_a_tp_slice() -> None:
    """An all-gather's message is its gathered output (nccl-tests' and the tables' convention): the
    logits of the whole vocabulary; vLLM's pipeline hop sends each TP rank's 1/TP slice of the hidden
    state and residual, which the next stage all-gathers."""
    batch = BatchShape(decode_context_tokens=(512,) * 16)
    c = _collectives("meta-llama/Llama-3.1-8B", {"tensor_parallel_size": 4, "pipeline_parallel_size": 2}, batch)
    assert c["logits_all_gather"] == (16 * 128256 * 2, 1)  # 128,256 divides by 4
    assert c["pp_send_recv"] == (2 * 16 * 4096 * 2 / 4, 1)
    assert c["pp_recv_all_gather"] == (2 * 16 * 4096 * 2, 1)
