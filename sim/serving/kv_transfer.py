"""Price of moving one request's prompt KV from a prefill worker to a decode worker.

Bytes come from the model's real KV layout (`sim.graph.memory.kv_bytes_per_token` on the decode
worker: GQA heads per rank, MLA's compressed latent replicated on every attention-TP rank, DSA's
indexer keys, FP8 KV) per layer, times the model's attention layers and the decode worker's tensor
ranks: each tensor x pipeline rank receives its stage's share. Ranks transfer in parallel, one
link per GPU: the busiest side moves total / min(prefill ranks, decode ranks) bytes, at the
link's per-GPU bandwidth, plus one fixed latency per request's transfer.

Link: `nvlink` (the hardware's `intra_node_link`) when every worker of both pools fits in one
NVLink domain (`nvlink_domain_size`: 8 GPUs of an HGX node, 72 of an NVL72 rack) of one
hardware, else `inter_node` (`inter_node_link`, the RDMA NIC per GPU); a scenario may force either.

Connectors: `nixl` sends after the prefill has finished (vLLM's NixlConnector: the decode worker
reads the finished prompt's blocks), so the whole transfer is exposed. `layerwise` sends each
layer's KV once the layer is computed; with L layers computed evenly over the prefill's span S
and per-layer transfer time b = T / L, the last layer's KV arrives max(b, T - S (L - 1) / L)
after the prefill ends: only the last layer's share is exposed when the link keeps up with the
compute, the excess otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.graph.memory import attention_layers_per_stage, kv_bytes_per_token
from sim.specs.hardware import HardwareSpec, LinkSpec
from sim.specs.scenario import Disaggregation


@dataclass(frozen=True, slots=True, kw_only=True)
class TransferPath:
    link_name: str
    """`nvlink` or `inter_node`."""
    bandwidth_bytes_per_s: float
    latency_s: float
    bytes_per_token: int
    """KV bytes of one prompt token moved over the whole transfer (all receiving ranks)."""
    num_parallel_links: int
    """Ranks that send/receive at once: min(prefill worker ranks, decode worker ranks)."""
    num_layers: int
    layerwise: bool

    def transfer_s(self, num_tokens: int) -> float:
        """Time the whole transfer occupies the links, latency included."""
        return self.latency_s + num_tokens * self.bytes_per_token / self.num_parallel_links / self.bandwidth_bytes_per_s

    def exposed_s(self, num_tokens: int, prefill_span_s: float) -> float:
        """Time from the prefill's end to the KV being complete on the decode worker."""
        wire_s = num_tokens * self.bytes_per_token / self.num_parallel_links / self.bandwidth_bytes_per_s
        if not self.layerwise:
            return self.latency_s + wire_s
        layers = self.num_layers
        return self.latency_s + max(wire_s / layers, wire_s - prefill_span_s * (layers - 1) / layers)


def nvlink_domain_size(hw: HardwareSpec) -> int:
    """GPUs one NVLink domain holds (`nvlink_domain_size`, resolved to a node where the spec is silent)."""
    return hw.nvlink_domain_size or hw.num_gpus_per_node


def transfer_path(disagg: Disaggregation) -> TransferPath:
    prefill, decode = disagg.prefill.scenario, disagg.decode.scenario
    hw = decode.hardware
    link: LinkSpec
    if disagg.transfer_link == "auto":
        same = prefill.hardware.name == hw.name
        nvlink = same and disagg.num_gpus() <= nvlink_domain_size(hw)
    else:
        nvlink = disagg.transfer_link == "nvlink"
    link = hw.intra_node_link if nvlink else hw.inter_node_link
    if not nvlink and prefill.hardware.inter_node_link.bandwidth_bytes_per_s < link.bandwidth_bytes_per_s:
        link = prefill.hardware.inter_node_link  # the slower NIC of the two ends
    engine = decode.engine
    receivers = engine.tensor_parallel_size * engine.pipeline_parallel_size
    senders = prefill.engine.tensor_parallel_size * prefill.engine.pipeline_parallel_size
    # A rank's bytes are those of its stage's layers (the most loaded stage's count): per layer, times
    # every attention layer of the model, once per tensor rank (the stages hold the layers between them).
    per_layer = kv_bytes_per_token(decode.model, engine, decode.precision) // attention_layers_per_stage(
        decode.model, engine)
    total = per_layer * decode.model.num_attention_layers() * engine.tensor_parallel_size
    latency = disagg.transfer_latency_s if disagg.transfer_latency_s is not None else link.latency_s
    return TransferPath(
        link_name="nvlink" if nvlink else "inter_node", bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
        latency_s=latency, bytes_per_token=total, num_parallel_links=min(senders, receivers),
        num_layers=decode.model.num_layers, layerwise=disagg.connector == "layerwise",
    )
