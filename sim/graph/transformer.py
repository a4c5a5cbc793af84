"""The kernels one serving step launches, for dense and MoE decoders under TP/PP/EP/attention DP.

The graph follows one batch along the critical path: every layer (spread over the pipeline
stages, which run one after another for a given batch), with TP-sharded shapes on one GPU, the
collectives between them, and the LM head and sampler for sampled tokens only. Kernel choices
follow vLLM's Llama/Qwen/Mixtral implementations: fused QKV and gate-up projections, fused
residual-add RMSNorm, RoPE in place, SiLU-and-mul, one vocab-parallel embedding and LM head.

FLOP and byte counts are the compulsory work: GEMM 2mnk FLOPs with each operand read once;
attention 4 x heads x head_dim FLOPs per (query, key) pair with K/V read once. Multi-head latent
attention is `sim.graph.mla`; the MoE layer is one fused `MOE` node per layer on the most loaded
rank plus the expert all-to-all (`sim.graph.moe`). Hybrid models (Qwen3.5, Qwen3-Next) run Gated
DeltaNet in their linear layers (`sim.graph.linear_attention`) and gated softmax attention (the
output multiplied by sigmoid of q_proj's second half) in the others.

MoE layouts (vLLM): the MoE layers run over the TP x DP GPUs of a replica as moe_tp x moe_ep
(`EngineParams.moe_tp_size`, `expert_parallel_size`); attention runs per data-parallel rank with
attention TP = `tensor_parallel_size`. Each DP rank's batch is assumed alike, so an MoE layer sees
num_tokens = step tokens x DP. With expert parallelism over DP > 1 the tokens travel by DeepEP
all-to-all (each attention-TP rank dispatches its 1/TP slice; vLLM then all-gathers the slices
over TP at the layer's end instead of all-reducing, `sim.graph.moe.sequence_parallel_moe`;
TensorRT-LLM all-gathers them and reduce-scatters the outputs, `sim.graph.moe.trtllm_gathers_expert_tokens`); with it
and DP = 1 every rank holds
the whole batch and the layer's TP all-reduce sums the experts' partial outputs
(`sim.graph.moe.uses_expert_all_to_all`); without it and DP > 1 they are all-gathered over the DP
group before the experts and reduce-scattered after (vLLM's naive DP dispatch).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sim.dtypes import DType
from sim.graph import linear_attention, mla
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelGraph, KernelKind, KernelNode, KernelWork, gemm_work, pointwise_work
from sim.graph.moe import (
    TRTLLM_GATHER_BYTES_PER_ELEMENT,
    ep_all_to_all_work,
    eplb_routing,
    expert_all_to_all,
    moe_work,
    multi_node_nvlink,
    sequence_parallel_moe,
    trtllm_gathers_expert_tokens,
)
from sim.graph.shared_experts import beside_variant, shared_expert_token_limit
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardedShapes:
    """Per-GPU widths under tensor and expert parallelism."""

    tp: int
    pp: int
    ep: int
    moe_tp: int
    dp: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    mlp_width: int
    vocab: int
    local_experts: int
    expert_width: int
    shared_width: int

    @staticmethod
    def of(model: ModelSpec, engine: EngineParams) -> ShardedShapes:
        tp, ep, moe_tp = engine.tensor_parallel_size, engine.expert_parallel_size(), engine.moe_tp_size()
        moe = model.moe
        if moe is None:
            local_experts = expert_width = shared_width = 0
        else:
            # EP rank 0 holds ceil(E / EP) experts (vLLM's `determine_expert_map`): the busiest rank.
            local_experts, expert_width = -(-moe.num_experts // ep), moe.expert_intermediate_size // moe_tp
            shared_width = moe.shared_expert_intermediate_size // tp
        return ShardedShapes(
            tp=tp,
            pp=engine.pipeline_parallel_size,
            ep=ep,
            moe_tp=moe_tp,
            dp=engine.data_parallel_size,
            q_heads=model.num_attention_heads // tp,
            # KV heads are replicated when there are fewer than TP ranks.
            kv_heads=max(1, model.num_kv_heads // tp),
            head_dim=model.head_dim,
            hidden=model.hidden_size,
            mlp_width=model.intermediate_size // tp,
            vocab=-(-model.vocab_size // tp),
            local_experts=local_experts,
            expert_width=expert_width,
            shared_width=shared_width,
        )


def pp_hops_leaving_domains(tp: int, pp: int, domain: int) -> list[bool]:
    """Per stage-to-stage hop (stage s to s + 1, s < pp - 1), whether it leaves an NVLink domain of
    `domain` GPUs, with vLLM's rank layout (tensor parallelism innermost: rank r of stage s is GPU
    s * tp + r). A hop crosses when any rank's pair of GPUs lies in two domains."""
    return [any((stage * tp + r) // domain != ((stage + 1) * tp + r) // domain for r in range(tp))
            for stage in range(pp - 1)]


def pp_hops_across_domains(tp: int, pp: int, domain: int) -> int:
    """How many of a pipeline's `pp - 1` stage-to-stage hops leave an NVLink domain of `domain`
    GPUs (`pp_hops_leaving_domains`)."""
    return sum(pp_hops_leaving_domains(tp, pp, domain))


def collective_work(kind: KernelKind, name: str, message_bytes: float, group: int) -> KernelWork:
    """A collective over `group` GPUs. Send/recv (pipeline hops) is point to point: its group is 2
    inside an NVLink domain and `domain + 1`, the smallest group that leaves the domain, for a hop
    between domains, which is what makes every pricing path take the inter-node link for it
    (`HardwareSpec.link_for_group`, the collective model's intra/inter choice)."""
    return KernelWork(kind=kind, name=name, dtype=DType.BFLOAT16, comm_bytes=message_bytes,
                      group_size=group, shape=(int(message_bytes), group))


def attention_keys(new_tokens: int, context_tokens: int, window: int) -> int:
    """Sum over the chunk's queries of the keys each attends to (causal, optional window)."""
    first, last = context_tokens + 1, context_tokens + new_tokens
    if window <= 0 or window >= last:
        return (first + last) * new_tokens // 2
    if window <= first:
        return window * new_tokens
    # Queries up to `window` keys grow linearly, the rest are capped at `window`.
    growing = window - first + 1
    return (first + window) * growing // 2 + window * (new_tokens - growing)


def prefill_attention_work(*, batch: int, new_tokens: int, context_tokens: int, heads: int,
                           kv_heads: int, head_dim: int, window: int, act: DType, kv: DType) -> KernelWork:
    """`batch` identical prompt chunks, each attending to its cached context and itself."""
    keys = attention_keys(new_tokens, context_tokens, window)
    span = new_tokens + context_tokens
    visible = span if window <= 0 else min(span, window + new_tokens - 1)
    kv_row = 2 * kv_heads * head_dim * kv.bytes_per_element()
    return KernelWork(
        kind=KernelKind.ATTN_PREFILL, name="attn_prefill" if window <= 0 else "attn_prefill_swa",
        dtype=act,
        flops=4.0 * heads * head_dim * keys * batch,
        activation_bytes=2.0 * new_tokens * heads * head_dim * act.bytes_per_element() * batch,
        kv_read_bytes=float(visible * kv_row * batch),
        kv_write_bytes=float(new_tokens * kv_row * batch),
        shape=(batch, new_tokens, context_tokens, heads, kv_heads, head_dim, window),
    )


def decode_attention_work(*, contexts: tuple[int, ...] | Mapping[int, int], heads: int, kv_heads: int,
                          head_dim: int, window: int, act: DType, kv: DType) -> KernelWork:
    """One new token per request attending to its cached context plus itself; `contexts` per
    request, or as {context: requests} (the same work, without a tuple of every request)."""
    counts = contexts if isinstance(contexts, Mapping) else Counter(contexts)
    spans = {c: c + 1 if window <= 0 else min(c + 1, window) for c in counts}
    total = sum(spans[c] * k for c, k in counts.items())
    kv_row = 2 * kv_heads * head_dim * kv.bytes_per_element()
    batch = sum(counts.values())
    return KernelWork(
        kind=KernelKind.ATTN_DECODE, name="attn_decode" if window <= 0 else "attn_decode_swa",
        dtype=act,
        flops=4.0 * heads * head_dim * total,
        activation_bytes=2.0 * batch * heads * head_dim * act.bytes_per_element(),
        kv_read_bytes=float(total * kv_row),
        kv_write_bytes=float(batch * kv_row),
        shape=(batch, round(total / batch), max(spans.values()), heads, kv_heads, head_dim, window),
    )


def is_attention_work(work: KernelWork) -> bool:
    """Whether a kernel belongs to an attention part: its work depends on the attended context."""
    return (work.kind in _ATTENTION_KINDS or work.name in mla.ATTENTION_GEMM_NAMES
            or work.name in linear_attention.ATTENTION_NAMES)


_ATTENTION_KINDS = frozenset({KernelKind.ATTN_PREFILL, KernelKind.ATTN_DECODE, KernelKind.MLA_PREFILL,
                              KernelKind.MLA_DECODE, KernelKind.MLA_BMM})


def prefill_attention_nodes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec, hw: HardwareSpec,
                            *, new_tokens: int, context_tokens: int, count: int) -> list[tuple[KernelWork, int]]:
    """Attention kernels of `count` alike prompt chunks over every layer, as (work, repeat); a step
    prices a one-token chunk as a decode where the engine runs it as one
    (`one_token_chunks_decode`)."""
    if model.mla is not None:
        return mla.prefill_nodes(model, precision, hw, engine.tensor_parallel_size, new_tokens=new_tokens,
                                 context_tokens=context_tokens, count=count)
    s = ShardedShapes.of(model, engine)
    nodes = [(prefill_attention_work(
        batch=count, new_tokens=new_tokens, context_tokens=context_tokens, heads=s.q_heads,
        kv_heads=s.kv_heads, head_dim=s.head_dim, window=window, act=precision.activation_dtype,
        kv=precision.kv_cache_dtype), layers)
        for window, layers in sorted(Counter(model.attention_layer_windows()).items())]
    if model.linear_attention is not None:
        nodes += linear_attention.prefill_nodes(model, precision, s.tp, new_tokens=new_tokens, count=count)
    return nodes


