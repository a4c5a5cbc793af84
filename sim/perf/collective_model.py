"""Physics baseline of collective latency: alpha-beta per algorithm x protocol, chosen as NCCL does.

NCCL prices every (algorithm, protocol) pair of a collective with a latency (a base cost plus a
per-hop cost per step of the algorithm) and a bus bandwidth (the links' bandwidth times the
protocol's payload efficiency, capped where the protocol is bound by the GPU rather than the link),
and runs the pair with the lowest predicted time. This module does the same from the datasheet
(`HardwareSpec`: link kind and bandwidth, `[nvlink]` switch generation and NVLS support, SM
generation), so its time is what the links and algorithms allow; the fitted collective families
learn only the residual log(measured / this) on top (docs/kernel-model.md, "Collectives").

Algorithms: ring (steps 2(n-1) for all-reduce, n-1 for all-gather / reduce-scatter; wire bytes
2(n-1)/n resp. (n-1)/n of the buffer), tree (all-reduce: a chain inside a node, log2 of the nodes
across them; half the bus bandwidth as algorithm bandwidth), NVLS (NVLink SHARP: the switch
reduces and multicasts, so a GPU sends and receives each byte about once; one switch traversal of
latency; Simple protocol only; needs `[nvlink] nvls = true` and a group inside the NVLink domain),
and all-to-all / send-recv as concurrent point-to-point transfers. Protocols: LL (8-byte
flag+data stores: half the link's payload, capped by the GPU's LL throughput), LL128 (120 of
128 bytes: 0.92 of the link; NVLink only), Simple (whole link, larger per-hop latency).

Constants are latencies in seconds and bandwidth factors; they follow the structure of NCCL's tuning
model (`src/graph/tuning.cc`, `ncclTopoTuneModel`) with rounded values, not its code. The custom
all-reduce of vLLM / SGLang / TRT-LLM (one-shot: every GPU reads the whole buffer from each peer;
two-shot: reduce-scatter then all-gather through peer memory) is modelled the same way
(`custom_allreduce_time_s`). Vectorised over numpy arrays; every function also takes scalars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.graph.kernels import KernelKind
from sim.perf.roofline import collective_wire_bytes
from sim.specs.hardware import HardwareSpec

RING, TREE, NVLS, P2P = 0, 1, 2, 3
LL, LL128, SIMPLE = 0, 1, 2
ALGO_NAMES: Final = ("ring", "tree", "nvls", "p2p")
PROTO_NAMES: Final = ("LL", "LL128", "Simple")

_US: Final = 1e-6
BASE_LATENCY_S: Final[dict[int, tuple[float, float, float]]] = {
    RING: (6.6 * _US, 14.0 * _US, 8.4 * _US),
    TREE: (6.8 * _US, 14.0 * _US, 8.4 * _US),
    NVLS: (0.0, 0.0, 0.0),
    P2P: (6.6 * _US, 14.0 * _US, 8.4 * _US),
}
"""Fixed cost of a collective launch per algorithm, (LL, LL128, Simple)."""
HOP_LATENCY_S: Final[dict[str, dict[int, tuple[float, float, float]]]] = {
    "nvlink": {RING: (0.6 * _US, 1.9 * _US, 3.4 * _US), TREE: (0.6 * _US, 1.25 * _US, 4.0 * _US),
               NVLS: (0.0, 0.0, 25.0 * _US), P2P: (0.6 * _US, 1.9 * _US, 3.4 * _US)},
    "pcie": {RING: (1.0 * _US, 1.9 * _US, 5.7 * _US), TREE: (1.0 * _US, 1.9 * _US, 4.0 * _US),
             NVLS: (0.0, 0.0, 0.0), P2P: (1.0 * _US, 1.9 * _US, 5.7 * _US)},
    "network": {RING: (2.7 * _US, 4.0 * _US, 14.0 * _US), TREE: (5.0 * _US, 8.5 * _US, 14.0 * _US),
                NVLS: (0.0, 0.0, 0.0), P2P: (2.7 * _US, 4.0 * _US, 14.0 * _US)},
}
"""Per-step cost of one hop by link class (NVLink; PCIe and other intra-node links; the network)."""
LL_MAX_BUS_BW: Final = (39e9, 87.7e9, 141e9, 282e9)
"""GPU-bound LL throughput per SM generation (Volta, Ampere/Ada, Hopper, Blackwell): LL's flag
polling is limited by the SMs, not the links."""
NVLS_EFFICIENCY: Final = (0.0, 0.0, 0.85, 0.74)
"""Share of the link bandwidth NVLS reaches per SM generation (none before Hopper)."""
LL128_EFFICIENCY: Final = 0.92
TREE_EFFICIENCY: Final = 0.92
CUSTOM_AR_BARRIER_S: Final[dict[str, float]] = {"nvlink": 2.0 * _US, "pcie": 4.0 * _US}
"""Cost of one cross-GPU flag barrier of a custom all-reduce (one-shot has one, two-shot two)."""
CUSTOM_AR_LAUNCH_S: Final = 3.0 * _US
"""Kernel launch and setup of a custom all-reduce (CUDA graph replay)."""
CUSTOM_AR_EAGER_S: Final = 15.0 * _US
"""Host-side cost an eager (non-graph) custom all-reduce adds: argument registration, launch."""


def generation_index(sm_version: int | None) -> int:
    """NCCL's compute-capability class: 0 Volta and older, 1 Ampere/Ada, 2 Hopper, 3 Blackwell."""
    sm = sm_version or 80
    return 3 if sm >= 100 else 2 if sm >= 90 else 1 if sm >= 80 else 0


