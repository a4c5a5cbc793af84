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

Hybrid linear-attention models (Qwen3.5, Qwen3-Next) keep a fixed-size Gated DeltaNet state per
request and layer instead of a KV cache in their linear layers. As SGLang sizes it, the cache
memory splits `mamba_full_memory_ratio` : 1 between a pool of per-request states and the KV cache
of the full-attention layers; the state pool's size caps the running requests
(`MemoryBreakdown.max_state_requests`). vLLM's V1 engine instead keeps both in one pool of blocks
(a request takes one state block per linear layer group); the split is what this model assumes for
both (docs/memory.md). SGLang splits so only with its radix cache on, and then runs a third as many
requests as the pool has slots; with `--disable-radix-cache` it keeps `--max-running-requests` states.

SGLang (`backend = "sglang"`) sizes its pool otherwise (`ModelRunner.profile_max_num_token`):
`rest = free after loading the weights - free before x (1 - mem_fraction_static)`, i.e.
`(total - runtime) x mem_fraction_static - weights`. Its activations and CUDA graphs are not
profiled: they live in the `1 - mem_fraction_static` it leaves, so they are not subtracted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.dtypes import DType
from sim.graph.linear_attention import state_bytes_per_request
from sim.graph.mla import indexer_cache_bytes_per_token, latent_row_bytes
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec, draft_input_projection_dtype, resolve_draft_precision

_MIB = 1 << 20
SGLANG_STATE_SLOTS_PER_RUNNING_REQUEST = 3
"""SGLang's `MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO`: with its radix cache on, a hybrid model's
running requests are capped at a third of the linear-attention state slots (the rest hold the states
of cached prefixes; 5 with `--mamba-scheduler-strategy extra_buffer`, not modelled)."""


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
    state_bytes_per_request: int = 0
    """Linear-attention state (recurrent + conv) one request holds on this rank; 0 without linear layers."""
    max_state_requests: int | None = None
    """Running requests the linear-attention state pool allows (a cap on running requests); None = no
    cap. SGLang: `max_num_seqs` slots without prefix caching (`--disable-radix-cache`), else a third of
    the slots of its `mamba_full_memory_ratio` share."""
    overheads_in_budget: bool = True
    """Whether the engine takes the activation peak, the CUDA graphs and the runtime out of
    `requested_bytes` before the KV cache (vLLM's profile run; TensorRT-LLM, whose fraction is converted
    to vLLM's). False for SGLang: its `requested_bytes` is (total - runtime) x `mem_fraction_static`,
    weights and KV cache only, the activations and graphs living in the rest of the GPU."""
    null_blocks: int = 0
    """Of `num_kv_blocks`, those the engine keeps for itself: vLLM v1's block pool takes block 0 as
    its null block (`BlockPool.null_block`, padding and sliding-window placeholders) and schedules
    and reports usage over the other `num_gpu_blocks - 1`."""

    def static_bytes(self, *, cuda_graphs: bool = True) -> int:
        """What the engine takes out of `requested_bytes` before the KV cache: the weights and, where
        `overheads_in_budget`, the activation peak, the runtime and (`cuda_graphs`) the CUDA graphs."""
        if not self.overheads_in_budget:
            return self.weight_bytes
        graphs = self.cuda_graph_bytes if cuda_graphs else 0
        return self.weight_bytes + self.activation_peak_bytes + self.runtime_overhead_bytes + graphs

    def usable_kv_blocks(self) -> int:
        """The blocks requests can hold."""
        return max(self.num_kv_blocks - self.null_blocks, 0)

    def kv_capacity_tokens(self) -> int:
        return self.usable_kv_blocks() * self.block_size

    def running_request_cap(self, max_num_seqs: int) -> int:
        """`max_num_seqs`, or fewer when a hybrid model's linear-attention state pool holds fewer requests."""
        if self.max_state_requests is None:
            return max_num_seqs
        return max(1, min(max_num_seqs, self.max_state_requests))