def one_token_chunks_decode(model: ModelSpec, engine: EngineParams) -> bool:
    """Whether the engine runs a one-token prompt chunk (a prompt cached but for its last token: a
    full prefix-cache hit, a disaggregated decode worker's admission) through its decode attention:
    vLLM's MLA backends do (`reorder_batch_threshold` >= 1 puts short queries in the decode batch,
    absorbed over the latent cache), where the prefill path would decompress the whole cached
    context (`mla_kv_b_proj` over it). Other attention prices the chunk alike either way."""
    return model.mla is not None and engine.backend == "vllm"


def chunks_as_decodes(batch: BatchShape) -> BatchShape:
    """`batch` with its one-token chunks that sample, at a context of at least one token, moved to its
    decodes (`one_token_chunks_decode`: the engine batches them with the decodes; a step of them and
    decodes only is a uniform decode step, run as one)."""
    joining = [p for p in batch.prefills if p.new_tokens == 1 and p.samples and p.context_tokens >= 1]
    if not joining:
        return batch
    return BatchShape(prefills=tuple(p for p in batch.prefills if p not in joining),
                      decode_context_tokens=batch.decode_context_tokens + tuple(p.context_tokens for p in joining))


def decode_attention_nodes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                           contexts: tuple[int, ...] | Mapping[int, int]) -> list[tuple[KernelWork, int]]:
    """Attention kernels of one decode token per request over every layer, as (work, repeat);
    `contexts` per request or as {context: requests} (`decode_attention_work`)."""
    counts = contexts if isinstance(contexts, Mapping) else Counter(contexts)
    if model.mla is not None:
        return mla.decode_nodes(model, precision, engine.tensor_parallel_size, counts)
    s = ShardedShapes.of(model, engine)
    nodes = [(decode_attention_work(
        contexts=counts, heads=s.q_heads, kv_heads=s.kv_heads, head_dim=s.head_dim, window=window,
        act=precision.activation_dtype, kv=precision.kv_cache_dtype), layers)
        for window, layers in sorted(Counter(model.attention_layer_windows()).items())]
    if model.linear_attention is not None:
        nodes += linear_attention.decode_nodes(model, precision, s.tp, sum(counts.values()))
    return nodes


