"""Roofline bounds: compute at the dense tensor-core peak, memory at HBM bandwidth, collectives at
link bandwidth. Pure functions of (work, hardware)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sim.graph.kernels import KernelKind, KernelWork
from sim.specs.hardware import HardwareSpec


class Bound(StrEnum):
    COMPUTE = "compute"
    MEMORY = "memory"
    NETWORK = "network"


@dataclass(frozen=True, slots=True)
class Roofline:
    compute_s: float
    memory_s: float
    network_s: float = 0.0

    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s, self.network_s)

    def bound(self) -> Bound:
        if self.network_s >= max(self.compute_s, self.memory_s):
            return Bound.NETWORK
        return Bound.COMPUTE if self.compute_s >= self.memory_s else Bound.MEMORY


def collective_wire_bytes(kind: KernelKind, message_bytes: float, group_size: int) -> float:
    """Bytes each GPU sends for a bandwidth-optimal (ring) collective over `group_size` ranks.

    All-reduce: 2(n-1)/n of the buffer; all-gather, reduce-scatter and all-to-all: (n-1)/n of
    the full buffer; send/recv: the whole message.
    """
    n = group_size
    if kind is KernelKind.SEND_RECV:
        return message_bytes
    if n <= 1:
        return 0.0
    if kind is KernelKind.ALL_REDUCE:
        return 2.0 * (n - 1) / n * message_bytes
    return (n - 1) / n * message_bytes


def roofline(work: KernelWork, hw: HardwareSpec) -> Roofline:
    if work.kind.is_collective():
        link = hw.link_for_group(work.group_size)
        wire = collective_wire_bytes(work.kind, work.comm_bytes, work.group_size)
        return Roofline(compute_s=0.0, memory_s=0.0, network_s=wire / link.bandwidth_bytes_per_s)
    return Roofline(
        compute_s=work.flops / hw.peak_flops_for(work.dtype),
        memory_s=work.bytes_moved() / hw.hbm_bandwidth_bytes_per_s,
    )
