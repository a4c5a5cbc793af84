"""GPU memory per rank: weights, KV cache per token, and the KV-cache capacity vLLM allocates.

vLLM (v1 worker) sizes the cache as

    requested  = total GPU memory x gpu_memory_utilization
    kv_bytes   = requested - (weights + transient peak of the profile run + CUDA graphs + runtime)
    num_blocks = kv_bytes // (block_size x KV bytes per token per rank)

The profile run is one forward pass of `max_num_batched_tokens` tokens followed by a sampler
pass over `max_num_seqs` rows of logits; the transient peak is the larger of the two. The sampler
keeps fp32 logits, fp32 probabilities, sorted fp32 values and int64 indices for top-k/top-p
(20 bytes per logit) plus the 16-bit LM-head output. Piecewise CUDA graphs keep each piece's
output buffer at the largest capture size alive for the graph's lifetime: per layer the QKV
output, the hidden state and the residual. `runtime_overhead_bytes` is the CUDA context, cuBLAS
workspaces and allocator slack that recent vLLM counts from device free memory; its default is an
assumption documented in docs/memory.md, not a measurement of this project.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec

_MIB = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryParams:
    runtime_overhead_bytes: int = 512 * _MIB
    """CUDA context + library workspaces per rank (assumed; see docs/memory.md)."""
    sampler_bytes_per_logit: float = 22.0
    """fp32 logits, probs, sorted values (4 each), int64 sort indices (8), 16-bit LM-head output (2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryBreakdown:
    """Per-rank memory of the most loaded pipeline stage, in bytes."""

    total_bytes: int
    requested_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    runtime_overhead_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    num_kv_blocks: int
    block_size: int

    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


def layers_per_stage(model: ModelSpec, engine: EngineParams) -> int:
    return math.ceil(model.num_layers / engine.pipeline_parallel_size)


def weight_bytes_per_gpu(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    """Weights on one rank of the most loaded pipeline stage."""
    tp, pp, ep = engine.tensor_parallel_size, engine.pipeline_parallel_size, engine.expert_parallel_size()
    act = precision.activation_dtype.bytes_per_element()
    lin = precision.linear_weight_dtype.bytes_per_element()
    h, hd = model.hidden_size, model.head_dim
    q = model.num_attention_heads // tp * hd
    kv = max(1, model.num_kv_heads // tp) * hd
    attn = (h * (q + 2 * kv) + q * h) * lin + 2 * h * act
    if model.attention_bias:
        attn += (q + 2 * kv) * act
    if model.qk_norm:
        attn += 2 * hd * act
    dense = 3 * h * (model.intermediate_size // tp) * lin
    per_layer_total = 0.0
    stage_layers = layers_per_stage(model, engine)
    moe_layers = model.num_moe_layers()
    # Stages take contiguous layer ranges; the fraction of MoE layers is assumed uniform.
    moe_frac = moe_layers / model.num_layers
    if model.moe is not None:
        moe = model.moe
        ew = precision.expert_weight_dtype.bytes_per_element()
        if ep > 1:
            local, width = moe.num_experts // ep, moe.expert_intermediate_size
        else:
            local, width = moe.num_experts, moe.expert_intermediate_size // tp
        experts = local * 3 * h * width * ew
        if moe.expert_bias:
            experts += local * (2 * width + h) * act
        shared = 3 * h * (moe.shared_expert_intermediate_size // tp) * lin
        moe_block = experts + shared + h * moe.num_experts * act
        per_layer_total = attn + moe_frac * moe_block + (1 - moe_frac) * dense
    else:
        per_layer_total = attn + dense
    vocab = -(-model.vocab_size // tp) * h * act
    ends = vocab * (1 if model.tie_word_embeddings else 2)
    if pp > 1:
        ends = vocab  # first stage holds the embedding, last the LM head
    return int(stage_layers * per_layer_total + ends + h * act)


def kv_bytes_per_token(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    """K and V bytes one token occupies on one rank, over the rank's layers."""
    kv_heads = max(1, model.num_kv_heads // engine.tensor_parallel_size)
    return int(layers_per_stage(model, engine) * 2 * kv_heads * model.head_dim
               * precision.kv_cache_dtype.bytes_per_element())


def activation_peak_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                          params: MemoryParams) -> int:
    """Transient peak of vLLM's profile run: max(forward at the token budget, sampler pass)."""
    assert engine.max_num_batched_tokens is not None and engine.max_num_seqs is not None
    tp = engine.tensor_parallel_size
    t = engine.max_num_batched_tokens
    act = precision.activation_dtype.bytes_per_element()
    h, hd = model.hidden_size, model.head_dim
    qkv = (model.num_attention_heads // tp + 2 * max(1, model.num_kv_heads // tp)) * hd
    attn_phase = qkv + model.num_attention_heads // tp * hd
    width = model.intermediate_size // tp
    mlp_phase = 3 * width
    if model.moe is not None:
        routed_width = model.moe.expert_intermediate_size // (1 if engine.enable_expert_parallel else tp)
        mlp_phase = max(mlp_phase, 3 * routed_width * model.moe.num_experts_per_token)
    forward = t * (2 * h + max(attn_phase, mlp_phase)) * act
    sampler = min(engine.max_num_seqs, t) * model.vocab_size * params.sampler_bytes_per_logit
    return int(max(forward, sampler))


def cuda_graph_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    if engine.effective_launch_mode() != "cuda_graph":
        return 0
    assert engine.max_cudagraph_capture_size is not None
    tp = engine.tensor_parallel_size
    qkv = (model.num_attention_heads // tp + 2 * max(1, model.num_kv_heads // tp)) * model.head_dim
    per_layer = engine.max_cudagraph_capture_size * (qkv + 2 * model.hidden_size)
    return int(layers_per_stage(model, engine) * per_layer * precision.activation_dtype.bytes_per_element())


def memory_breakdown(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                     hw: HardwareSpec, params: MemoryParams | None = None) -> MemoryBreakdown:
    """KV-cache sizing for one rank; `num_kv_blocks` may be <= 0 when nothing fits."""
    params = params or MemoryParams()
    total = hw.hbm_capacity_bytes
    requested = int(total * engine.gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, engine, precision)
    peak = activation_peak_bytes(model, engine, precision, params)
    graphs = cuda_graph_bytes(model, engine, precision)
    kv_cache = requested - weights - peak - graphs - params.runtime_overhead_bytes
    per_token = kv_bytes_per_token(model, engine, precision)
    blocks = kv_cache // (per_token * engine.block_size) if kv_cache > 0 else 0
    return MemoryBreakdown(
        total_bytes=total, requested_bytes=requested, weight_bytes=weights,
        activation_peak_bytes=peak, cuda_graph_bytes=graphs,
        runtime_overhead_bytes=params.runtime_overhead_bytes, kv_cache_bytes=max(kv_cache, 0),
        kv_bytes_per_token=per_token, num_kv_blocks=int(blocks), block_size=engine.block_size,
    )
