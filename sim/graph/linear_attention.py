"""Kernels of Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5), as SGLang and vLLM run its
layers under tensor parallelism (heads split over the TP ranks, as for attention).

Per linear layer, for every token of the step (the token part):
- `in_proj_qkvz` (column-parallel: q and k of key_heads/TP x key_head_dim, v and the output gate z
  of value_heads/TP x value_head_dim), `in_proj_ba` (the write strength beta and the decay input a,
  one each per value head), `gdn_gated_norm` (RMSNorm of the output gated by silu(z)) and `out_proj`
  (row-parallel: value_heads/TP x value_head_dim -> h).

The token mixer proper depends on how many sequences the step carries and where each one stands,
so it belongs to the attention parts (`ATTENTION_NAMES`, `is_attention_work`):
- prefill (a chunk of new tokens per sequence), the kernels FLA's chunked gated delta rule
  (`chunk_gated_delta_rule`, chunks of `CHUNK_TOKENS`) launches: `gdn_conv1d` (the causal depthwise
  conv over q, k and v, reading and writing each sequence's conv state), `gdn_gating` (the decay
  and write strength), `gdn_qk_l2norm` (q and k), `gdn_chunk_cumsum` (the decay's running sum), then
  per chunk the WY form of the delta rule (`gdn_chunk_kkt`: beta k k^T; `gdn_chunk_solve_tril`:
  the unit-lower-triangular inverse; `gdn_chunk_wu`: w and u), `gdn_chunk_state` (across chunks:
  v_new = u - w S and the state update, reading and writing each sequence's recurrent state once
  and keeping every chunk's state) and `gdn_chunk_output` (q S plus the masked intra-chunk part).
- decode (one token per sequence): `gdn_conv1d` (`causal_conv1d_update`) and `gdn_recurrent`, the
  fused recurrent update (decay, delta write and read-out of the key_head_dim x value_head_dim
  state per value head): memory-bound on the state, which it reads and writes once per token.

Neither cost depends on the context length: a sequence's state has a fixed size. Nothing of Gated
DeltaNet is measured in the project's data, so these kernels are first-principles work priced by
the efficiency of the nearest measured kind: the chunk kernels as GEMMs of their shapes (one row per
token and value head), the conv, gating, norms and the recurrent update as pointwise
kernels over the bytes they move (the recurrent update as one row of key_head_dim x value_head_dim
state elements per sequence and value head).

FLOPs per token and value head (d_k, d_v the head widths, C the chunk): 2 C d_k (k k^T), floor(2 C^2
/ 3) (the triangular solve), 2 C (d_k + d_v) (w and u), 4 d_k d_v (w S and k^T v_new), 2 d_k d_v +
2 C (d_k + d_v) (the output). Work is counted per token (a prompt chunk of n tokens runs n / C
chunks, a last partial chunk unpadded), so every row is a polynomial of the token count.
"""

from __future__ import annotations

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork, gemm_work
from sim.specs.hardware import HardwareSpec
from sim.specs.model import LinearAttentionSpec, ModelSpec
from sim.specs.precision import PrecisionSpec

NodeList = list[tuple[KernelWork, int]]

CHUNK_TOKENS = 64
"""Chunk length of FLA's chunked gated delta rule (SGLang and vLLM both run FLA's kernels)."""

ATTENTION_NAMES = frozenset({"gdn_conv1d", "gdn_gating", "gdn_qk_l2norm", "gdn_chunk_cumsum", "gdn_chunk_kkt",
                             "gdn_chunk_solve_tril", "gdn_chunk_wu", "gdn_chunk_state", "gdn_chunk_output",
                             "gdn_recurrent"})
"""Linear-attention kernels whose work depends on the step's sequences (the attention parts)."""


def rank_shapes(model: ModelSpec, tp: int) -> LinearAttentionSpec:
    """The model's Gated DeltaNet shapes on one tensor-parallel rank."""
    assert model.linear_attention is not None
    return model.linear_attention.per_rank(tp)


def state_bytes_per_request(model: ModelSpec, tp: int, act: DType, layers: int) -> int:
    """Bytes one request's linear-attention state takes on one rank over `layers` linear layers:
    the recurrent state (`mamba_ssm_dtype`) and the conv state (activation dtype)."""
    s = rank_shapes(model, tp)
    per_layer = (s.state_elements() * s.state_dtype.bytes_per_element()
                 + s.conv_state_elements() * act.bytes_per_element())
    return int(layers * per_layer)


def token_nodes(model: ModelSpec, precision: PrecisionSpec, hw: HardwareSpec, tp: int,
                tokens: int) -> tuple[NodeList, NodeList]:
    """The token part of the linear layers: (input projections, gated norm and output projection)."""
    s = rank_shapes(model, tp)
    act, w = precision.activation_dtype, precision.linear_weight_dtype
    c = precision.gemm_compute_dtype(w, hw)
    h, n = model.hidden_size, model.num_linear_layers()
    before = [
        (gemm_work("in_proj_qkvz", tokens, 2 * s.key_dim() + 2 * s.value_dim(), h, w, act, c), n),
        # The gates are small and stay in the activation dtype.
        (gemm_work("in_proj_ba", tokens, 2 * s.num_value_heads, h, act, act, act), n),
    ]
    width = s.value_dim()
    after = [
        (KernelWork(kind=KernelKind.NORM, name="gdn_gated_norm", dtype=act, flops=8.0 * tokens * width,
                    activation_bytes=3.0 * tokens * width * act.bytes_per_element(), shape=(tokens, width)), n),
        (gemm_work("out_proj", tokens, h, width, w, act, c), n),
    ]
    return before, after