@dataclass(frozen=True, slots=True)
class CollectivePhysics:
    """Predicted time of the chosen (algorithm, protocol) and its latency part, per row."""

    time_s: np.ndarray
    latency_s: np.ndarray
    algo: np.ndarray
    proto: np.ndarray


def host_path_bandwidth(group: np.ndarray, hw: HardwareSpec, peer_group_size: int) -> np.ndarray:
    """Bandwidth per GPU of the slowest hop of a collective over `group` GPUs of one PCIe node whose
    GPUs reach each other peer-to-peer in groups of `peer_group_size`; infinite inside one group,
    on NVLink nodes and for groups that span nodes. Between peer groups NCCL's shared-memory
    transport moves each byte through a host-memory buffer (over PCIe twice: in, then out), and a
    ring's c crossings share that host path: pcie / (2 c)."""
    n = np.asarray(group, dtype=float)
    out = np.full(n.shape, np.inf)
    if hw.intra_node_link.kind != "pcie" or peer_group_size >= hw.num_gpus_per_node:
        return out
    crossings = np.ceil(n / peer_group_size)
    crossed = (crossings > 1) & (n <= hw.num_gpus_per_node)
    out[crossed] = hw.pcie_bandwidth_bytes_per_s / (2.0 * crossings[crossed])
    return out


def topology_log_factor(op: str, msg_bytes: np.ndarray | float, group: np.ndarray | float,
                        hw: HardwareSpec) -> np.ndarray:
    """log(baseline on `hw`'s PCIe peer groups / baseline on the peer groups of the host its kernel
    tables were measured on): what a fitted collective's time gains or loses on a node wired
    otherwise than that host (`HardwareSpec.pcie_peer_group_size` against
    `tables_pcie_peer_group_size`); zeros where the two agree."""
    m, n = np.broadcast_arrays(np.atleast_1d(np.asarray(msg_bytes, dtype=float)),
                               np.atleast_1d(np.asarray(group, dtype=float)))
    here, tables = hw.pcie_peer_group_size, hw.tables_pcie_peer_group_size
    if here is None or tables is None or here == tables or hw.intra_node_link.kind != "pcie":
        return np.zeros(m.shape)
    ours = nccl_time(op, m, n, hw, here).time_s
    theirs = nccl_time(op, m, n, hw, tables).time_s
    out: np.ndarray = np.log(ours / theirs)
    return out


def node_floor_ratio(kind: KernelKind, group: int, hw: HardwareSpec) -> float | None:
    """For an NCCL collective over PCIe nodes (more GPUs than one node holds): roofline time of the
    group / roofline time of the same buffer's collective over one node's GPUs, by which the node's
    efficiency becomes a floor on the group's time (its ring contains the node's hops, host-memory
    crossings included, so it cannot run faster; the tables have no such groups to fit). None
    otherwise: NVLink nodes, groups inside a node, send/recv (priced over the network alone)."""
    per_node = hw.num_gpus_per_node
    if kind is KernelKind.SEND_RECV or group <= per_node or hw.intra_node_link.kind != "pcie":
        return None
    own = collective_wire_bytes(kind, 1.0, group) / hw.link_for_group(group).bandwidth_bytes_per_s
    node = collective_wire_bytes(kind, 1.0, per_node) / hw.intra_node_link.bandwidth_bytes_per_s
    return own / node


