"""The kernels one serving step launches, for dense and MoE decoders under TP/PP/EP.

The graph follows one batch along the critical path: every layer (spread over the pipeline
stages, which run one after another for a given batch), with TP-sharded shapes on one GPU, the
collectives between them, and the LM head and sampler for sampled tokens only. Kernel choices
follow vLLM's Llama/Qwen/Mixtral implementations: fused QKV and gate-up projections, fused
residual-add RMSNorm, RoPE in place, SiLU-and-mul, one vocab-parallel embedding and LM head.

FLOP and byte counts are the compulsory work: GEMM 2mnk FLOPs with each operand read once;
attention 4 x heads x head_dim FLOPs per (query, key) pair with K/V read once; MoE expert weights
read once per expert that receives at least one token (expected count under uniform routing).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from sim.dtypes import DType
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelGraph, KernelKind, KernelNode, KernelWork
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
        tp, ep = engine.tensor_parallel_size, engine.expert_parallel_size()
        moe = model.moe
        if moe is None:
            local_experts = expert_width = shared_width = 0
        elif ep > 1:
            local_experts, expert_width = moe.num_experts // ep, moe.expert_intermediate_size
            shared_width = moe.shared_expert_intermediate_size // tp
        else:
            local_experts, expert_width = moe.num_experts, moe.expert_intermediate_size // tp
            shared_width = moe.shared_expert_intermediate_size // tp
        return ShardedShapes(
            tp=tp,
            pp=engine.pipeline_parallel_size,
            ep=ep,
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


def gemm_work(name: str, m: int, n: int, k: int, *, weight_dtype: DType, act_dtype: DType,
              compute_dtype: DType) -> KernelWork:
    a = act_dtype.bytes_per_element()
    return KernelWork(
        kind=KernelKind.GEMM, name=name, dtype=compute_dtype,
        flops=2.0 * m * n * k,
        weight_bytes=float(n * k) * weight_dtype.bytes_per_element(),
        activation_bytes=float(m * k + m * n) * a,
        shape=(m, n, k),
    )


def _pointwise(kind: KernelKind, name: str, tokens: int, width: int, dtype: DType, *,
               passes: float, flops_per_element: float = 1.0) -> KernelWork:
    """A memory-bound kernel touching `passes` tensors of tokens x width elements."""
    return KernelWork(
        kind=kind, name=name, dtype=dtype,
        flops=flops_per_element * tokens * width,
        activation_bytes=passes * tokens * width * dtype.bytes_per_element(),
        shape=(tokens, width),
    )


def collective_work(kind: KernelKind, name: str, message_bytes: float, group: int) -> KernelWork:
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


def decode_attention_work(*, contexts: tuple[int, ...], heads: int, kv_heads: int, head_dim: int,
                          window: int, act: DType, kv: DType) -> KernelWork:
    """One new token per request attending to its cached context plus itself."""
    spans = [c + 1 if window <= 0 else min(c + 1, window) for c in contexts]
    total = sum(spans)
    kv_row = 2 * kv_heads * head_dim * kv.bytes_per_element()
    batch = len(contexts)
    return KernelWork(
        kind=KernelKind.ATTN_DECODE, name="attn_decode" if window <= 0 else "attn_decode_swa",
        dtype=act,
        flops=4.0 * heads * head_dim * total,
        activation_bytes=2.0 * batch * heads * head_dim * act.bytes_per_element(),
        kv_read_bytes=float(total * kv_row),
        kv_write_bytes=float(batch * kv_row),
        shape=(batch, round(total / batch), max(spans), heads, kv_heads, head_dim, window),
    )


def expected_active_experts(local_experts: int, num_experts: int, top_k: int, tokens: int) -> float:
    """Expected local experts hit by at least one of `tokens` tokens under uniform top-k routing."""
    miss = (1.0 - top_k / num_experts) ** tokens
    return local_experts * (1.0 - miss)


def build_step_graph(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                     hw: HardwareSpec, batch: BatchShape) -> KernelGraph:
    """Kernels of one step for `batch`, on one GPU of each pipeline stage in turn."""
    s = ShardedShapes.of(model, engine)
    act, kvd = precision.activation_dtype, precision.kv_cache_dtype
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
    add(_pointwise(KernelKind.EMBEDDING, "embedding", t, h, act, passes=2.0, flops_per_element=0.0))
    all_reduce("embedding_all_reduce", 1)

    windows = Counter(model.layer_window_tokens)
    qkv_n = (s.q_heads + 2 * s.kv_heads) * s.head_dim
    add(_pointwise(KernelKind.NORM, "input_layernorm", t, h, act, passes=4.0, flops_per_element=4.0), num_layers)
    add(gemm_work("qkv_proj", t, qkv_n, h, weight_dtype=lin_w, act_dtype=act, compute_dtype=lin_c), num_layers)
    if model.qk_norm:
        add(_pointwise(KernelKind.NORM, "qk_norm", t, (s.q_heads + s.kv_heads) * s.head_dim, act,
                       passes=2.0, flops_per_element=4.0), num_layers)
    add(_pointwise(KernelKind.ELEMENTWISE, "rotary_emb", t, (s.q_heads + s.kv_heads) * s.head_dim, act,
                   passes=2.0, flops_per_element=3.0), num_layers)
    for window, layers in sorted(windows.items()):
        for chunk, count in sorted(Counter(batch.prefills).items(),
                                   key=lambda kv: (kv[0].new_tokens, kv[0].context_tokens, kv[0].samples)):
            add(prefill_attention_work(batch=count, new_tokens=chunk.new_tokens,
                                       context_tokens=chunk.context_tokens, heads=s.q_heads,
                                       kv_heads=s.kv_heads, head_dim=s.head_dim, window=window,
                                       act=act, kv=kvd), layers)
        if batch.decode_context_tokens:
            add(decode_attention_work(contexts=batch.decode_context_tokens, heads=s.q_heads,
                                      kv_heads=s.kv_heads, head_dim=s.head_dim, window=window,
                                      act=act, kv=kvd), layers)
    add(gemm_work("o_proj", t, h, s.q_heads * s.head_dim, weight_dtype=lin_w, act_dtype=act,
                  compute_dtype=lin_c), num_layers)
    all_reduce("attn_all_reduce", num_layers)
    add(_pointwise(KernelKind.NORM, "post_attention_layernorm", t, h, act, passes=4.0,
                   flops_per_element=4.0), num_layers)

    num_moe = model.num_moe_layers()
    num_dense = num_layers - num_moe
    if num_dense:
        _dense_mlp(add, "mlp", t, h, s.mlp_width, lin_w, act, lin_c, num_dense)
    if num_moe:
        _moe_block(add, model, engine, precision, hw, s, t, num_moe)
    all_reduce("mlp_all_reduce", num_layers)

    if s.pp > 1:
        # vLLM sends hidden states and the residual to the next stage.
        add(collective_work(KernelKind.SEND_RECV, "pp_send_recv", 2 * t * h * act_b, 2), s.pp - 1)
    add(_pointwise(KernelKind.NORM, "final_norm", t, h, act, passes=2.0, flops_per_element=4.0))
    sampled = batch.num_sampled()
    if sampled:
        head = precision.lm_head_dtype
        add(gemm_work("lm_head", sampled, s.vocab, h, weight_dtype=head, act_dtype=act, compute_dtype=head))
        if s.tp > 1:
            add(collective_work(KernelKind.ALL_GATHER, "logits_all_gather", sampled * s.vocab * act_b, s.tp))
        # The sampler reads the gathered logits as fp32: conversion, softmax/argmax, sampling.
        add(_pointwise(KernelKind.SAMPLING, "sampler", sampled, model.vocab_size, DType.FLOAT32,
                       passes=4.0, flops_per_element=5.0))
    return KernelGraph(nodes=tuple(nodes))


def _dense_mlp(add: object, prefix: str, t: int, h: int, width: int, w: DType, act: DType, c: DType,
               repeat: int) -> None:
    assert callable(add)
    add(gemm_work(f"{prefix}_gate_up_proj", t, 2 * width, h, weight_dtype=w, act_dtype=act, compute_dtype=c), repeat)
    add(_pointwise(KernelKind.ELEMENTWISE, f"{prefix}_silu_and_mul", t, width, act, passes=3.0,
                   flops_per_element=5.0), repeat)
    add(gemm_work(f"{prefix}_down_proj", t, h, width, weight_dtype=w, act_dtype=act, compute_dtype=c), repeat)


def _moe_block(add: object, model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
               hw: HardwareSpec, s: ShardedShapes, t: int, repeat: int) -> None:
    assert callable(add) and model.moe is not None
    moe = model.moe
    act = precision.activation_dtype
    act_b = act.bytes_per_element()
    ew = precision.expert_weight_dtype
    ec = precision.gemm_compute_dtype(ew, hw)
    h = s.hidden
    add(gemm_work("moe_router", t, moe.num_experts, h, weight_dtype=act, act_dtype=act, compute_dtype=act), repeat)
    add(_pointwise(KernelKind.ELEMENTWISE, "moe_topk", t, moe.num_experts, DType.FLOAT32, passes=2.0,
                   flops_per_element=3.0), repeat)
    if s.ep > 1:
        # Each TP rank dispatches its slice of the tokens; pairs per GPU = t x top_k / tp.
        routed = -(-t * moe.num_experts_per_token // s.tp)
        tokens_seen = t * engine.data_parallel_size
        dispatch = routed * h * act_b
        add(collective_work(KernelKind.ALL_TO_ALL, "moe_dispatch", dispatch, s.ep), repeat)
    else:
        routed = t * moe.num_experts_per_token
        tokens_seen = t
    active = expected_active_experts(s.local_experts, moe.num_experts, moe.num_experts_per_token, tokens_seen)
    for name, n, k in (("moe_gate_up", 2 * s.expert_width, h), ("moe_down", h, s.expert_width)):
        add(KernelWork(
            kind=KernelKind.MOE_GEMM, name=name, dtype=ec,
            flops=2.0 * routed * n * k,
            weight_bytes=active * n * k * ew.bytes_per_element(),
            activation_bytes=float(routed * (n + k)) * act_b,
            shape=(routed, n, k, s.local_experts, round(active)),
        ), repeat)
        if name == "moe_gate_up":
            add(_pointwise(KernelKind.ELEMENTWISE, "moe_silu_and_mul", routed, s.expert_width, act,
                           passes=3.0, flops_per_element=5.0), repeat)
    if s.ep > 1:
        add(collective_work(KernelKind.ALL_TO_ALL, "moe_combine", routed * h * act_b, s.ep), repeat)
    if s.shared_width:
        lin_w = precision.linear_weight_dtype
        _dense_mlp(add, "shared_expert", t, h, s.shared_width, lin_w, act,
                   precision.gemm_compute_dtype(lin_w, hw), repeat)