def layers_per_stage(model: ModelSpec, engine: EngineParams) -> int:
    return math.ceil(model.num_layers / engine.pipeline_parallel_size)


def stage_layer_ranges(num_layers: int, pp: int, backend: str) -> list[range]:
    """Each pipeline stage's contiguous layers. vLLM and SGLang (`get_pp_indices`): num_layers // pp
    each, the remainder one more each to the stages before the last (61 layers on 2 stages: 31, 30);
    TensorRT-LLM (`Mapping.pp_layers`, a tensor_split): the remainder to the first stages."""
    sizes = [num_layers // pp] * pp
    extra = num_layers % pp
    for i in (range(extra) if backend == "trtllm" else range(pp - 1 - extra, pp - 1)):
        sizes[i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def token_mixer_weight_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> float:
    """Attention (and, in a hybrid model, Gated DeltaNet) weights of one layer on one attention-TP
    rank, averaged over the layers."""
    attn = attention_weight_bytes(model, engine, precision)
    la = model.linear_attention
    if la is None:
        return attn
    r = la.per_rank(engine.tensor_parallel_size)
    lin = precision.linear_weight_dtype.bytes_per_element()
    act = precision.activation_dtype.bytes_per_element()
    h = model.hidden_size
    # in_proj_qkvz and out_proj in the linear format; in_proj_ba, the conv, A_log, dt_bias, the
    # gated norm and the two layer norms in the activation dtype.
    linear = (h * (2 * r.key_dim() + 2 * r.value_dim()) + r.value_dim() * h) * lin
    linear += (h * 2 * r.num_value_heads + r.conv_dim() * r.conv_kernel_dim + 2 * r.num_value_heads
               + r.value_head_dim + 2 * h) * act
    n_lin = model.num_linear_layers()
    return (attn * (model.num_layers - n_lin) + linear * n_lin) / model.num_layers


def attention_layers_per_stage(model: ModelSpec, engine: EngineParams) -> int:
    """Softmax-attention layers (the ones with a KV cache) on the most loaded pipeline stage."""
    return math.ceil(model.num_attention_layers() / engine.pipeline_parallel_size)


def linear_layers_per_stage(model: ModelSpec, engine: EngineParams) -> int:
    return math.ceil(model.num_linear_layers() / engine.pipeline_parallel_size)


def attention_weight_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> float:
    """Attention weights of one softmax-attention layer on one attention-TP rank (replicated over DP ranks)."""
    tp = engine.tensor_parallel_size
    act = precision.activation_dtype.bytes_per_element()
    lin = precision.linear_weight_dtype.bytes_per_element()
    h = model.hidden_size
    if model.mla is not None:
        m = model.mla
        heads = model.num_attention_heads // tp
        qk = m.qk_head_dim()
        # q_a / kv_a projections are replicated (vLLM ReplicatedLinear); q_b, kv_b and o are split.
        if m.q_lora_rank is None:
            attn = h * heads * qk * lin
        else:
            attn = (h * m.q_lora_rank + m.q_lora_rank * heads * qk) * lin + m.q_lora_rank * act
        attn += h * m.latent_width() * lin + m.kv_lora_rank * act
        kv_b = m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        # vLLM keeps kv_b_proj for prefill and, when it is quantized, a dequantised copy as W_UK / W_UV
        # for absorbed decode; an unquantized kv_b_proj's W_UK / W_UV are views of its weight.
        dequantised = act if precision.linear_weight_dtype != precision.activation_dtype else 0.0
        attn += kv_b * (lin + dequantised) + heads * m.v_head_dim * h * lin
        if model.dsa is not None:
            d = model.dsa
            attn += ((m.q_lora_rank or h) * d.index_n_heads * d.index_head_dim + h * d.index_head_dim) * lin
            attn += (h * d.index_n_heads + 2 * d.index_head_dim) * act
        return attn + 2 * h * act
    hd = model.head_dim
    q = model.num_attention_heads // tp * hd
    kv = max(1, model.num_kv_heads // tp) * hd
    gate = q if model.attn_output_gate else 0
    attn = (h * (q + gate + 2 * kv) + q * h) * lin + model.layer_norms_per_layer * h * act
    if model.attention_bias:
        attn += (q + 2 * kv) * act
    if model.qk_norm:
        attn += 2 * hd * act
    return attn


def moe_block_weight_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> float:
    """One MoE layer on one rank: its experts (num_experts / moe_ep of width inter / moe_tp), the
    shared expert (attention-TP split) and the router."""
    assert model.moe is not None
    moe, h = model.moe, model.hidden_size
    act = precision.activation_dtype.bytes_per_element()
    lin = precision.linear_weight_dtype.bytes_per_element()
    ew = precision.expert_weight_dtype.bytes_per_element()
    if precision.expert_weight_dtype is DType.INT4_WO and model.int4_group_size:
        ew += 2.0 / model.int4_group_size  # one 16-bit scale per group (vLLM's w13 / w2 weight scales)
    # EPLB copies too; the first E % EP ranks hold one expert more (vLLM's `determine_expert_map`).
    local = -(-engine.physical_experts(moe.num_experts) // engine.expert_parallel_size())
    width = moe.expert_intermediate_size // engine.moe_tp_size()
    experts = local * 3 * h * width * ew
    if moe.expert_bias:
        experts += local * (2 * width + h) * act
    shared = 3 * h * (moe.shared_expert_intermediate_size // engine.tensor_parallel_size) * lin
    if model.shared_expert_gate:
        shared += h * act
    return experts + shared + h * moe.num_experts * act


def weight_bytes_per_gpu(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    """Weights on one rank of the most loaded pipeline stage (the MTP layers are not loaded)."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    act = precision.activation_dtype.bytes_per_element()
    lin = precision.linear_weight_dtype.bytes_per_element()
    h = model.hidden_size
    attn = token_mixer_weight_bytes(model, engine, precision)
    dense = model.dense_mlp_matrices() * h * (model.intermediate_size // tp) * lin
    stage_layers = layers_per_stage(model, engine)
    vocab = -(-model.vocab_size // tp) * h * act
    if model.moe is not None and pp > 1:
        # An MoE stack's most loaded stage of the engine's split: its own layers' MLPs (DeepSeek's
        # dense first layers sit in the first stage), the embedding on the first, the LM head on the last.
        moe = moe_block_weight_bytes(model, engine, precision)
        stages = stage_layer_ranges(model.num_layers, pp, engine.backend)
        loads = [len(r) * attn + sum(moe if model.is_moe_layer(i) else dense for i in r)
                 + (vocab if k in (0, pp - 1) else 0.0) for k, r in enumerate(stages)]
        return int(max(loads) + h * act)
    # A uniform stack: ceil(layers / pp) layers and the embedding bound every stage (exact for
    # TensorRT-LLM's split; by at most one layer over where vLLM gives the remainder to middle stages).
    moe_frac = model.num_moe_layers() / model.num_layers
    if model.moe is not None:
        per_layer_total = attn + moe_frac * moe_block_weight_bytes(model, engine, precision) + (1 - moe_frac) * dense
    else:
        per_layer_total = attn + dense
    ends = vocab * (1 if model.tie_word_embeddings else 2)
    if pp > 1:
        ends = vocab  # first stage holds the embedding, last the LM head
    return int(stage_layers * per_layer_total + ends + h * act)


def kv_bytes_per_token(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    """KV-cache bytes one token occupies on one rank, over the rank's layers.

    GQA/MHA: K and V of the rank's KV heads. MLA: one latent row (kv_lora_rank + qk_rope_head_dim)
    shared by all heads and replicated on every attention-TP rank (vLLM; DSA's FP8 row in the sparse
    kernels' own layout, `sim.graph.mla.latent_row_bytes`); DSA adds the FP8 indexer key and its scale."""
    kv = precision.kv_cache_dtype.bytes_per_element()
    layers = attention_layers_per_stage(model, engine)
    if model.mla is not None:
        row = latent_row_bytes(model, precision.kv_cache_dtype)
        if model.dsa is not None:
            row += indexer_cache_bytes_per_token(model.dsa.index_head_dim)
        return int(layers * row)
    kv_heads = max(1, model.num_kv_heads // engine.tensor_parallel_size)
    return int(layers * 2 * kv_heads * model.head_dim * kv)


def _qkv_width(model: ModelSpec, tp: int) -> int:
    """Per-token width of the attention input projections' output on one rank."""
    if model.mla is not None:
        m = model.mla
        return (m.q_lora_rank or 0) + m.latent_width() + model.num_attention_heads // tp * m.qk_head_dim()
    return (model.num_attention_heads // tp + 2 * max(1, model.num_kv_heads // tp)) * model.head_dim


def _attention_out_width(model: ModelSpec, tp: int) -> int:
    if model.mla is not None:
        # The prefill's decompressed keys (nope + rope) and values per head, and the output.
        m = model.mla
        return model.num_attention_heads // tp * (m.qk_head_dim() + 2 * m.v_head_dim)
    return model.num_attention_heads // tp * model.head_dim


def activation_peak_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                          params: MemoryParams) -> int:
    """Transient peak of vLLM's profile run: max(forward at the token budget, sampler pass)."""
    assert engine.max_num_batched_tokens is not None and engine.max_num_seqs is not None
    tp = engine.tensor_parallel_size
    t = engine.max_num_batched_tokens
    act = precision.activation_dtype.bytes_per_element()
    h = model.hidden_size
    qkv = _qkv_width(model, tp)
    attn_phase = qkv + _attention_out_width(model, tp)
    width = model.intermediate_size // tp
    mlp_phase = model.dense_mlp_matrices() * width
    if model.moe is not None:
        routed_width = model.moe.expert_intermediate_size // engine.moe_tp_size()
        mlp_phase = max(mlp_phase, 3 * routed_width * model.moe.num_experts_per_token)
    forward = t * (2 * h + max(attn_phase, mlp_phase)) * act
    sampler = min(engine.max_num_seqs, t) * model.vocab_size * params.sampler_bytes_per_logit
    return int(max(forward, sampler))


def cuda_graph_bytes(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> int:
    if engine.effective_launch_mode() != "cuda_graph":
        return 0
    assert engine.max_cudagraph_capture_size is not None
    qkv = _qkv_width(model, engine.tensor_parallel_size)
    per_layer = engine.max_cudagraph_capture_size * (qkv + 2 * model.hidden_size)
    return int(layers_per_stage(model, engine) * per_layer * precision.activation_dtype.bytes_per_element())


def draft_memory_bytes(model: ModelSpec, draft: ModelSpec, engine: EngineParams,
                       precision: PrecisionSpec) -> tuple[int, int]:
    """(weights, KV bytes per token) the speculative drafter adds on one rank.

    A draft model (`draft_model`) brings all its weights (its own formats) and the KV of all its
    layers. An EAGLE head or MTP layer shares the target's embedding and, except EAGLE-3 (its own
    head over the reduced draft vocabulary), the LM head, as vLLM's proposers load them; it adds its
    decoder layer, its input projection (EAGLE `fc` 2h or 3h -> h, MTP `eh_proj` 2h -> h, replicated)
    and one layer of KV. vLLM keeps the draft's KV layers in the same blocks as the target's.
    """
    config = engine.speculative_config
    assert config is not None
    flat = EngineParams(tensor_parallel_size=engine.tensor_parallel_size, data_parallel_size=engine.data_parallel_size,
                        enable_expert_parallel=engine.enable_expert_parallel,
                        moe_tensor_parallel_size=engine.moe_tensor_parallel_size,
                        moe_expert_parallel_size=engine.moe_expert_parallel_size,
                        dtype=engine.dtype, kv_cache_dtype=engine.kv_cache_dtype, quantization=engine.quantization)
    own = resolve_draft_precision(draft, engine, precision)
    if config.method == "draft_model":
        return weight_bytes_per_gpu(draft, flat, own), kv_bytes_per_token(draft, flat, own)
    tp = engine.tensor_parallel_size
    act = own.activation_dtype.bytes_per_element()
    h = draft.hidden_size
    vocab = -(-draft.vocab_size // tp) * h * act
    ends = vocab * (1 if draft.tie_word_embeddings else 2) + h * act
    weights = weight_bytes_per_gpu(draft, flat, own) - ends
    fc = {"eagle": 2, "mtp": 2, "eagle3": 3}.get(config.method, 0) * h
    fc_bytes = draft_input_projection_dtype(config.method, own).bytes_per_element()
    weights += fc * h * fc_bytes + (vocab if config.method == "eagle3" else 0)
    if config.method == "eagle3":
        # vLLM's llama_eagle3 layer attends over [embedding, fc(hidden states)]: its QKV input is 2h wide.
        weights += h * _qkv_width(draft, tp) * own.linear_weight_dtype.bytes_per_element()
    return int(weights), kv_bytes_per_token(draft, flat, own)


def memory_breakdown(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                     hw: HardwareSpec, params: MemoryParams | None = None,
                     draft: ModelSpec | None = None) -> MemoryBreakdown:
    """KV-cache sizing for one rank; `num_kv_blocks` may be <= 0 when nothing fits. `draft`: the
    speculative drafter (`Scenario.draft_model`), whose weights and KV share the GPU."""
    params = params or MemoryParams()
    total = hw.hbm_capacity_bytes
    sglang = engine.backend == "sglang"
    # SGLang: `gpu_memory_utilization` is its `mem_fraction_static`, a fraction of the memory free
    # before the weights load (the CUDA context and NCCL already taken).
    requested = int(((total - params.runtime_overhead_bytes) if sglang else total) * engine.gpu_memory_utilization)
    weights = weight_bytes_per_gpu(model, engine, precision)
    per_token = kv_bytes_per_token(model, engine, precision)
    if draft is not None:
        draft_weights, draft_per_token = draft_memory_bytes(model, draft, engine, precision)
        weights += draft_weights
        per_token += draft_per_token
    peak = activation_peak_bytes(model, engine, precision, params)
    graphs = cuda_graph_bytes(model, engine, precision)
    cache = requested - weights
    if not sglang:
        cache -= peak + graphs + params.runtime_overhead_bytes
    kv_cache, state, max_states = cache, 0, None
    if model.linear_attention is not None:
        state = state_bytes_per_request(model, engine.tensor_parallel_size, precision.activation_dtype,
                                        linear_layers_per_stage(model, engine))
        assert engine.max_num_seqs is not None
        if sglang and not engine.enable_prefix_caching:
            # `--disable-radix-cache`: SGLang keeps one state slot per `--max-running-requests`
            # (`handle_max_mamba_cache`); the KV cache gets the rest.
            max_states = engine.max_num_seqs
            state_pool = max_states * state
        else:
            ratio = engine.mamba_full_memory_ratio
            state_pool = int(max(cache, 0) * ratio / (1.0 + ratio))
            max_states = state_pool // state
            if sglang:
                # Its radix cache keeps states of cached prefixes too: SGLang runs at most
                # slots // MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO requests (`init_memory_pool`).
                max_states //= SGLANG_STATE_SLOTS_PER_RUNNING_REQUEST
        kv_cache = cache - state_pool
    blocks = kv_cache // (per_token * engine.block_size) if kv_cache > 0 else 0
    return MemoryBreakdown(
        total_bytes=total, requested_bytes=requested, weight_bytes=weights,
        activation_peak_bytes=peak, cuda_graph_bytes=graphs,
        runtime_overhead_bytes=params.runtime_overhead_bytes, kv_cache_bytes=max(kv_cache, 0),
        kv_bytes_per_token=per_token, num_kv_blocks=int(blocks), block_size=engine.block_size,
        state_bytes_per_request=state, max_state_requests=max_states, overheads_in_budget=not sglang,
        null_blocks=1 if engine.backend == "vllm" and blocks > 0 else 0,
    )