def _link_class(kind: str) -> str:
    return "nvlink" if kind == "nvlink" else "pcie"


def nccl_time(op: str, msg_bytes: np.ndarray | float, group: np.ndarray | float, hw: HardwareSpec,
              peer_group_size: int | None = None) -> CollectivePhysics:
    """NCCL's cheapest (algorithm, protocol) for `op` (all_reduce, all_gather, reduce_scatter,
    alltoall, send_recv) on `group` GPUs of `hw` moving `msg_bytes` per GPU (the buffer).
    `peer_group_size`: on a PCIe node, GPUs per peer-to-peer group, whose crossings pass through host
    memory (`host_path_bandwidth`); None = the fitted families' baseline, which leaves the host's
    topology to their residual (`topology_log_factor` compares two topologies)."""
    m = np.atleast_1d(np.asarray(msg_bytes, dtype=float))
    n = np.broadcast_to(np.atleast_1d(np.asarray(group, dtype=float)), m.shape)
    gen = generation_index(hw.sm_version)
    per_node = hw.num_gpus_per_node
    # NVLS reaches every GPU of the NVLink domain (a rack for NVL72 systems, else the node).
    domain = hw.nvlink_domain_size or per_node
    intra = n <= per_node
    if domain > per_node:
        intra = n <= domain
    nodes = np.maximum(np.ceil(n / per_node), 1.0)
    intra_kind = _link_class(hw.intra_node_link.kind)
    bw = np.where(intra, hw.intra_node_link.bandwidth_bytes_per_s, hw.inter_node_link.bandwidth_bytes_per_s)
    if peer_group_size is not None:
        bw = np.minimum(bw, host_path_bandwidth(n, hw, peer_group_size))
    nvlink_ok = intra & (hw.intra_node_link.kind == "nvlink")
    steps_frac = 2.0 if op == "all_reduce" else 1.0
    ones = np.ones_like(m)
    cands: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # (algo, proto, latency, time)

    def hop(algo: int, proto: int) -> tuple[float, float]:
        return HOP_LATENCY_S[intra_kind][algo][proto], HOP_LATENCY_S["network"][algo][proto]

    def proto_bw(proto: int) -> np.ndarray:
        if proto == LL:
            return np.minimum(0.5 * bw, LL_MAX_BUS_BW[gen])
        if proto == LL128:
            return LL128_EFFICIENCY * bw
        return bw

    if op == "send_recv":
        for p in (LL, SIMPLE):
            h_in, h_net = hop(P2P, p)
            lat = BASE_LATENCY_S[P2P][p] + np.where(intra, h_in, h_net) * ones
            cands.append((P2P, p, lat, lat + m / proto_bw(p)))
    elif op == "alltoall":
        wire = np.where(n > 1, (n - 1.0) / n, 0.0) * m
        for p in (LL, SIMPLE):
            h_in, h_net = hop(P2P, p)
            lat = BASE_LATENCY_S[P2P][p] + np.where(intra, h_in, h_net) * ones
            cands.append((P2P, p, lat, lat + wire / proto_bw(p)))
    else:
        steps = steps_frac * (n - 1.0)
        inter_steps = steps_frac * (nodes - 1.0)
        wire = np.where(n > 1, steps / n, 0.0) * m
        for p in (LL, LL128, SIMPLE):
            if p == LL128 and gen < 1:
                continue
            h_in, h_net = hop(RING, p)
            lat = BASE_LATENCY_S[RING][p] + (steps - inter_steps) * h_in + inter_steps * h_net
            t = lat + wire / proto_bw(p)
            if p == LL128:  # LL128 runs on NVLink only (NCCL disables it elsewhere by default)
                t = np.where(nvlink_ok, t, np.inf)
            cands.append((RING, p, lat, t))
        if op == "all_reduce":
            for p in (LL, LL128, SIMPLE):
                if p == LL128 and gen < 1:
                    continue
                h_in, h_net = hop(TREE, p)
                lat = BASE_LATENCY_S[TREE][p] + 2.0 * ((n / nodes - 1.0) * h_in + np.log2(nodes) * h_net)
                t = lat + m / (0.5 * TREE_EFFICIENCY * proto_bw(p))
                if p == LL128:
                    t = np.where(nvlink_ok, t, np.inf)
                cands.append((TREE, p, lat, t))
        if hw.nvlink is not None and hw.nvlink.nvls and NVLS_EFFICIENCY[gen] > 0:
            ok = (n >= 2) & (n <= domain)
            lat = HOP_LATENCY_S["nvlink"][NVLS][SIMPLE] * ones
            # The switch reduces / multicasts: each GPU sends and receives about one buffer
            # (all-gather / reduce-scatter: (n-1)/n of it) instead of a ring's 2(n-1)/n.
            nvls_wire = m if op == "all_reduce" else (n - 1.0) / n * m
            t = lat + nvls_wire / (NVLS_EFFICIENCY[gen] * hw.intra_node_link.bandwidth_bytes_per_s)
            cands.append((NVLS, SIMPLE, lat, np.where(ok, t, np.inf)))
    times = np.stack([c[3] for c in cands])
    best = np.argmin(times, axis=0)
    idx = np.arange(len(m))
    lats = np.stack([np.broadcast_to(c[2], m.shape) for c in cands])
    algos = np.array([c[0] for c in cands])
    protos = np.array([c[1] for c in cands])
    return CollectivePhysics(time_s=times[best, idx], latency_s=lats[best, idx], algo=algos[best],
                             proto=protos[best])