def verify_attention_nodes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec, hw: HardwareSpec,
                           *, num_requests: int, context_tokens: int, num_query_tokens: int
                           ) -> list[tuple[KernelWork, int]]:
    """Attention of speculative verification, every layer: each of `num_requests` requests runs
    `num_query_tokens` = k + 1 queries (its last sampled token and k drafts) against its cached
    context and causally among themselves. GQA/MHA: vLLM's FlashAttention / FlashInfer backends run
    queries longer than one token through their prefill (varlen) kernel, so the work is an
    `ATTN_PREFILL` of `num_requests` alike (k + 1)-token chunks, named `attn_verify`. MLA:
    `sim.graph.mla.verify_nodes` (FlashMLA takes several queries per request)."""
    if model.mla is not None:
        return mla.verify_nodes(model, precision, engine.tensor_parallel_size, num_requests=num_requests,
                                context_tokens=context_tokens, num_query_tokens=num_query_tokens)
    nodes = prefill_attention_nodes(model, engine, precision, hw, new_tokens=num_query_tokens,
                                    context_tokens=context_tokens, count=num_requests)
    return [(dataclasses.replace(w, name=w.name.replace("attn_prefill", "attn_verify")), r) for w, r in nodes]


def build_step_graph(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                     hw: HardwareSpec, batch: BatchShape, *, decode_only: bool | None = None) -> KernelGraph:
    """Kernels of one step for `batch`, on one GPU of each pipeline stage in turn. `decode_only`
    (default: the batch has no prompt chunk) is whether the step launches as a decode-only step
    does (the expert all-to-all in low-latency mode, CUDA-graph-only stream overlap); the pricer
    builds a decode-only step's token kernels from a batch of that many prompt tokens."""
    if one_token_chunks_decode(model, engine):
        batch = chunks_as_decodes(batch)
    if decode_only is None:
        decode_only = not batch.prefills
    s = ShardedShapes.of(model, engine)
    act = precision.activation_dtype
    lin_w = precision.linear_weight_dtype
    lin_c = precision.gemm_compute_dtype(lin_w, hw)
    t = batch.num_tokens()
    h = s.hidden
    act_b = act.bytes_per_element()
    nodes: list[KernelNode] = []

    def add(work: KernelWork, repeat: int = 1) -> None:
        nodes.append(KernelNode(work=work, repeat=repeat))

    def all_reduce(name: str, repeat: int) -> None:
        if s.tp > 1:
            add(collective_work(KernelKind.ALL_REDUCE, name, t * h * act_b, s.tp), repeat)

    num_layers = model.num_layers
    # Softmax-attention layers; the rest of a hybrid model's layers run linear attention.
    attn_layers = model.num_attention_layers()
    add(pointwise_work(KernelKind.EMBEDDING, "embedding", t, h, act, passes=2.0, flops_per_element=0.0))
    all_reduce("embedding_all_reduce", 1)

    add(pointwise_work(KernelKind.NORM, "input_layernorm", t, h, act, passes=4.0, flops_per_element=4.0), num_layers)
    linear_after: list[tuple[KernelWork, int]] = []
    if model.linear_attention is not None:
        linear_before, linear_after = linear_attention.token_nodes(model, precision, hw, s.tp, t)
        for work, repeat in linear_before:
            add(work, repeat)
    if model.mla is not None:
        projections = mla.projection_nodes(model, precision, hw, s.tp, t)
        for work, repeat in projections[:-1]:
            add(work, repeat)
    else:
        gate_n = s.q_heads * s.head_dim if model.attn_output_gate else 0
        qkv_n = (s.q_heads + 2 * s.kv_heads) * s.head_dim + gate_n
        add(gemm_work("qkv_proj", t, qkv_n, h, weight_dtype=lin_w, act_dtype=act, compute_dtype=lin_c), attn_layers)
        if model.qk_norm:
            add(pointwise_work(KernelKind.NORM, "qk_norm", t, (s.q_heads + s.kv_heads) * s.head_dim, act,
                           passes=2.0, flops_per_element=4.0), attn_layers)
            # MiniMax-M2's norms over all heads (`qk_norm_across_heads`) all-reduce each token's q and k
            # variances under TP in vLLM; priced as a node here that put the dev MiniMax-M2.5 rows' TPOT
            # 9.2% -> 12.0% off (docs/moe-mla.md): not adopted, the tiny collective left out.
        add(pointwise_work(KernelKind.ELEMENTWISE, "rotary_emb", t, (s.q_heads + s.kv_heads) * s.head_dim, act,
                       passes=2.0, flops_per_element=3.0), attn_layers)
    as_decode = one_token_chunks_decode(model, engine)
    for chunk, count in sorted(Counter(batch.prefills).items(),
                               key=lambda kv: (kv[0].new_tokens, kv[0].context_tokens, kv[0].samples)):
        attention = (decode_attention_nodes(model, engine, precision, {chunk.context_tokens: count})
                     if as_decode and chunk.new_tokens == 1 else
                     prefill_attention_nodes(model, engine, precision, hw, new_tokens=chunk.new_tokens,
                                             context_tokens=chunk.context_tokens, count=count))
        for work, repeat in attention:
            add(work, repeat)
    if batch.decode_context_tokens:
        for work, repeat in decode_attention_nodes(model, engine, precision, batch.decode_context_tokens):
            add(work, repeat)
    for work, repeat in linear_after:
        add(work, repeat)
    if model.mla is not None:
        add(*projections[-1])
    else:
        if model.attn_output_gate:
            add(pointwise_work(KernelKind.ELEMENTWISE, "attn_output_gate", t, s.q_heads * s.head_dim, act,
                           passes=3.0, flops_per_element=5.0), attn_layers)
        add(gemm_work("o_proj", t, h, s.q_heads * s.head_dim, weight_dtype=lin_w, act_dtype=act,
                      compute_dtype=lin_c), attn_layers)
    # vLLM's Falcon parallel layer reduces its attention and MLP partial outputs once
    # (`reduce_row_parallel_results` off); GPT-J's out_proj and fc_out reduce each their own.
    one_reduce = model.parallel_attention and model.model_type != "gptj"
    if not one_reduce:
        all_reduce("attn_all_reduce", num_layers)
    if model.layer_norms_per_layer == 2:
        # The MLP's norm: after attention, or beside the input norm of a parallel layer (Falcon).
        add(pointwise_work(KernelKind.NORM, "post_attention_layernorm", t, h, act, passes=4.0,
                       flops_per_element=4.0), num_layers)

    num_moe = model.num_moe_layers()
    num_dense = num_layers - num_moe
    if num_dense:
        _dense_mlp(add, "mlp", t, h, s.mlp_width, lin_w, act, lin_c, num_dense, gated=model.mlp_gated)
    if num_moe:
        _moe_block(add, model, engine, precision, hw, s, t, num_moe, decode_only=decode_only)
    if num_moe and s.tp > 1 and sequence_parallel_moe(engine):
        # vLLM's sequence-parallel MoE: the MoE layers gather their TP ranks' token slices (an
        # all-gather's message is its output buffer); the dense layers keep the all-reduce.
        if num_dense:
            all_reduce("layer_all_reduce" if one_reduce else "mlp_all_reduce", num_dense)
        add(collective_work(KernelKind.ALL_GATHER, "moe_tp_all_gather", t * h * act_b, s.tp), num_moe)
    else:
        all_reduce("layer_all_reduce" if one_reduce else "mlp_all_reduce", num_layers)

    if s.pp > 1:
        # vLLM sends hidden states and the residual to the next stage, over NVLink inside an NVLink
        # domain (a node, or an NVL72 rack) and over the inter-node network between domains. With
        # TP > 1 each rank sends its 1/TP slice and the next stage all-gathers it over its TP group
        # (`send_tensor_dict` / `recv_tensor_dict(all_gather_group=tp_group)`).
        domain = hw.nvlink_domain()
        across = pp_hops_across_domains(s.tp, s.pp, domain)
        hop = 2 * t * h * act_b
        sliced = engine.backend == "vllm" and s.tp > 1
        send = hop / s.tp if sliced else hop
        if s.pp - 1 - across:
            add(collective_work(KernelKind.SEND_RECV, "pp_send_recv", send, 2), s.pp - 1 - across)
        if across:
            add(collective_work(KernelKind.SEND_RECV, "pp_send_recv_internode", send, domain + 1), across)
        if sliced:
            add(collective_work(KernelKind.ALL_GATHER, "pp_recv_all_gather", hop, s.tp), s.pp - 1)
    add(pointwise_work(KernelKind.NORM, "final_norm", t, h, act, passes=2.0, flops_per_element=4.0))
    sampled = batch.num_sampled()
    if sampled:
        head = precision.lm_head_dtype
        add(gemm_work("lm_head", sampled, s.vocab, h, weight_dtype=head, act_dtype=act, compute_dtype=head))
        if s.tp > 1:
            # An all-gather's message is the gathered buffer (nccl-tests' convention, as the tables key it).
            add(collective_work(KernelKind.ALL_GATHER, "logits_all_gather", sampled * s.vocab * s.tp * act_b, s.tp))
        # The sampler reads the gathered logits as fp32: conversion, softmax/argmax, sampling.
        add(pointwise_work(KernelKind.SAMPLING, "sampler", sampled, model.vocab_size, DType.FLOAT32,
                       passes=4.0, flops_per_element=5.0))
    return KernelGraph(nodes=tuple(nodes))


