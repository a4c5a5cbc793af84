"""Kernels of multi-head latent attention (DeepSeek-V3/R1, Kimi-K2) and DeepSeek sparse attention
(GLM-5), as vLLM runs them under attention tensor parallelism.

Per layer, for every token of the step (the token part):
- `fused_qkv_a_proj`: h -> q_lora_rank + kv_lora_rank + qk_rope_head_dim, replicated on every TP rank
  (vLLM's ReplicatedLinear); without a query bottleneck, `q_proj` (column-parallel) and `kv_a_proj`;
- `q_a_layernorm`, `kv_a_layernorm`; `q_b_proj` (column-parallel: heads/TP x qk_head_dim); RoPE on
  the query's and the key's rope parts; `o_proj` (row-parallel: heads/TP x v_head_dim -> h).
- DSA only: the lightning indexer's projections, replicated: `dsa_wq_b` (q_lora_rank -> index
  heads x index_head_dim), `dsa_wk` (h -> index_head_dim), `dsa_weights_proj` (h -> index heads),
  the key LayerNorm and RoPE, and the FP8 write of the indexer key cache.

Attention proper (the attention parts, `is_attention_work`):
- prefill (dense MLA): `mla_kv_b_proj` decompresses the latent of every key the chunk attends to
  (the cached context and the new tokens; vLLM's MLA prefill gathers the cached latent of a chunked
  or prefix-cached prompt and runs kv_b_proj over it), then `MLA_PREFILL` (per-head K/V, qk head dim
  nope + rope, v head dim) over heads/TP heads.
- decode (dense MLA): the weight-absorbed path of FlashMLA / FlashInfer / TRT-LLM: `MLA_BMM`
  `mla_gen_pre` (q_nope x W_UK: qk_nope_head_dim -> kv_lora_rank per head), `MLA_DECODE` against the
  latent cache (kv_lora_rank + rope per token, shared by all heads), `MLA_BMM` `mla_gen_post`
  (latent -> v_head_dim per head). vLLM keeps W_UK and W_UV in the activation dtype.
- DSA (prefill and decode alike, vLLM's sparse FlashMLA backend runs every token absorbed): per
  query the indexer scores every visible key (`dsa_indexer_logits`, FP8, index heads x
  index_head_dim per key, reading the indexer key cache), `dsa_topk` keeps the best `index_topk`,
  and the absorbed MLA attends to min(visible keys, index_topk) latent rows (`mla_sparse`, priced as
  `MLA_DECODE`: nothing sparse is measured). The indexer kernels are first-principles (roofline GEMM
  and elementwise kinds).

FLOPs per (query, key) pair per head: prefill 2 x (qk_head_dim + v_head_dim); absorbed
2 x (kv_lora_rank + rope) + 2 x kv_lora_rank (the `mla_generation` table's count).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork, gemm_work, pointwise_work
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec

NodeList = list[tuple[KernelWork, int]]

ATTENTION_GEMM_NAMES = frozenset({"mla_kv_b_proj", "dsa_indexer_logits", "dsa_topk"})
"""Kernels of non-attention kinds whose work depends on the attended context (attention parts)."""


def indexer_cache_bytes_per_token(index_head_dim: int) -> int:
    """FP8 indexer key plus one fp32 scale per 128 elements (vLLM's indexer cache row)."""
    return index_head_dim + 4 * math.ceil(index_head_dim / 128)


@dataclass(frozen=True, slots=True, kw_only=True)
class MLAShapes:
    heads: int
    """Query heads on one attention-TP rank."""
    hidden: int
    layers: int
    q_lora: int | None
    kv_lora: int
    nope: int
    rope: int
    v: int

    @staticmethod
    def of(model: ModelSpec, tp: int) -> MLAShapes:
        assert model.mla is not None
        m = model.mla
        return MLAShapes(heads=model.num_attention_heads // tp, hidden=model.hidden_size, layers=model.num_layers,
                         q_lora=m.q_lora_rank, kv_lora=m.kv_lora_rank, nope=m.qk_nope_head_dim,
                         rope=m.qk_rope_head_dim, v=m.v_head_dim)

    def latent(self) -> int:
        return self.kv_lora + self.rope


def projection_nodes(model: ModelSpec, precision: PrecisionSpec, hw: HardwareSpec, tp: int, t: int) -> NodeList:
    """The token part of MLA attention (and the DSA indexer's projections), every layer."""
    s = MLAShapes.of(model, tp)
    act, w = precision.activation_dtype, precision.linear_weight_dtype
    c = precision.gemm_compute_dtype(w, hw)
    n_layers = s.layers
    qk = s.nope + s.rope
    out: NodeList = []
    if s.q_lora is not None:
        out.append((gemm_work("fused_qkv_a_proj", t, s.q_lora + s.latent(), s.hidden, w, act, c), n_layers))
        out.append((pointwise_work(KernelKind.NORM, "q_a_layernorm", t, s.q_lora, act, 2.0, 4.0), n_layers))
        out.append((gemm_work("q_b_proj", t, s.heads * qk, s.q_lora, w, act, c), n_layers))
    else:
        out.append((gemm_work("q_proj", t, s.heads * qk, s.hidden, w, act, c), n_layers))
        out.append((gemm_work("kv_a_proj_with_mqa", t, s.latent(), s.hidden, w, act, c), n_layers))
    out.append((pointwise_work(KernelKind.NORM, "kv_a_layernorm", t, s.kv_lora, act, 2.0, 4.0), n_layers))
    out.append((pointwise_work(KernelKind.ELEMENTWISE, "rotary_emb", t, (s.heads + 1) * s.rope, act, 2.0, 3.0),
                n_layers))
    if model.dsa is not None:
        d = model.dsa
        q_in = s.q_lora or s.hidden
        width = d.index_n_heads * d.index_head_dim
        out.append((gemm_work("dsa_wq_b", t, width, q_in, w, act, c), n_layers))
        out.append((gemm_work("dsa_wk", t, d.index_head_dim, s.hidden, w, act, c), n_layers))
        out.append((gemm_work("dsa_weights_proj", t, d.index_n_heads, s.hidden, act, act, act), n_layers))
        out.append((pointwise_work(KernelKind.NORM, "dsa_k_norm", t, d.index_head_dim, act, 2.0, 4.0), n_layers))
        out.append((pointwise_work(KernelKind.ELEMENTWISE, "dsa_rotary_emb", t, width + d.index_head_dim, act,
                                   2.0, 3.0), n_layers))
        # Quantise q and k to FP8 and write the key into the indexer cache.
        out.append((KernelWork(kind=KernelKind.ELEMENTWISE, name="dsa_quant_cache", dtype=act,
                               flops=2.0 * t * (width + d.index_head_dim),
                               activation_bytes=float(t * (width + d.index_head_dim)) * (act.bytes_per_element() + 1),
                               kv_write_bytes=float(t * indexer_cache_bytes_per_token(d.index_head_dim)),
                               shape=(t, width + d.index_head_dim)), n_layers))
    out.append((gemm_work("o_proj", t, s.hidden, s.heads * s.v, w, act, c), n_layers))
    return out


def _bmm(op: str, tokens: int, heads: int, n: int, k: int, act: DType) -> KernelWork:
    a = act.bytes_per_element()
    return KernelWork(kind=KernelKind.MLA_BMM, name=op, dtype=act, flops=2.0 * tokens * heads * n * k,
                      weight_bytes=float(heads * n * k) * a, activation_bytes=float(tokens * heads * (n + k)) * a,
                      shape=(tokens, heads, n, k), variant=op)


FP8_DS_MLA_SCALE_GROUP = 128
"""Latent values per fp32 scale in the sparse FlashMLA FP8 cache row (`fp8_ds_mla`)."""


def latent_row_bytes(model: ModelSpec, kv: DType) -> float:
    """Bytes of one token's latent row in one layer's cache. DSA's sparse FlashMLA kernels read an FP8
    cache in their own layout (vLLM's `fp8_ds_mla`, the only FP8 format of `flashmla_sparse`): the
    kv_lora_rank latent values in FP8, one fp32 scale per 128 of them, and the RoPE part in BF16
    (512 + 16 + 128 = 656 bytes for GLM-5, against 576 for dense MLA's FP8 row)."""
    m = model.mla
    assert m is not None
    if model.dsa is not None and kv.bytes_per_element() == 1:
        return float(m.kv_lora_rank + 4 * -(-m.kv_lora_rank // FP8_DS_MLA_SCALE_GROUP) + 2 * m.qk_rope_head_dim)
    return float(m.latent_width() * kv.bytes_per_element())


def _absorbed(name: str, *, queries: int, total: int, longest: int, s: MLAShapes, act: DType, kv: DType,
              writes: int, row_bytes: float | None = None) -> KernelWork:
    """Absorbed attention of `queries` queries attending to `total` latent rows in all. Its dtype is the
    KV-cache format it reads: the measured tables key the MLA kernels by `kv_cache_dtype` (FP8-cache
    kernels are other kernels: TensorRT-LLM's run ~25% faster at long contexts, SGLang's 2-6x slower).
    `row_bytes`: one latent row's bytes (default the row's elements at the cache dtype's width)."""
    a = act.bytes_per_element()
    row = float(s.latent() * kv.bytes_per_element()) if row_bytes is None else row_bytes
    return KernelWork(
        kind=KernelKind.MLA_DECODE, name=name, dtype=kv,
        flops=2.0 * s.heads * (s.latent() + s.kv_lora) * total,
        activation_bytes=float(queries * s.heads * (s.latent() + s.kv_lora)) * a,
        kv_read_bytes=total * row,
        kv_write_bytes=writes * row,
        shape=(queries, round(total / queries), longest, s.heads, s.kv_lora, s.rope),
    )


def _causal_keys(new: int, context: int, cap: int) -> int:
    """Sum over a chunk's queries of min(keys visible, cap); cap 0 = uncapped."""
    first, last = context + 1, context + new
    if cap <= 0 or cap >= last:
        return (first + last) * new // 2
    if cap <= first:
        return cap * new
    growing = cap - first + 1
    return (first + cap) * growing // 2 + cap * (new - growing)


def _indexer_nodes(model: ModelSpec, queries: int, keys: int, span: int, batch: int, act: DType) -> list[KernelWork]:
    """Indexer scoring of `queries` queries over `keys` (query, key) pairs and top-k selection."""
    assert model.dsa is not None
    d = model.dsa
    row = indexer_cache_bytes_per_token(d.index_head_dim)
    logits = KernelWork(
        kind=KernelKind.GEMM, name="dsa_indexer_logits", dtype=DType.FP8,
        flops=2.0 * d.index_n_heads * d.index_head_dim * keys,
        activation_bytes=float(queries * d.index_n_heads * (d.index_head_dim + 4) + keys * 4),
        kv_read_bytes=float(span * batch * row),
        shape=(queries * d.index_n_heads, span, d.index_head_dim),
    )
    # Top-k over each query's fp32 scores: read the scores, write index_topk indices.
    topk = KernelWork(
        kind=KernelKind.ELEMENTWISE, name="dsa_topk", dtype=DType.FLOAT32, flops=float(keys) * math.log2(max(2, span)),
        activation_bytes=float(keys * 4 + queries * min(span, d.index_topk) * 4),
        shape=(queries, span),
    )
    return [logits, topk]


def prefill_nodes(model: ModelSpec, precision: PrecisionSpec, hw: HardwareSpec, tp: int, *, new_tokens: int,
                  context_tokens: int, count: int) -> NodeList:
    """Attention of `count` alike prompt chunks, every layer."""
    s = MLAShapes.of(model, tp)
    act, kv = precision.activation_dtype, precision.kv_cache_dtype
    n_layers = s.layers
    span = new_tokens + context_tokens
    if model.dsa is not None:
        keys = _causal_keys(new_tokens, context_tokens, 0)
        sparse = _causal_keys(new_tokens, context_tokens, model.dsa.index_topk)
        queries = new_tokens * count
        out = [(w, n_layers) for w in _indexer_nodes(model, queries, keys * count, span, count, act)]
        out.append((_bmm("mla_gen_pre", queries, s.heads, s.kv_lora, s.nope, act), n_layers))
        work = _absorbed("mla_sparse", queries=queries, total=sparse * count, longest=min(span, model.dsa.index_topk),
                         s=s, act=act, kv=kv, writes=queries, row_bytes=latent_row_bytes(model, kv))
        out.append((work, n_layers))
        out.append((_bmm("mla_gen_post", queries, s.heads, s.v, s.kv_lora, act), n_layers))
        return out
    w = precision.linear_weight_dtype
    c = precision.gemm_compute_dtype(w, hw)
    decompress = gemm_work("mla_kv_b_proj", count * span, s.heads * (s.nope + s.v), s.kv_lora, w, act, c)
    if context_tokens:
        # The cached context's latent is read from the KV cache.
        decompress = KernelWork(kind=decompress.kind, name=decompress.name, dtype=decompress.dtype,
                                flops=decompress.flops, weight_bytes=decompress.weight_bytes,
                                activation_bytes=decompress.activation_bytes,
                                kv_read_bytes=float(count * context_tokens * s.latent()) * kv.bytes_per_element(),
                                shape=decompress.shape)
    keys = _causal_keys(new_tokens, context_tokens, 0)
    a = act.bytes_per_element()
    qk = s.nope + s.rope
    attention = KernelWork(
        kind=KernelKind.MLA_PREFILL, name="mla_prefill", dtype=kv,  # keyed by its KV format, as decode
        flops=2.0 * s.heads * (qk + s.v) * keys * count,
        # Queries and outputs of the new tokens; decompressed K and V of every visible key.
        activation_bytes=float(count * (new_tokens * s.heads * (qk + s.v) + span * s.heads * (qk + s.v))) * a,
        kv_write_bytes=float(count * new_tokens * s.latent()) * kv.bytes_per_element(),
        shape=(count, new_tokens, context_tokens, s.heads, s.nope, s.rope, s.v),
    )
    return [(decompress, n_layers), (attention, n_layers)]


def decode_nodes(model: ModelSpec, precision: PrecisionSpec, tp: int,
                 contexts: tuple[int, ...] | Mapping[int, int]) -> NodeList:
    """Absorbed decode of one new token per request against its cached context, every layer;
    `contexts` per request or as {context: requests}."""
    s = MLAShapes.of(model, tp)
    act, kv = precision.activation_dtype, precision.kv_cache_dtype
    n_layers = s.layers
    counts = contexts if isinstance(contexts, Mapping) else Counter(contexts)
    b = sum(counts.values())
    spans = {c + 1: k for c, k in counts.items()}  # span -> requests (c -> c + 1 is one to one)
    out: NodeList = []
    name = "mla_decode"
    if model.dsa is not None:
        out += [(w, n_layers) for w in _indexer_nodes(model, b, _total(spans), max(spans), b, act)]
        topk = model.dsa.index_topk
        capped: dict[int, int] = {}
        for x, k in spans.items():
            capped[min(x, topk)] = capped.get(min(x, topk), 0) + k
        spans = capped
        name = "mla_sparse"
    out.append((_bmm("mla_gen_pre", b, s.heads, s.kv_lora, s.nope, act), n_layers))
    work = _absorbed(name, queries=b, total=_total(spans), longest=max(spans), s=s, act=act, kv=kv, writes=b,
                     row_bytes=latent_row_bytes(model, kv))
    out.append((work, n_layers))
    out.append((_bmm("mla_gen_post", b, s.heads, s.v, s.kv_lora, act), n_layers))
    return out


def _total(spans: Mapping[int, int]) -> int:
    """Latent rows read in all: each span times the requests with it."""
    return sum(x * k for x, k in spans.items())


def verify_nodes(model: ModelSpec, precision: PrecisionSpec, tp: int, *, num_requests: int, context_tokens: int,
                 num_query_tokens: int) -> NodeList:
    """Absorbed attention of speculative verification, every layer: each request's
    `num_query_tokens` = k + 1 queries attend to its context and causally to each other (query j sees
    context + j + 1 latent rows). FlashMLA runs a request's queries together (as more query heads), so
    dense MLA reads each request's latent rows once; DSA's sparse attention picks rows per query, so
    its reads stay per query."""
    q, c = num_query_tokens, context_tokens
    nodes = decode_nodes(model, precision, tp, tuple(c + j for j in range(q)) * num_requests)
    if model.dsa is not None:
        return nodes
    s = MLAShapes.of(model, tp)
    rows = num_requests * (c + q)
    return [(dataclasses.replace(w, name="mla_verify", kv_read_bytes=float(rows * s.latent())
                                 * precision.kv_cache_dtype.bytes_per_element())
             if w.kind is KernelKind.MLA_DECODE else w, r) for w, r in nodes]
