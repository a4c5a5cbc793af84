"""The MoE layer as one fused kernel per rank, the rank-0 expert load, and the expert all-to-all.

One `KernelKind.MOE` node per MoE layer stands for routing + grouped expert GEMMs + finalize on one
rank (the key of the measured `moe.csv.gz`): shape (num_tokens, hidden, inter_size, topk,
num_experts, moe_tp, moe_ep) with `num_tokens` the tokens entering the layer over the MoE group
(the batch of every attention-data-parallel rank, assumed equal), `inter_size` the full expert
width, `variant` the routing distribution and `dtype` the expert weight format.

Its roofline work is that of the most loaded rank (rank 0, as the measured tables emulate it):

- `balanced` (round-robin top-k): routed (token, expert) pairs per rank = num_tokens x topk / moe_ep;
  local experts touched = min(num_experts / moe_ep, pairs).
- `power_law_<alpha>`: AIConfigurator's generator (`_generate_power_law_distribution` in its
  collector): every expert's load is drawn from a power law on [1, 0.8 x num_tokens] (exponent
  alpha), scaled to num_tokens x topk pairs and capped at num_tokens per expert; experts sit on
  ranks in contiguous groups in random order and the busiest group is rank 0. Rank 0's share of the
  pairs and its touched experts are the mean over `_DRAWS` draws of a generator seeded from the shape
  (deterministic, no global state). When num_tokens x topk <= num_experts the loads are drawn on
  [0.01, 2], as AIConfigurator does.

FLOPs = 2 x 3 x pairs x hidden x inter / moe_tp (gate, up, down); bytes = touched local experts'
weights + activations (the input per token, the dispatched rows, the gate-up output and activation,
the combined output).

The expert all-to-all (`KernelKind.EP_ALL_TO_ALL`, DeepEP) carries each rank's token selections:
dispatch in FP8 where the GPU has FP8 (hidden + hidden/128 x 4 + 16 bytes per selection, DeepEP's
low-latency format), else BF16 (2 x hidden), combine in BF16 (2 x hidden per selection).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import numpy as np

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
from sim.specs.engine import routing_alpha

_DRAWS = 32


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLoad:
    """Work of the most loaded expert-parallel rank at one MoE layer."""

    routed_pairs: float
    """(token, local expert) pairs the rank computes."""
    active_experts: float
    """Local experts that receive at least one token (their weights are read)."""


def rank0_load(*, num_tokens: int, num_experts: int, topk: int, ep: int, routing: str) -> RankLoad:
    """Rank-0 load under the routing distribution (see the module docstring)."""
    local = num_experts // ep
    pairs = num_tokens * topk
    alpha = routing_alpha(routing)
    assert alpha is not False, routing
    if alpha is None:
        per_rank = pairs / ep
        return RankLoad(routed_pairs=per_rank, active_experts=min(float(local), per_rank))
    seed = zlib.crc32(f"{num_tokens},{num_experts},{topk},{ep},{routing}".encode())
    rng = np.random.default_rng(seed)
    lo, hi = (1.0, max(num_tokens * 0.8, 1.0 + 1e-9)) if pairs > num_experts else (0.01, 2.0)
    u = rng.random((_DRAWS, num_experts))
    a = 1.0 - alpha
    loads = ((hi ** a - lo ** a) * u + lo ** a) ** (1.0 / a)
    loads = np.minimum(loads / loads.sum(axis=1, keepdims=True) * pairs, float(num_tokens))
    # The pairs cut by the cap go to the experts below it (AIConfigurator: to the smallest first).
    free = loads < num_tokens
    loads += free * ((pairs - loads.sum(axis=1, keepdims=True)) / np.maximum(free.sum(axis=1, keepdims=True), 1))
    groups = loads.reshape(_DRAWS, ep, local)
    busiest = groups.sum(axis=2).argmax(axis=1)
    rank0 = groups[np.arange(_DRAWS), busiest]
    return RankLoad(routed_pairs=float(rank0.sum(axis=1).mean()),
                    active_experts=float((rank0 >= 0.5).sum(axis=1).mean()))


def moe_work(*, num_tokens: int, hidden: int, inter_size: int, topk: int, num_experts: int, moe_tp: int,
             moe_ep: int, routing: str, weight_dtype: DType, compute_dtype: DType, act: DType) -> KernelWork:
    """One fused MoE layer on rank 0 (no communication)."""
    load = rank0_load(num_tokens=num_tokens, num_experts=num_experts, topk=topk, ep=moe_ep, routing=routing)
    width = inter_size // moe_tp
    a = act.bytes_per_element()
    return KernelWork(
        kind=KernelKind.MOE, name="moe_experts", dtype=compute_dtype,
        flops=2.0 * 3.0 * load.routed_pairs * hidden * width,
        weight_bytes=load.active_experts * 3.0 * hidden * width * weight_dtype.bytes_per_element(),
        activation_bytes=(2.0 * num_tokens * hidden + load.routed_pairs * (2.0 * hidden + 3.0 * width)) * a,
        shape=(num_tokens, hidden, inter_size, topk, num_experts, moe_tp, moe_ep),
        variant=routing,
    )


def deepep_bytes_per_selection(hidden: int, *, fp8_dispatch: bool) -> float:
    """Dispatch plus combine bytes of one (token, expert) selection in DeepEP."""
    dispatch = hidden + hidden / 128 * 4 + 16 if fp8_dispatch else 2.0 * hidden
    return dispatch + 2.0 * hidden


def ep_all_to_all_work(*, tokens_per_rank: int, hidden: int, topk: int, num_experts: int, ep: int,
                       gpus_per_node: int, fp8_dispatch: bool, decode_only: bool) -> KernelWork:
    """One DeepEP dispatch + combine pair; `normal` mode for steps with prefill, `low_latency` for
    decode-only steps (SGLang's `--deepep-mode auto`)."""
    node_num = max(1, math.ceil(ep / max(1, gpus_per_node)))
    message = tokens_per_rank * topk * deepep_bytes_per_selection(hidden, fp8_dispatch=fp8_dispatch)
    return KernelWork(
        kind=KernelKind.EP_ALL_TO_ALL, name="moe_all_to_all", dtype=DType.FP8 if fp8_dispatch else DType.BFLOAT16,
        comm_bytes=message, group_size=ep,
        shape=(tokens_per_rank, hidden, topk, num_experts, ep, node_num),
        variant="low_latency" if decode_only else "normal",
    )


def as_decode_only(work: KernelWork) -> KernelWork:
    """`work` as a decode-only step launches it (the expert all-to-all switches to low latency)."""
    if work.kind is KernelKind.EP_ALL_TO_ALL and work.variant != "low_latency":
        return replace(work, variant="low_latency")
    return work