def _dense_mlp(add: object, prefix: str, t: int, h: int, width: int, w: DType, act: DType, c: DType,
               repeat: int, *, gated: bool = True) -> None:
    """Gate-up, SiLU-and-multiply, down; or, ungated (GPT-J, Falcon), up, GELU, down."""
    assert callable(add)
    if gated:
        add(gemm_work(f"{prefix}_gate_up_proj", t, 2 * width, h, weight_dtype=w, act_dtype=act, compute_dtype=c),
            repeat)
        add(pointwise_work(KernelKind.ELEMENTWISE, f"{prefix}_silu_and_mul", t, width, act, passes=3.0,
                       flops_per_element=5.0), repeat)
    else:
        add(gemm_work(f"{prefix}_up_proj", t, width, h, weight_dtype=w, act_dtype=act, compute_dtype=c), repeat)
        add(pointwise_work(KernelKind.ELEMENTWISE, f"{prefix}_gelu", t, width, act, passes=2.0,
                       flops_per_element=8.0), repeat)
    add(gemm_work(f"{prefix}_down_proj", t, h, width, weight_dtype=w, act_dtype=act, compute_dtype=c), repeat)


def _moe_block(add: object, model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
               hw: HardwareSpec, s: ShardedShapes, t: int, repeat: int, *, decode_only: bool) -> None:
    assert callable(add) and model.moe is not None
    moe = model.moe
    act = precision.activation_dtype
    act_b = act.bytes_per_element()
    ew = precision.expert_weight_dtype
    h = s.hidden
    gathered = t * s.dp
    add(gemm_work("moe_router", t, moe.num_experts, h, weight_dtype=act, act_dtype=act, compute_dtype=act), repeat)
    topk = moe.num_experts_per_token
    all_to_all = expert_all_to_all(engine, topk=topk, hw=hw)
    gathers = trtllm_gathers_expert_tokens(engine, topk=topk, ep=s.ep, multi_node_nvlink=multi_node_nvlink(hw))
    if all_to_all:
        a2a = ep_all_to_all_work(tokens_per_rank=-(-t // s.tp), hidden=h, topk=moe.num_experts_per_token,
                                 num_experts=moe.num_experts, ep=s.ep, nvlink_domain=hw.nvlink_domain(),
                                 fp8_dispatch=hw.supports(DType.FP8), decode_only=decode_only)
        add(a2a, repeat)
    elif gathers:
        # TensorRT-LLM's post-quant allgather: every rank's tokens (in the experts' input format) and
        # their routing (int32 expert ids, fp32 weights) onto every rank; an all-gather's message is
        # the gathered buffer.
        per_token = TRTLLM_GATHER_BYTES_PER_ELEMENT.get(ew, act_b) * h + 8 * topk
        add(collective_work(KernelKind.ALL_GATHER, "moe_ep_all_gather", gathered * per_token, s.dp), repeat)
    elif s.dp > 1:
        add(collective_work(KernelKind.ALL_GATHER, "moe_dp_all_gather", gathered * h * act_b, s.dp), repeat)
    eplb = engine.enable_eplb and s.ep > 1
    add(moe_work(num_tokens=gathered, hidden=h, inter_size=moe.expert_intermediate_size,
                 topk=moe.num_experts_per_token, num_experts=engine.physical_experts(moe.num_experts),
                 moe_tp=s.moe_tp, moe_ep=s.ep, routing=eplb_routing(engine.moe_routing) if eplb else engine.moe_routing,
                 weight_dtype=ew, act=act), repeat)
    if all_to_all and s.moe_tp > 1:
        # Partial sums of the expert outputs over the MoE-TP group (without the all-to-all, the
        # layer's TP all-reduce sums every rank's partial outputs).
        add(collective_work(KernelKind.ALL_REDUCE, "moe_tp_all_reduce", -(-t // s.tp) * h * act_b, s.moe_tp),
            repeat)
    elif gathers:
        # Each rank's partial outputs of all the gathered tokens, summed and scattered back to their ranks.
        add(collective_work(KernelKind.REDUCE_SCATTER, "moe_ep_reduce_scatter", gathered * h * act_b, s.dp), repeat)
    elif s.ep == 1 and s.dp > 1:
        add(collective_work(KernelKind.REDUCE_SCATTER, "moe_dp_reduce_scatter", gathered * h * act_b, s.dp), repeat)
    if s.shared_width:
        lin_w = precision.linear_weight_dtype
        limit = shared_expert_token_limit(model, engine, precision, hw, decode_only=decode_only)
        beside = "" if limit is None else beside_variant(limit)

        def shared(work: KernelWork, times: int = 1) -> None:
            add(dataclasses.replace(work, variant=beside) if beside else work, times)
        _dense_mlp(shared, "shared_expert", t, h, s.shared_width, lin_w, act,
                   precision.gemm_compute_dtype(lin_w, hw), repeat)
        if model.shared_expert_gate:
            # sigmoid(hidden -> 1) scales the shared expert's output (replicated on every TP rank).
            shared(gemm_work("shared_expert_gate", t, 1, h, weight_dtype=act, act_dtype=act, compute_dtype=act),
                   repeat)
            shared(pointwise_work(KernelKind.ELEMENTWISE, "shared_expert_gate_mul", t, h, act, passes=3.0,
                                  flops_per_element=5.0), repeat)
