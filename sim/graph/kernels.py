"""The work of one kernel launch, and a step's kernels with repeat counts.

`KernelWork` is what every cost model prices: FLOPs, bytes moved by category, dtype, a kind and
shape features. Behaviour keys on `kind`; `name` is a label for reports. Collectives carry
`comm_bytes` (the per-GPU message) and `group_size` instead of FLOPs.

Shape conventions (`shape`):
- GEMM: (m, n, k) for Y[m, n] = X[m, k] W[n, k]^T
- MOE_GEMM: (routed_tokens, n, k, local_experts, active_experts)
- MOE: one fused MoE layer on one rank (routing + grouped expert GEMMs + finalize, no communication),
  the key of `moe.csv.gz`: (num_tokens, hidden_size, inter_size, topk, num_experts, moe_tp_size,
  moe_ep_size); `inter_size` is the full (unsharded) expert width, `num_tokens` the tokens entering the
  layer on this rank before top-k expansion; `variant` is the routing distribution (`balanced`,
  `power_law_1.2`, ...); `dtype` is the expert weight format (`moe_dtype`)
- MLA_PREFILL: (batch, new_tokens, context_tokens, heads, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
  decompressed (un-absorbed) MLA attention over fresh tokens, per-GPU heads (`mla_context`)
- MLA_DECODE: (batch, mean_kv_tokens, max_kv_tokens, heads, kv_lora_rank, qk_rope_head_dim)
  weight-absorbed MLA decode against the latent cache; kv_tokens include the new token (`mla_generation`);
  for both MLA attention kinds `dtype` is the KV-cache format (`kv_cache_dtype`)
- MLA_BMM: (tokens, heads, n, k) per-head batched matmul around absorbed decode; `variant` is
  `mla_gen_pre` (q_nope -> latent) or `mla_gen_post` (latent -> v) (`mla_bmm`)
- EP_ALL_TO_ALL: (num_tokens_per_rank, hidden_size, topk, num_experts, num_gpus, node_num) one
  expert-parallel dispatch + combine pair (DeepEP); `variant` is `normal` (prefill) or `low_latency`
  (decode) (`deepep_normal` / `deepep_ll`); `comm_bytes` and `group_size` as for collectives
- ATTN_PREFILL: (batch, new_tokens, context_tokens, heads, kv_heads, head_dim, window)
- ATTN_DECODE: (batch, mean_kv_tokens, max_kv_tokens, heads, kv_heads, head_dim, window)
- NORM, ELEMENTWISE, EMBEDDING, SAMPLING: (tokens, width)
- collectives: (message_bytes, group_size)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum

from sim.dtypes import DType


class KernelKind(StrEnum):
    GEMM = "gemm"
    MOE_GEMM = "moe_gemm"
    MOE = "moe"
    MLA_PREFILL = "mla_prefill"
    MLA_DECODE = "mla_decode"
    MLA_BMM = "mla_bmm"
    ATTN_PREFILL = "attn_prefill"
    ATTN_DECODE = "attn_decode"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    EMBEDDING = "embedding"
    SAMPLING = "sampling"
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    EP_ALL_TO_ALL = "ep_all_to_all"

    def is_collective(self) -> bool:
        return self in _COLLECTIVES


_COLLECTIVES = frozenset({KernelKind.ALL_REDUCE, KernelKind.ALL_GATHER, KernelKind.REDUCE_SCATTER,
                          KernelKind.ALL_TO_ALL, KernelKind.SEND_RECV, KernelKind.EP_ALL_TO_ALL})


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelWork:
    """Work of one kernel launch on one GPU."""

    kind: KernelKind
    name: str
    dtype: DType
    flops: float = 0.0
    weight_bytes: float = 0.0
    activation_bytes: float = 0.0
    """Activations read plus written."""
    kv_read_bytes: float = 0.0
    kv_write_bytes: float = 0.0
    comm_bytes: float = 0.0
    """Per-GPU message size of a collective (the buffer each rank contributes or receives)."""
    group_size: int = 1
    shape: tuple[int, ...] = ()
    variant: str = ""
    """Kind-specific discriminator the kernel models key on (see the shape conventions above); empty
    for kinds that have none."""

    def bytes_moved(self) -> float:
        """HBM traffic of a compute kernel (collectives move `comm_bytes` over links instead)."""
        return self.weight_bytes + self.activation_bytes + self.kv_read_bytes + self.kv_write_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelNode:
    """A kernel launched `repeat` times in the step (e.g. once per layer)."""

    work: KernelWork
    repeat: int

    def __post_init__(self) -> None:
        assert self.repeat >= 1, self.repeat


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelGraph:
    """The kernels one step launches on the critical-path GPU, in launch order."""

    nodes: tuple[KernelNode, ...]

    def num_launches(self) -> int:
        return sum(n.repeat for n in self.nodes)

    def total_flops(self) -> float:
        return sum(n.work.flops * n.repeat for n in self.nodes)

    def total_bytes(self) -> float:
        return sum(n.work.bytes_moved() * n.repeat for n in self.nodes)

    def flops_by_kind(self) -> dict[KernelKind, float]:
        out: dict[KernelKind, float] = defaultdict(float)
        for n in self.nodes:
            out[n.work.kind] += n.work.flops * n.repeat
        return dict(out)


def gemm_work(name: str, m: int, n: int, k: int, weight_dtype: DType, act_dtype: DType,
              compute_dtype: DType) -> KernelWork:
    """Y[m, n] = X[m, k] W[n, k]^T: 2mnk FLOPs, the weight and each activation read or written once."""
    a = act_dtype.bytes_per_element()
    return KernelWork(
        kind=KernelKind.GEMM, name=name, dtype=compute_dtype,
        flops=2.0 * m * n * k,
        weight_bytes=float(n * k) * weight_dtype.bytes_per_element(),
        activation_bytes=float(m * k + m * n) * a,
        shape=(m, n, k),
    )


def pointwise_work(kind: KernelKind, name: str, tokens: int, width: int, dtype: DType,
                   passes: float, flops_per_element: float = 1.0) -> KernelWork:
    """A memory-bound kernel touching `passes` tensors of tokens x width elements."""
    return KernelWork(
        kind=kind, name=name, dtype=dtype,
        flops=flops_per_element * tokens * width,
        activation_bytes=passes * tokens * width * dtype.bytes_per_element(),
        shape=(tokens, width),
    )
