"""The MoE layer as one fused kernel per rank, the rank-0 expert load, and the expert all-to-all.

One `KernelKind.MOE` node per MoE layer stands for routing + grouped expert GEMMs + finalize on one
rank (the key of the measured `moe.csv.gz`): shape (num_tokens, hidden, inter_size, topk,
num_experts, moe_tp, moe_ep) with `num_tokens` the tokens entering the layer over the MoE group
(DP x the attention-data-parallel ranks' padded batch), `num_experts` the expert slots (the model's
experts plus EPLB's redundant copies), `inter_size` the full expert width, `variant` the routing
distribution (`<routing>_eplb` under EPLB) and `dtype` the expert weight format.

Its roofline work is that of the most loaded rank (rank 0, as the measured tables emulate it):

- `balanced` and `power_law_<alpha>`: rank 0's routed (token, expert) pairs and touched local
  experts as AIConfigurator's collector routes them (`sim.graph.moe_routing`, shared with the fitted
  MoE kernel family), a power law as a router meets it (`served`): where a few tokens meet many
  experts, the collector's draws with the experts shuffled over the ranks (its repair puts them all
  on rank 0).

FLOPs = 2 x 3 x pairs x hidden x inter / moe_tp (gate, up, down); bytes = touched local experts'
weights + activations (the input per token, the dispatched rows, the gate-up output and activation,
the combined output).

The expert all-to-all (`KernelKind.EP_ALL_TO_ALL`, DeepEP) carries each rank's token selections:
dispatch in FP8 where the GPU has FP8 (hidden + hidden/128 x 4 + 16 bytes per selection, DeepEP's
low-latency format), else BF16 (2 x hidden), combine in BF16 (2 x hidden per selection).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.moe_routing import moe_rank0_load, moe_rank0_loads, served
from sim.specs.engine import EngineParams, routing_alpha
from sim.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLoad:
    """Work of the most loaded expert-parallel rank at one MoE layer."""

    routed_pairs: float
    """(token, local expert) pairs the rank computes."""
    active_experts: float
    """Local experts that receive at least one token (their weights are read)."""


def eplb_routing(routing: str) -> str:
    """The MoE node's variant under EPLB: `<routing>_eplb` (AIConfigurator's name for its wide-EP rows
    collected with EPLB), `balanced` staying `balanced`."""
    return routing if routing == "balanced" else f"{routing}_eplb"


def rank0_load(*, num_tokens: int, num_experts: int, topk: int, ep: int, routing: str) -> RankLoad:
    """Rank-0 load under the routing distribution (`sim.graph.moe_routing`). Under EPLB
    (`<routing>_eplb`) the load is the balanced one over the physical expert slots: EPLB places and
    replicates experts by measured load so that ranks receive even shares, which is how the fitted
    `moe` family reads the measured `_eplb` rows too (`sim.perf.table_kernels.moe_batch`)."""
    assert routing == "balanced" or routing_alpha(routing.removesuffix("_eplb")) is not False, routing
    pairs, active, _ = moe_rank0_load(num_tokens, num_experts, topk, ep, served(routing))
    return RankLoad(routed_pairs=pairs, active_experts=active)


def draw_rank0_loads(shapes: Sequence[tuple[int, ...]], routing: str) -> None:
    """Rank-0 loads of MOE kernels of these shapes (`moe_work`'s shape tuple) drawn at once, so that
    `rank0_load` of each finds its value kept (the same values as drawn one by one)."""
    routing = served(routing)
    moe_rank0_loads([(s[0], s[4], s[3], s[6], routing) for s in shapes])




def moe_work(*, num_tokens: int, hidden: int, inter_size: int, topk: int, num_experts: int, moe_tp: int,
             moe_ep: int, routing: str, weight_dtype: DType, act: DType) -> KernelWork:
    """One fused MoE layer on rank 0 (no communication). Its `dtype` is the expert weight format, as
    the measured tables key the fused layer (`moe_dtype`): a weight-only format keeps its name where
    the GPU lacks its tensor cores (MXFP4 experts on Hopper run TensorRT-LLM's W4A16 MXFP4 kernel,
    Kimi-K2.5's INT4 experts the W4A16 INT4 one), and the roofline computes such formats at the
    16-bit rate (`HardwareSpec.peak_flops_for`)."""
    load = rank0_load(num_tokens=num_tokens, num_experts=num_experts, topk=topk, ep=moe_ep, routing=routing)
    width = inter_size // moe_tp
    a = act.bytes_per_element()
    return KernelWork(
        kind=KernelKind.MOE, name="moe_experts", dtype=weight_dtype,
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


def uses_expert_all_to_all(engine: EngineParams) -> bool:
    """Whether the MoE layers move tokens between ranks: expert parallelism over attention-DP ranks.

    With attention data parallelism each rank holds only its own batch, so tokens travel to the
    ranks of their experts and back (DeepEP dispatch + combine). Without it every rank of the
    expert-parallel group holds the whole batch (attention's output is all-reduced over TP), so the
    engines run each rank's local experts on all tokens and sum the partial outputs in the layer's
    tensor-parallel all-reduce: vLLM (`use_all2all_kernels = dp_size > 1 and use_ep`), TensorRT-LLM
    (`CutlassFusedMoE` gathers only `if self.use_dp and self.parallel_size > 1`) and SGLang with its
    default `moe_a2a_backend = none`."""
    return engine.expert_parallel_size() > 1 and engine.data_parallel_size > 1


TRTLLM_GATHER_BYTES_PER_ELEMENT: Final[dict[DType, float]] = {
    DType.NVFP4: DType.NVFP4.bytes_per_element(), DType.FP8: 1.0}
"""Bytes per hidden element TensorRT-LLM's attention-DP allgather moves for experts of this format
(`CutlassFusedMoE.quantize_input` before the post-quant allgather: NVFP4 values and scales, FP8 QDQ
per-tensor; the other formats, FP8 block scales among them, gather the BF16 activations)."""


def trtllm_gathers_expert_tokens(engine: EngineParams, *, topk: int, ep: int, multi_node_nvlink: bool) -> bool:
    """Whether TensorRT-LLM's expert parallelism over attention-DP ranks moves the tokens by an
    allgather before the experts and a reducescatter after instead of an all-to-all.

    `CutlassFusedMoE.select_alltoall_method_type` enables an all-to-all only when `moe_ep_size >
    top_k` and MNNVL is supported (a multi-node NVLink domain: GB200 / GB300 NVL72), or DeepEP is
    opted into with `TRTLLM_CAN_USE_DEEP_EP=1`; otherwise `run_post_quant_allgather` gathers every
    DP rank's tokens (with their routing) onto every rank and `reducescatter` returns each rank its
    own rows. So DeepSeek-R1 at EP 8 (top-8) always gathers, and on 8-GPU H100 / H200 / B200 nodes so
    does every layout. AIConfigurator prices the same path (`MoEDispatch`: NCCL all_gather and
    reduce_scatter of the tokens x DP)."""
    return (engine.backend == "trtllm" and uses_expert_all_to_all(engine)
            and not (ep > topk and multi_node_nvlink))


def expert_all_to_all(engine: EngineParams, *, topk: int, hw: HardwareSpec) -> bool:
    """Whether the MoE layers move tokens by an expert all-to-all (priced as DeepEP): expert
    parallelism over attention-DP ranks (`uses_expert_all_to_all`), except where TensorRT-LLM
    gathers them instead (`trtllm_gathers_expert_tokens`)."""
    return uses_expert_all_to_all(engine) and not trtllm_gathers_expert_tokens(
        engine, topk=topk, ep=engine.expert_parallel_size(), multi_node_nvlink=multi_node_nvlink(hw))


def multi_node_nvlink(hw: HardwareSpec) -> bool:
    """Whether the GPU's NVLink domain spans nodes (MNNVL: GB200 / GB300 NVL72 racks)."""
    return hw.nvlink_domain() > hw.num_gpus_per_node


def sequence_parallel_moe(engine: EngineParams) -> bool:
    """Whether vLLM runs its MoE layers sequence-parallel over attention TP (`ParallelConfig.
    use_sequence_parallel_moe`: expert parallelism, TP > 1 and DP > 1, with its default
    `allgather_reducescatter` and the DeepEP all2all backends): each TP rank sends its 1/TP slice of the
    tokens to the experts (`sequence_parallel_chunk`) and the layer ends with an all-gather of the
    slices over TP (`tensor_model_parallel_all_gather`) instead of the TP all-reduce."""
    return (engine.backend == "vllm" and uses_expert_all_to_all(engine) and engine.tensor_parallel_size > 1
            and engine.moe_tp_size() == 1)


def ep_all_to_all_work(*, tokens_per_rank: int, hidden: int, topk: int, num_experts: int, ep: int,
                       nvlink_domain: int, fp8_dispatch: bool, decode_only: bool) -> KernelWork:
    """One DeepEP dispatch + combine pair; `normal` mode for steps with prefill, `low_latency` for
    decode-only steps (SGLang's `--deepep-mode auto`). `node_num` counts the NVLink domains the
    EP ranks span (nodes, or NVL72 racks: DeepEP's intranode kernels run over the whole domain)."""
    node_num = max(1, math.ceil(ep / max(1, nvlink_domain)))
    message = tokens_per_rank * topk * deepep_bytes_per_selection(hidden, fp8_dispatch=fp8_dispatch)
    return KernelWork(
        kind=KernelKind.EP_ALL_TO_ALL, name="moe_all_to_all", dtype=DType.FP8 if fp8_dispatch else DType.BFLOAT16,
        comm_bytes=message, group_size=ep,
        shape=(tokens_per_rank, hidden, topk, num_experts, ep, node_num),
        variant="low_latency" if decode_only else "normal",
    )