def _conv(s: LinearAttentionSpec, tokens: int, sequences: int, act: DType) -> KernelWork:
    """The causal depthwise conv (with SiLU) over q, k, v of `tokens` tokens of `sequences`
    sequences, each reading and writing its conv state."""
    a = act.bytes_per_element()
    width = s.conv_dim()
    return KernelWork(kind=KernelKind.ELEMENTWISE, name="gdn_conv1d", dtype=act,
                      flops=float(tokens * width * (2 * s.conv_kernel_dim + 4)),
                      activation_bytes=float(2 * tokens * width * a + width * s.conv_kernel_dim * a
                                             + 2 * sequences * s.conv_state_elements() * a),
                      shape=(tokens, width))


def prefill_nodes(model: ModelSpec, precision: PrecisionSpec, tp: int, *, new_tokens: int, count: int) -> NodeList:
    """Linear-attention kernels of `count` alike prompt chunks of `new_tokens` each, every linear layer
    (the cached context is in the state, so its length does not matter). Work is counted per token
    (new_tokens / CHUNK_TOKENS chunks per sequence), so every row is a polynomial of the count."""
    s = rank_shapes(model, tp)
    act = precision.activation_dtype
    a, f32 = act.bytes_per_element(), 4
    t = new_tokens * count
    heads, dk, dv, c = s.num_value_heads, s.key_head_dim, s.value_head_dim, CHUNK_TOKENS
    rows = t * heads  # one row per (token, value head)
    state = float(count * s.state_elements() * s.state_dtype.bytes_per_element())
    # Every chunk's state, written by the state pass and read back by the output pass (per token: 1/C of one).
    chunk_states = rows * dk * dv * a / c

    def gemm(name: str, flops: float, io_bytes: float, shape: tuple[int, int, int], *,
             state_rw: bool = False) -> KernelWork:
        return KernelWork(kind=KernelKind.GEMM, name=name, dtype=act, flops=flops, activation_bytes=io_bytes,
                          kv_read_bytes=state if state_rw else 0.0, kv_write_bytes=state if state_rw else 0.0,
                          shape=shape)

    def pointwise(kind: KernelKind, name: str, width: int, passes_bytes: float) -> KernelWork:
        return KernelWork(kind=kind, name=name, dtype=act, flops=float(t * width) * 4.0,
                          activation_bytes=float(t * width) * passes_bytes, shape=(t, width))

    n = model.num_linear_layers()
    return [
        (_conv(s, t, count, act), n),
        # g = -exp(A) softplus(a + dt_bias) and beta = sigmoid(b): bf16 in, fp32 out.
        (pointwise(KernelKind.ELEMENTWISE, "gdn_gating", 2 * heads, a + f32), n),
        # L2 norm of q and of k (two launches of key_heads x key_head_dim per token).
        (pointwise(KernelKind.NORM, "gdn_qk_l2norm", s.key_dim(), 2.0 * a), 2 * n),
        (pointwise(KernelKind.ELEMENTWISE, "gdn_chunk_cumsum", heads, 2.0 * f32), n),
        # beta k k^T within each chunk (C x C per chunk and head, fp32 out).
        (gemm("gdn_chunk_kkt", 2.0 * rows * c * dk, rows * (dk * a + c * f32), (rows, c, dk)), n),
        # (I + A)^-1 of each chunk's strictly lower-triangular A.
        # FLOPs in whole numbers per row, so that a family's rows stay exact polynomials of the count
        # (block pricing checks them with ==).
        (gemm("gdn_chunk_solve_tril", float(rows * (2 * c * c // 3)), 2.0 * rows * c * f32, (rows, c, c)), n),
        # w = A^-1 (beta k exp(g)) and u = A^-1 (beta v).
        (gemm("gdn_chunk_wu", 2.0 * rows * c * (dk + dv), rows * (c * f32 + 2 * (dk + dv) * a), (rows, dk + dv, c)), n),
        # Across chunks: v_new = u - w S, S <- exp(g) S + k^T v_new; every chunk's S kept.
        (gemm("gdn_chunk_state", 4.0 * rows * dk * dv, rows * (2 * dk + 2 * dv) * a + chunk_states / 2,
              (rows, dv, dk), state_rw=True), n),
        # o = q S + (q k^T masked) v_new per chunk.
        (gemm("gdn_chunk_output", 2.0 * rows * (dk * dv + c * (dk + dv)),
              rows * (2 * dk + 2 * dv) * a + chunk_states / 2, (rows, dv, dk)), n),
    ]


def decode_nodes(model: ModelSpec, precision: PrecisionSpec, tp: int, batch: int) -> NodeList:
    """Linear-attention kernels of one new token for each of `batch` sequences, every linear layer."""
    s = rank_shapes(model, tp)
    act = precision.activation_dtype
    a = act.bytes_per_element()
    dk, dv = s.key_head_dim, s.value_head_dim
    state = s.state_elements() * s.state_dtype.bytes_per_element()
    io = batch * (s.conv_dim() + s.value_dim() + 2 * s.num_value_heads) * a
    recurrent = KernelWork(kind=KernelKind.ELEMENTWISE, name="gdn_recurrent", dtype=act,
                           flops=float(batch * s.num_value_heads * 7 * dk * dv),
                           activation_bytes=float(io), kv_read_bytes=float(batch * state),
                           kv_write_bytes=float(batch * state), shape=(batch * s.num_value_heads, dk * dv))
    n = model.num_linear_layers()
    return [(_conv(s, batch, batch, act), n), (recurrent, n)]
