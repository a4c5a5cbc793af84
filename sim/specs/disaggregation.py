"""`[disaggregation]`: prefill/decode disaggregated serving (a prefill pool and a decode pool).

```toml
[disaggregation]
connector = "nixl"            # how KV moves: "nixl" (after the prefill) or "layerwise"
[disaggregation.prefill]
num_workers = 2
engine = { tensor_parallel_size = 8, max_num_batched_tokens = 16384 }
[disaggregation.decode]
num_workers = 1
hardware = "h200_sxm"
engine = { tensor_parallel_size = 8, max_num_seqs = 256 }
```

Each pool is a partial scenario: the file's `[hardware]` and `[engine]` with the pool's
`hardware` and `engine` keys laid over them, resolved and checked exactly as an aggregated
scenario (`sim.specs.scenario`). The model, workload, SLOs and kernel tier are shared.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from sim.serde import require
from sim.specs.engine import MAX_REPLICAS

Connector = Literal["nixl", "layerwise"]
TransferLink = Literal["auto", "nvlink", "inter_node"]
PoolName = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolSection:
    """One pool as written: its workers and what differs from the file's `[hardware]` / `[engine]`."""

    num_workers: int = 1
    """Engine instances in the pool (each `tensor_parallel_size x pipeline_parallel_size x
    data_parallel_size` GPUs; its attention-DP ranks are replicas behind the pool's router)."""
    hardware: str | None = None
    """Hardware of the pool's GPUs (a catalog name or a TOML path); default `[hardware] name`."""
    price_per_gpu_hour_usd: float | None = None
    pcie_peer_group_size: int | None = None
    """PCIe-only nodes: the pool's servers' peer groups (`[hardware] pcie_peer_group_size`); default
    the file's when the pool runs the file's hardware, else the pool hardware spec's."""
    engine: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """`[engine]` keys for this pool, over the file's `[engine]`."""

    def __post_init__(self) -> None:
        require(1 <= self.num_workers <= MAX_REPLICAS, "num_workers", self.num_workers,
                f"must be in [1, {MAX_REPLICAS:,}] (each worker's ranks keep their own schedulers and KV pools)")
        price = self.price_per_gpu_hour_usd
        require(price is None or (math.isfinite(price) and price >= 0), "price_per_gpu_hour_usd", price,
                "must be a finite number >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggregationSection:
    prefill: PoolSection
    decode: PoolSection
    connector: Connector = "nixl"
    """`nixl`: vLLM's NixlConnector (also SGLang/Dynamo NIXL and Mooncake): the decode side reads
    the prompt's KV blocks once the prefill has finished, so the whole transfer is exposed.
    `layerwise`: the prefill sends each layer's KV as it is computed (LMCache layer-wise, vLLM's
    P2pNcclConnector `save_kv_layer`), so the transfer overlaps the prefill's compute."""
    transfer_link: TransferLink = "auto"
    """`auto`: NVLink when every worker of both pools fits in one NVLink domain of one hardware
    (8 GPUs of an HGX node, 72 of a GB200/GB300 NVL72 rack), else the inter-node link (RDMA)."""
    transfer_latency_s: float | None = None
    """Fixed cost per request's transfer; default: the chosen link's `latency_s`."""

    def __post_init__(self) -> None:
        lat = self.transfer_latency_s
        require(lat is None or 0 <= lat < math.inf, "transfer_latency_s", lat, "must be a finite number >= 0")