def custom_allreduce_one_shot(group: np.ndarray | float, msg_bytes: np.ndarray | float) -> np.ndarray:
    """Whether vLLM's custom all-reduce runs its one-shot kernel: always on 2 GPUs; on up to 4
    GPUs below 512 KiB and on up to 8 below 256 KiB; two-shot otherwise."""
    n = np.asarray(group, dtype=float)
    m = np.asarray(msg_bytes, dtype=float)
    out: np.ndarray = (n <= 2) | ((n <= 4) & (m < 512 * 1024)) | ((n <= 8) & (m < 256 * 1024))
    return out


def custom_allreduce_time_s(msg_bytes: np.ndarray | float, group: np.ndarray | float, hw: HardwareSpec,
                            eager: np.ndarray | bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(time, latency part) of a framework custom all-reduce through peer memory.

    One-shot: each GPU reads the whole buffer from each of the n-1 peers over its own links
    ((n-1) x buffer / link bandwidth), one barrier. Two-shot: reduce-scatter and all-gather
    through peer memory (2 (n-1)/n x buffer / link bandwidth), two barriers. Eager (not
    CUDA-graph) launches add a host-side cost."""
    m = np.atleast_1d(np.asarray(msg_bytes, dtype=float))
    n = np.broadcast_to(np.atleast_1d(np.asarray(group, dtype=float)), m.shape)
    link = hw.link_for_group(int(np.max(n)) if len(n) else 1)
    kind = _link_class(link.kind)
    bw = link.bandwidth_bytes_per_s
    one = custom_allreduce_one_shot(n, m)
    barrier = CUSTOM_AR_BARRIER_S[kind]
    lat = CUSTOM_AR_LAUNCH_S + np.where(one, barrier, 2.0 * barrier)
    lat = lat + np.where(np.asarray(eager), CUSTOM_AR_EAGER_S, 0.0)
    wire = np.where(one, (n - 1.0) * m, 2.0 * (n - 1.0) / np.maximum(n, 1.0) * m)
    return lat + wire / bw, lat


def physics_prims(family: str, op: np.ndarray, msg_bytes: np.ndarray, group: np.ndarray, variant: np.ndarray,
                  hw: HardwareSpec) -> dict[str, np.ndarray]:
    """The physics baseline as feature primitives of the `nccl` / `custom_allreduce` families:
    `phys_s` (predicted time), `phys_lat_s` (its latency part), and indicators of the chosen
    algorithm / protocol (`nvls`, `ll`, `ll128`; custom all-reduce: `ll` = one-shot)."""
    n = len(msg_bytes)
    out = {k: np.zeros(n) for k in ("phys_s", "phys_lat_s", "nvls", "ll", "ll128")}
    if family == "custom_allreduce":
        eager = np.array(["eager" in str(v) for v in variant], dtype=bool)
        t, lat = custom_allreduce_time_s(msg_bytes, group, hw, eager)
        out.update(phys_s=t, phys_lat_s=lat, ll=custom_allreduce_one_shot(group, msg_bytes).astype(float))
        return out
    for name in sorted({str(o) for o in op}):
        sel = np.flatnonzero(op == name)
        ph = nccl_time(name, msg_bytes[sel], group[sel], hw)
        out["phys_s"][sel] = ph.time_s
        out["phys_lat_s"][sel] = ph.latency_s
        out["nvls"][sel] = ph.algo == NVLS
        out["ll"][sel] = ph.proto == LL
        out["ll128"][sel] = ph.proto == LL128
    return out
