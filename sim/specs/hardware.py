"""Datasheet description of one accelerator system: compute peaks, memory, links.

Only vendor-published facts live here (see each TOML's `[source]` table); fitted efficiencies,
measured link latencies and host overheads live in calibration artifacts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from sim.dtypes import PEAK_KEYS, DType
from sim.serde import require

LinkKind = Literal["nvlink", "pcie", "xelink", "infiniband", "ethernet"]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkSpec:
    """One class of interconnect hop, priced by the alpha-beta collective model."""

    kind: LinkKind
    bandwidth_bytes_per_s: float
    """Unidirectional bandwidth per GPU."""
    latency_s: float
    """Per-message fixed cost (alpha) as published with the spec."""

    def __post_init__(self) -> None:
        require(0 < self.bandwidth_bytes_per_s < math.inf, "bandwidth_bytes_per_s", self.bandwidth_bytes_per_s,
                "must be a finite number > 0")
        require(0 <= self.latency_s < math.inf, "latency_s", self.latency_s, "must be a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class NvlinkSpec:
    """NVLink fabric of an NVLink GPU (`[nvlink]`): what the collective model's algorithm choice
    reads (docs/hardware.md). Datasheet facts only."""

    generation: int
    """NVLink generation: 3 (A100), 4 (H100/H200), 5 (Blackwell)."""
    links_per_gpu: int
    """NVLink links (lanes) per GPU: 12 on A100, 18 on H100/H200/B200."""
    link_bandwidth_bytes_per_s: float
    """Unidirectional bandwidth of one link: 25e9 (NVLink 3 and 4), 50e9 (NVLink 5)."""
    switch_generation: int = 0
    """NVSwitch generation the GPUs connect through: 0 none (direct links), 2 (A100 HGX), 3 (H100 /
    H200 HGX, the first with NVLink SHARP), 4 (Blackwell NVLink Switch)."""
    nvls: bool = False
    """NVLink SHARP (NVLS): in-switch reduction and multicast that NCCL uses for all-reduce,
    all-gather and reduce-scatter inside the NVLink domain (needs switch generation >= 3)."""

    def __post_init__(self) -> None:
        require(1 <= self.generation <= 5, "generation", self.generation, "must be 1..5")
        require(self.links_per_gpu > 0, "links_per_gpu", self.links_per_gpu, "must be > 0")
        require(0 < self.link_bandwidth_bytes_per_s < math.inf, "link_bandwidth_bytes_per_s",
                self.link_bandwidth_bytes_per_s, "must be > 0")
        require(0 <= self.switch_generation <= 5, "switch_generation", self.switch_generation,
                "must be 0 (no switch) .. 5")
        require(not self.nvls or self.switch_generation >= 3, "nvls", self.nvls,
                "needs switch_generation >= 3 (NVLink SHARP arrived with the third-generation NVSwitch)")

    def bandwidth_bytes_per_s(self) -> float:
        """All links of one GPU, one direction."""
        return self.links_per_gpu * self.link_bandwidth_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class HardwareSpec:
    """One GPU of a system and the node it sits in."""

    name: str
    """Catalog name, e.g. `h100_sxm`; equals the TOML file stem."""
    description: str
    vendor: Literal["nvidia", "intel", "toy"]
    num_sms: int
    """Streaming multiprocessors (Intel: Xe-cores); sets wave quantisation."""
    l2_cache_bytes: int
    boost_clock_hz: float
    hbm_bandwidth_bytes_per_s: float
    hbm_capacity_bytes: int
    power_w: float
    num_gpus_per_node: int
    pcie_bandwidth_bytes_per_s: float
    peak_flops_per_s: Mapping[str, float]
    """Dense tensor-core peak per rate class (`bf16`, `fp16`, `fp8`, `fp4`, `int8`); absent = unsupported."""
    intra_node_link: LinkSpec
    inter_node_link: LinkSpec
    sm_version: int | None = None
    """Compute capability x10 (90 for Hopper); None for non-NVIDIA parts."""
    nvlink_domain_size: int | None = None
    """GPUs that reach each other over `intra_node_link` (one NVLink/NVSwitch domain): 72 for
    GB200/GB300 NVL72 racks, whose trays hold 4 GPUs each; None = `num_gpus_per_node` (resolved
    when the spec is built, so it is always an int afterwards)."""
    nvlink: NvlinkSpec | None = None
    """NVLink fabric (`[nvlink]`); None for GPUs without NVLink."""
    pcie_peer_group_size: int | None = None
    """PCIe-only nodes: GPUs that reach each other peer-to-peer (behind one PCIe switch); a
    collective over more GPUs passes between the groups through host memory. None = every GPU of
    the node; resolved to `num_gpus_per_node` on load."""
    tables_pcie_peer_group_size: int | None = None
    """`pcie_peer_group_size` of the host the GPU's measured kernel tables come from, which the
    fitted collective families describe; a node wired otherwise prices its collectives relative to
    it. None = not known (no tables of this GPU): the fitted collectives cannot be moved to another
    wiring, so `pcie_peer_group_size` must then be the node."""
    source: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Where each group of numbers comes from."""

    def __post_init__(self) -> None:
        for key in ("num_sms", "l2_cache_bytes", "hbm_capacity_bytes", "num_gpus_per_node"):
            value = getattr(self, key)
            require(0 < value < math.inf, key, value, "must be a finite number > 0")
        domain = self.num_gpus_per_node if self.nvlink_domain_size is None else self.nvlink_domain_size
        object.__setattr__(self, "nvlink_domain_size", domain)
        require(domain >= self.num_gpus_per_node
                and domain % self.num_gpus_per_node == 0, "nvlink_domain_size", domain,
                f"must be a multiple of num_gpus_per_node ({self.num_gpus_per_node}): a domain of whole nodes")
        if self.pcie_peer_group_size is None:
            object.__setattr__(self, "pcie_peer_group_size", self.num_gpus_per_node)
        for key in ("pcie_peer_group_size", "tables_pcie_peer_group_size"):
            peers = getattr(self, key)
            if peers is None:
                continue
            require(1 <= peers <= self.num_gpus_per_node and self.num_gpus_per_node % peers == 0, key, peers,
                    f"must divide num_gpus_per_node ({self.num_gpus_per_node}): the node's GPUs in equal peer groups")
            require(peers == self.num_gpus_per_node or self.intra_node_link.kind == "pcie", key, peers,
                    f"applies to PCIe nodes only (intra_node_link.kind is {self.intra_node_link.kind!r})")
        require(self.pcie_peer_group_size == self.num_gpus_per_node or self.tables_pcie_peer_group_size is not None,
                "pcie_peer_group_size", self.pcie_peer_group_size,
                f"{self.name} does not say how the host of its measured kernel tables was wired "
                "(tables_pcie_peer_group_size): its fitted collectives (the cross-generation residual, learned "
                "from PCIe hosts wired both ways) cannot be moved to another wiring; only the whole node "
                f"({self.num_gpus_per_node}) is simulated for it")
        rates = ("boost_clock_hz", "hbm_bandwidth_bytes_per_s", "power_w", "pcie_bandwidth_bytes_per_s")
        for key in rates:
            value = getattr(self, key)
            # An infinite rate would price its kernels at zero time: silently wrong, not an error.
            require(0 < value < math.inf, key, value, "must be a finite number > 0")
        for key, rate in self.peak_flops_per_s.items():
            require(key in PEAK_KEYS, f"peak_flops_per_s.{key}", rate,
                    f"unknown rate class; known: {', '.join(PEAK_KEYS)}")
            require(0 < rate < math.inf, f"peak_flops_per_s.{key}", rate, "must be a finite number > 0")
        require("bf16" in self.peak_flops_per_s or "fp16" in self.peak_flops_per_s,
                "peak_flops_per_s", dict(self.peak_flops_per_s), "must give bf16 or fp16")
        if self.nvlink is not None:
            link = self.intra_node_link
            total = self.nvlink.bandwidth_bytes_per_s()
            require(link.kind == "nvlink", "nvlink", link.kind, "needs intra_node_link.kind = \"nvlink\"")
            require(abs(total - link.bandwidth_bytes_per_s) <= 0.05 * link.bandwidth_bytes_per_s,
                    "nvlink.links_per_gpu", self.nvlink.links_per_gpu,
                    f"links_per_gpu x link_bandwidth_bytes_per_s = {total:.4g} must match "
                    f"intra_node_link.bandwidth_bytes_per_s = {link.bandwidth_bytes_per_s:.4g} (within 5%)")

    def supports(self, dtype: DType) -> bool:
        return dtype.peak_key() in self.peak_flops_per_s

    def peak_flops_for(self, dtype: DType) -> float:
        """Dense peak for `dtype`; 16-bit rate for formats the tensor cores lack (upcast)."""
        rates = self.peak_flops_per_s
        key = dtype.peak_key()
        if key in rates:
            return rates[key]
        return rates.get("bf16", rates.get("fp16", 0.0))

    def ridge_point_flops_per_byte(self, dtype: DType) -> float:
        return self.peak_flops_for(dtype) / self.hbm_bandwidth_bytes_per_s

    def nvlink_domain(self) -> int:
        """GPUs reached over `intra_node_link` (`nvlink_domain_size`, resolved)."""
        assert self.nvlink_domain_size is not None
        return self.nvlink_domain_size

    def link_for_group(self, group_size: int) -> LinkSpec:
        """The slowest hop a collective over `group_size` consecutive GPUs crosses: the intra-node
        link within one NVLink domain (a node, or an NVL72 rack), the inter-node link beyond."""
        return self.intra_node_link if group_size <= self.nvlink_domain() else self.inter_node_link
