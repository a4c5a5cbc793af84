"""Learned efficiency over the roofline, per kernel family, in log space.

For each family, y = log(measured / roofline) is predicted from the device-normalised features of
`sim.perf.kernel_features` plus one-hot categoricals (dtype, backend, collective op): by a ridge
model with level-specific slopes, or by a small MLP where leave-one-GPU-out chose it
(docs/kernel-model.md). That is the cross-generation tier (fitted on other GPUs). The
target-measured tier adds a correction interpolated from the target's microbenchmark points
(`sim.perf.learners.CorrectionParams`). Efficiency is exp(-max(0, y)), so it stays in (0, 1]
and time never drops below the roofline.

Parameters are plain numbers (see `sim.calibration.artifact` for the JSON form).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.collective_model import nccl_time, node_floor_ratio, physics_prims, topology_log_factor
from sim.perf.efficiency import Efficiency, KernelColumns
from sim.perf.kernel_features import (
    COLLECTIVE_FAMILIES,
    PHYSICS_FAMILIES,
    SCALAR,
    VECTOR,
    correction_coordinates,
    features,
    physics_offset,
)
from sim.perf.learners import (
    CorrectionParams,
    MlpParams,
    correction_one,
    correction_residual,
    find_group,
    mlp_forward,
    row_products,
)
from sim.perf.roofline import collective_wire_bytes, roofline
from sim.perf.stand_ins import stand_ins
from sim.perf.table_kernels import TABLE_FAMILY, kernel_columns, table_batch, table_of, work_columns
from sim.provenance import Provenance
from sim.specs.hardware import HardwareSpec

_MAX_LOG_SLOWDOWN: Final = 30.0
NUM_INTERACTED: Final = 8
"""Leading continuous features that each one-hot level also multiplies (level-specific slopes)."""
_RANGE_SLACK: Final = 0.05

KIND_FAMILY: Final[dict[KernelKind, str]] = {
    KernelKind.GEMM: "gemm", KernelKind.MOE_GEMM: "gemm",
    KernelKind.ATTN_PREFILL: "attn_prefill", KernelKind.ATTN_DECODE: "attn_decode",
    KernelKind.NORM: "pointwise", KernelKind.ELEMENTWISE: "pointwise",
    KernelKind.EMBEDDING: "pointwise", KernelKind.SAMPLING: "pointwise",
    KernelKind.ALL_REDUCE: "nccl", KernelKind.ALL_GATHER: "nccl",
    KernelKind.REDUCE_SCATTER: "nccl", KernelKind.ALL_TO_ALL: "nccl", KernelKind.SEND_RECV: "nccl",
}
"""Which family's model prices a kernel kind in the simulator."""
TABLE_KINDS: Final = frozenset({KernelKind.MOE, KernelKind.MLA_PREFILL, KernelKind.MLA_DECODE, KernelKind.MLA_BMM,
                                KernelKind.EP_ALL_TO_ALL})
"""Kinds priced by the table-keyed families (`sim.perf.table_kernels`): the family predicts the
latency of the measured table's row the kernel is; efficiency = the kernel's own roofline / that."""
_PROXY_KINDS: Final = frozenset({KernelKind.MOE_GEMM, KernelKind.SAMPLING, KernelKind.SEND_RECV, KernelKind.NORM})
"""Kinds priced by a related family's or operation's model: always reported as extrapolated."""
CUSTOM_ALLREDUCE_VARIANT: Final[dict[str, str]] = {"sglang": "sglang_graph"}
"""Engines whose TP all-reduce runs their own kernel where it is faster than NCCL (SGLang's custom
all-reduce, on unless `--disable-custom-all-reduce`): such an all-reduce that the kernel serves
(`_custom_allreduce`) is priced as the faster of the `nccl` family and the engine's (graph-launched,
not eager) `custom_allreduce` level."""
CUSTOM_ALLREDUCE_GROUPS: Final = (2, 4, 8)
"""Group sizes the measured custom all-reduce tables hold."""
CUSTOM_ALLREDUCE_MAX_BYTES: Final = 8 * 1024 * 1024
"""SGLang's `_MAX_CAR_SIZE`: a larger buffer goes to NCCL."""
KIND_OP: Final[dict[KernelKind, str]] = {
    KernelKind.ALL_REDUCE: "all_reduce", KernelKind.ALL_GATHER: "all_gather",
    KernelKind.REDUCE_SCATTER: "reduce_scatter", KernelKind.ALL_TO_ALL: "alltoall",
    KernelKind.SEND_RECV: "all_gather", KernelKind.NORM: "add",
    KernelKind.ELEMENTWISE: "silu_and_mul", KernelKind.EMBEDDING: "embedding",
    KernelKind.SAMPLING: "add",
}
"""Operation level the simulator's kernels take in the collective and pointwise models.

Norms: vLLM's rms_norm / fused_add_rms_norm are vectorised single-pass streaming kernels (the graph
counts the fused kernel's 4 passes). The only norm measured (Vidur's profile of Sarathi's RMSNorm,
op `rms_norm`) is a scalar-load kernel that reaches ~0.35 of DRAM bandwidth at 2048 x 8192 on H100,
not what vLLM runs, so norms are priced with the measured vectorised streaming kernel (`add`) and
flagged extrapolated. The sampler is priced the same way (no measurement)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyParams:
    """Fitted parameters of one family.

    `coef` layout (ridge): [intercept, continuous features (p), one-hots (L), then for each one-hot
    level its products with the first `NUM_INTERACTED` continuous features (L x NUM_INTERACTED)].
    `mlp`, when present, replaces the ridge as the cross-generation prediction (its inputs are the
    continuous features followed by the one-hots). `correction` is the target-measured part.
    """

    family: str
    categoricals: tuple[tuple[str, tuple[str, ...]], ...]
    """(name, levels) in coefficient order; an unseen or missing level contributes nothing."""
    coef: tuple[float, ...]
    mlp: MlpParams | None = None
    correction: CorrectionParams | None = None
    """Target-measured correction, or None (cross-generation)."""
    ranges: tuple[tuple[float, float], ...] = ()
    """(min, max) of each continuous feature in the fitting data, for the EXTRAPOLATED flag."""

    def num_levels(self) -> int:
        return sum(len(levels) for _, levels in self.categoricals)

    def learner(self) -> str:
        return "mlp" if self.mlp is not None else "ridge"


def _kv_dtype_label(work: KernelWork, batch: int, kv_heads: int, head_dim: int) -> str:
    per_elem = work.kv_write_bytes / max(1, 2 * batch * kv_heads * head_dim)
    if work.kind is KernelKind.ATTN_PREFILL:
        per_elem /= max(1, work.shape[1])
    return "fp8" if per_elem < 1.5 else "bfloat16"


def _physics_op(kind: KernelKind) -> str:
    """The collective the physics baseline prices for a kernel kind (send/recv is its own)."""
    return "send_recv" if kind is KernelKind.SEND_RECV else KIND_OP[kind]


def network_p2p_efficiency(msg_bytes: np.ndarray, group: int, hw: HardwareSpec) -> np.ndarray:
    """Efficiency (roofline / time) of a point-to-point send between NVLink domains (a pipeline hop
    across nodes): NCCL's alpha-beta time over the inter-node link (`nccl_time`), without the
    learned residual. The collective families are fitted on single-node measurements (NVLink and
    PCIe inside one domain), and their residual extrapolated to a network hop is not physics
    (7-20x the link's roofline for megabyte messages); the alpha-beta model is what is known.
    Elementwise, so a row's value does not depend on its batch."""
    m = np.maximum(np.asarray(msg_bytes, dtype=float), 1.0)
    own = m / hw.inter_node_link.bandwidth_bytes_per_s
    out: np.ndarray = np.clip(own / nccl_time("send_recv", m, float(group), hw).time_s, 1e-12, 1.0)
    return out


class FittedEfficiency:
    """`EfficiencyModel` backed by fitted per-family parameters; pure.

    One implementation (the vectorised `predict_log_slowdown`) serves both the simulator's
    one-kernel calls and `predict-kernels` batches, so both give the same numbers. The engine
    profile's GEMM kernel sources (`gemm_backends`) apply where the model builds the categoricals
    (`efficiency`, `efficiency_columns`); `predict-kernels` rows name their backend themselves.
    """

    def __init__(self, families: Mapping[str, FamilyParams], *, backend: str | None = None,
                 gemm_backends: Mapping[str, str] | None = None,
                 table_backends: Mapping[str, str] | None = None) -> None:
        self._families = dict(families)
        self._coef = {f: np.asarray(p.coef, dtype=float) for f, p in self._families.items()}
        self._mlp = {f: p.mlp.arrays() for f, p in self._families.items() if p.mlp is not None}
        self._corr = {f: p.correction.arrays() for f, p in self._families.items() if p.correction is not None}
        self._ranges = {f: np.asarray(p.ranges, dtype=float).reshape(-1, 2) for f, p in self._families.items()}
        self._backend = backend
        # GEMM weight format -> the backend level whose measurements price it (engine profile's
        # `[kernel_sources]`): an engine whose own microbenchmark series is not what it serves with.
        self._gemm_backends = dict(gemm_backends or {})
        # Measured table -> the backend level whose rows price it (`[kernel_sources] mla_prefill`, ...).
        self._table_backends = dict(table_backends or {})

    def families(self) -> Mapping[str, FamilyParams]:
        return self._families

    def uncorrected_families(self) -> frozenset[str]:
        """Families this model prices without a target-measured correction (all of them in the
        cross-generation tier; in the target-measured tier those the target's tables do not cover)."""
        return frozenset(f for f, p in self._families.items() if p.correction is None)

    # -- single kernel -------------------------------------------------------------------------
    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency:
        if work.kind is KernelKind.SEND_RECV and work.group_size > hw.nvlink_domain():
            return Efficiency(float(network_p2p_efficiency(np.array([work.comm_bytes]), work.group_size, hw)[0]),
                              Provenance.EXTRAPOLATED)
        if work.kind in TABLE_KINDS:
            values, codes = self._table_efficiency_columns(KernelColumns.of([work]), hw)
            return Efficiency(float(values[0]), Provenance(int(codes[0])))
        family = KIND_FAMILY.get(work.kind)
        params = self._families.get(family) if family else None
        if family is None or params is None:
            return Efficiency(1.0, Provenance.ROOFLINE)
        prims, cats = self._primitives(family, work, hw)
        y, outside, corrected = self._one(family, params, prims, cats, hw)
        custom = self._custom_allreduce(work.kind, work.group_size, hw)
        if custom is not None and work.comm_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES:
            c_params, variant = custom
            # The graph-launched kernel's physics baseline (`_primitives` prices it as not eager).
            c_prims, _ = self._primitives("custom_allreduce", work, hw)
            c_y, c_outside, c_corrected = self._one("custom_allreduce", c_params, c_prims,
                                                    {"op": "all_reduce", "variant": variant}, hw)
            if c_y < y:
                y, outside, corrected = c_y, c_outside, c_corrected
        if family in COLLECTIVE_FAMILIES and hw.tables_pcie_peer_group_size not in (None, hw.pcie_peer_group_size):
            shift = float(topology_log_factor(_physics_op(work.kind), work.comm_bytes, work.group_size, hw)[0])
            y = min(max(y + shift, 0.0), _MAX_LOG_SLOWDOWN)
        prov = Provenance.CALIBRATED if corrected else Provenance.TRANSFERRED
        if work.kind in _PROXY_KINDS or outside:
            prov = Provenance.EXTRAPOLATED
        value = math.exp(-y)
        ratio = node_floor_ratio(work.kind, work.group_size, hw) if family == "nccl" else None
        if ratio is not None:
            node = self.efficiency(replace(work, group_size=hw.num_gpus_per_node), hw).value
            value = min(value, node * ratio)
        return Efficiency(value, prov)

    def _custom_allreduce(self, kind: KernelKind, group: int, hw: HardwareSpec) -> tuple[FamilyParams, str] | None:
        """(the custom_allreduce family, the engine's level) where an all-reduce may run the engine's
        own kernel (`CUSTOM_ALLREDUCE_VARIANT`): a measured group size inside one node on NVLink
        (SGLang turns it off for a group that spans nodes, an NVL72 rack's included); else None.
        Buffers over `CUSTOM_ALLREDUCE_MAX_BYTES` take NCCL's price row by row."""
        variant = CUSTOM_ALLREDUCE_VARIANT.get(self._backend or "")
        params = self._families.get("custom_allreduce")
        if (variant is None or params is None or kind is not KernelKind.ALL_REDUCE
                or group not in CUSTOM_ALLREDUCE_GROUPS or group > hw.num_gpus_per_node
                or hw.link_for_group(group).kind != "nvlink"):
            return None
        return params, variant

    def _one(self, family: str, params: FamilyParams, prims: dict[str, float], cats: dict[str, str | None],
             hw: HardwareSpec) -> tuple[float, bool, bool]:
        """`predict_log_slowdown` for one kernel with python scalars (the simulator's path: ~20x
        fewer numpy calls than arrays of length one, same numbers)."""
        x = np.array(features(SCALAR, family, prims, float(hw.num_sms), float(hw.l2_cache_bytes),
                               hw.sm_version or 0))
        outside = False
        rng = self._ranges[family]
        if len(rng):
            slack = _RANGE_SLACK * (rng[:, 1] - rng[:, 0])
            outside = bool(((x < rng[:, 0] - slack) | (x > rng[:, 1] + slack)).any())
            x = np.clip(x, rng[:, 0], rng[:, 1])
        hots = [1.0 if cats.get(name) == level else 0.0 for name, levels in params.categoricals for level in levels]
        mlp = self._mlp.get(family)
        if mlp is not None:
            y = float(mlp_forward(mlp, np.concatenate([x, hots]) if hots else x))
        else:
            w = self._coef[family]
            p = len(x)
            y = float(w[0] + x @ w[1:1 + p])
            inter = 1 + p + len(hots)
            for j, hot in enumerate(hots):
                if hot:
                    y += float(w[1 + p + j] + x[:NUM_INTERACTED] @ w[inter + j * NUM_INTERACTED:
                                                                    inter + (j + 1) * NUM_INTERACTED])
        y += float(physics_offset(SCALAR, family, prims, float(hw.num_sms), hw.sm_version or 0))
        corrected = False
        corr = self._corr.get(family)
        if corr is not None and params.correction is not None:
            key = tuple(cats.get(c) or "" for c in params.correction.categoricals)
            delta = correction_one(corr, np.array(correction_coordinates(family, prims, SCALAR)), key)
            if delta is not None:
                y += delta
                corrected = True
        return min(max(y, 0.0), _MAX_LOG_SLOWDOWN), outside, corrected

    def _primitives(self, family: str, work: KernelWork, hw: HardwareSpec
                    ) -> tuple[dict[str, float], dict[str, str | None]]:
        if family in COLLECTIVE_FAMILIES:
            link = hw.link_for_group(work.group_size)
            wire = collective_wire_bytes(work.kind, work.comm_bytes, work.group_size)
            prims = {"network_s": wire / link.bandwidth_bytes_per_s, "msg": max(work.comm_bytes, 1.0),
                     "group": float(max(work.group_size, 2)),
                     "nvlink": 1.0 if link.kind == "nvlink" else 0.0,
                     "link_bw": link.bandwidth_bytes_per_s}
            if family in PHYSICS_FAMILIES:
                phys = physics_prims(family, np.array([_physics_op(work.kind)], dtype=object),
                                     np.array([prims["msg"]]), np.array([prims["group"]]), np.array([""]), hw)
                prims.update({k: float(v[0]) for k, v in phys.items()})
            return prims, {"op": KIND_OP.get(work.kind), "variant": None}
        p: dict[str, float] = {
            "compute_s": work.flops / hw.peak_flops_for(work.dtype),
            "memory_s": work.bytes_moved() / hw.hbm_bandwidth_bytes_per_s,
            "bytes": max(work.bytes_moved(), 1.0),
        }
        s = work.shape
        cats: dict[str, str | None] = {"backend": self._backend}
        if family == "gemm":
            p.update(m=float(s[0]), n=float(s[1]), k=float(s[2]))
            cats["dtype"] = work.dtype.value
            if work.kind is KernelKind.GEMM:  # MoE grouped GEMMs are another kernel path
                cats["backend"] = self._gemm_backends.get(work.dtype.value, self._backend)
        elif family in ("attn_prefill", "attn_decode"):
            batch, length, heads, kv_heads, head_dim, window = s[0], s[1], s[3], s[4], s[5], s[6]
            if family == "attn_prefill":
                length = s[1] + s[2]
            p.update(batch=float(batch), heads=float(heads), kv_heads=float(kv_heads),
                     head_dim=float(head_dim), windowed=1.0 if window > 0 else 0.0)
            p["seq" if family == "attn_prefill" else "kv"] = float(max(length, 1))
            act = "fp8" if work.dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16"
            cats["dtype"] = f"{act}/{_kv_dtype_label(work, batch, kv_heads, head_dim)}"
        else:
            p.update(tokens=float(max(s[0], 1)), width=float(max(s[1], 1)))
            # Pointwise rows are fitted at one FLOP per element (`pointwise_work`): keep the features'
            # intensity on that convention whatever arithmetic the graph counts for the kernel.
            p["compute_s"] = p["tokens"] * p["width"] / hw.peak_flops_for(work.dtype)
            cats["op"] = KIND_OP.get(work.kind)
        return p, cats

    # -- columns of one kernel kind (the simulator's block pricing) -----------------------------
    def efficiency_columns(self, cols: KernelColumns, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        """`efficiency` of every row of `cols` at once: the same arithmetic as `_one`, in arrays
        (the MLP runs one stacked matrix-vector product per row, exactly as for one kernel, so the
        float32 hidden layers round the same way), to float64 rounding."""
        n = len(cols)
        if cols.kind is KernelKind.SEND_RECV and cols.group_size > hw.nvlink_domain():
            return (network_p2p_efficiency(cols.comm_bytes, cols.group_size, hw),
                    np.full(n, int(Provenance.EXTRAPOLATED), dtype=np.int64))
        if cols.kind in TABLE_KINDS and n:
            return self._table_efficiency_columns(cols, hw)
        family = KIND_FAMILY.get(cols.kind)
        params = self._families.get(family) if family else None
        if family is None or params is None or n == 0:
            return np.ones(n), np.full(n, int(Provenance.ROOFLINE), dtype=np.int64)
        prims, cats = self._primitive_columns(family, cols, hw)
        y = np.empty(n)
        outside = np.zeros(n, dtype=bool)
        corrected = np.zeros(n, dtype=bool)
        # Categoricals are one value per call except the attention KV dtype label: rows by label.
        labels = cats.pop("kv_label", None)
        groups = [(np.arange(n), "")] if labels is None else [
            (np.flatnonzero(labels == lv), str(lv)) for lv in np.unique(labels)]
        for idx, label in groups:
            row_cats: dict[str, str | None] = dict(cats)
            if labels is not None:
                row_cats["dtype"] = f"{row_cats['dtype']}/{label}"
            sub = prims if len(idx) == n else {k: v[idx] for k, v in prims.items()}
            y[idx], outside[idx], corrected[idx] = self._rows(family, params, sub, row_cats, hw)
        custom = self._custom_allreduce(cols.kind, cols.group_size, hw)
        if custom is not None:
            c_params, variant = custom
            c_prims, _ = self._primitive_columns("custom_allreduce", cols, hw)
            c_y, c_outside, c_corrected = self._rows("custom_allreduce", c_params, c_prims,
                                                     {"op": "all_reduce", "variant": variant}, hw)
            take = (c_y < y) & (cols.comm_bytes <= CUSTOM_ALLREDUCE_MAX_BYTES)
            y, outside, corrected = (np.where(take, c_y, y), np.where(take, c_outside, outside),
                                     np.where(take, c_corrected, corrected))
        if family in COLLECTIVE_FAMILIES and hw.tables_pcie_peer_group_size not in (None, hw.pcie_peer_group_size):
            shift = topology_log_factor(_physics_op(cols.kind), cols.comm_bytes, cols.group_size, hw)
            y = np.clip(y + shift, 0.0, _MAX_LOG_SLOWDOWN)
        prov = np.where(corrected, int(Provenance.CALIBRATED), int(Provenance.TRANSFERRED))
        if cols.kind in _PROXY_KINDS:
            prov[:] = int(Provenance.EXTRAPOLATED)
        prov[outside] = int(Provenance.EXTRAPOLATED)
        values = np.exp(-y)
        ratio = node_floor_ratio(cols.kind, cols.group_size, hw) if family == "nccl" else None
        if ratio is not None:
            node, _ = self.efficiency_columns(replace(cols, group_size=hw.num_gpus_per_node), hw)
            values = np.minimum(values, node * ratio)
        return values, prov.astype(np.int64)

    def _rows(self, family: str, params: FamilyParams, prims: dict[str, np.ndarray], cats: dict[str, str | None],
              hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`_one` for rows sharing their categoricals."""
        n = len(next(iter(prims.values())))
        cont = features(VECTOR, family, prims, float(hw.num_sms), float(hw.l2_cache_bytes), hw.sm_version or 0)
        x = np.empty((n, len(cont)))
        for i, c in enumerate(cont):
            x[:, i] = c
        outside = np.zeros(n, dtype=bool)
        rng = self._ranges[family]
        if len(rng):
            slack = _RANGE_SLACK * (rng[:, 1] - rng[:, 0])
            outside = ((x < rng[:, 0] - slack) | (x > rng[:, 1] + slack)).any(1)
            x = np.clip(x, rng[:, 0], rng[:, 1])
        hots = [1.0 if cats.get(name) == level else 0.0 for name, levels in params.categoricals for level in levels]
        mlp = self._mlp.get(family)
        if mlp is not None:
            x_all = np.concatenate([x, np.broadcast_to(np.asarray(hots), (n, len(hots)))], axis=1) if hots else x
            # (n, 1, p) stacked products: one matrix-vector product per row, as `_one` does.
            y: np.ndarray = mlp_forward(mlp, x_all[:, None, :])[:, 0]
        else:
            w = self._coef[family]
            p = x.shape[1]
            y = w[0] + row_products(x, w[1:1 + p])
            inter = 1 + p + len(hots)
            for j, hot in enumerate(hots):
                if hot:
                    slopes = w[inter + j * NUM_INTERACTED: inter + (j + 1) * NUM_INTERACTED]
                    y = y + (w[1 + p + j] + row_products(x[:, :NUM_INTERACTED], slopes))
        y = y + physics_offset(VECTOR, family, prims, float(hw.num_sms), hw.sm_version or 0)
        corrected = np.zeros(n, dtype=bool)
        corr = self._corr.get(family)
        if corr is not None and params.correction is not None:
            key = tuple(cats.get(c) or "" for c in params.correction.categoricals)
            group = find_group(corr.groups, key)
            if group is not None:
                offset, points, alpha, _ = group
                # |z - p|^2 as |z'|^2 + |p'|^2 - 2 z'.p' about the points' centre (no n x m x d array;
                # centring keeps the cancellation error ~1e-15 of the distances).
                centre = points.mean(0)
                pc = points - centre
                z = correction_coordinates(family, prims) / corr.length_scales - centre
                sq = row_products(z, -2.0 * pc.T)
                sq += (z * z).sum(1)[:, None]
                sq += (pc * pc).sum(1)[None, :]
                np.maximum(sq, 0.0, out=sq)
                sq *= -0.5
                y = y + (offset + row_products(np.exp(sq, out=sq), alpha))
                corrected[:] = True
        return np.clip(y, 0.0, _MAX_LOG_SLOWDOWN), outside, corrected

    def _primitive_columns(self, family: str, cols: KernelColumns, hw: HardwareSpec
                           ) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
        """`_primitives` for columns; cats["kv_label"] (an array) is the attention KV dtype per row."""
        n = len(cols)
        if family in COLLECTIVE_FAMILIES:
            link = hw.link_for_group(cols.group_size)
            g = cols.group_size
            msg = cols.comm_bytes
            if cols.kind is KernelKind.SEND_RECV:
                wire = msg
            elif g <= 1:
                wire = np.zeros(n)
            elif cols.kind is KernelKind.ALL_REDUCE:
                wire = 2.0 * (g - 1) / g * msg
            else:
                wire = (g - 1) / g * msg
            prims = {"network_s": wire / link.bandwidth_bytes_per_s, "msg": np.maximum(msg, 1.0),
                     "group": np.full(n, float(max(g, 2))),
                     "nvlink": np.full(n, 1.0 if link.kind == "nvlink" else 0.0),
                     "link_bw": np.full(n, link.bandwidth_bytes_per_s)}
            if family in PHYSICS_FAMILIES:
                prims.update(physics_prims(family, np.full(n, _physics_op(cols.kind), dtype=object),
                                           prims["msg"], prims["group"], np.full(n, ""), hw))
            return prims, {"op": KIND_OP.get(cols.kind), "variant": None}
        moved = cols.bytes_moved()
        p: dict[str, np.ndarray] = {
            "compute_s": cols.flops / hw.peak_flops_for(cols.dtype),
            "memory_s": moved / hw.hbm_bandwidth_bytes_per_s,
            "bytes": np.maximum(moved, 1.0),
        }
        s = [c.astype(float) for c in cols.shape]
        cats: dict[str, object] = {"backend": self._backend}
        if family == "gemm":
            p.update(m=s[0], n=s[1], k=s[2])
            cats["dtype"] = cols.dtype.value
            if cols.kind is KernelKind.GEMM:
                cats["backend"] = self._gemm_backends.get(cols.dtype.value, self._backend)
        elif family in ("attn_prefill", "attn_decode"):
            batch, length, heads, kv_heads, head_dim, window = s[0], s[1], s[3], s[4], s[5], s[6]
            if family == "attn_prefill":
                length = s[1] + s[2]
            p.update(batch=batch, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     windowed=(window > 0).astype(float))
            p["seq" if family == "attn_prefill" else "kv"] = np.maximum(length, 1.0)
            cats["dtype"] = "fp8" if cols.dtype in (DType.FP8, DType.FP8_BLOCK) else "bfloat16"
            # `_kv_dtype_label` per row.
            per_elem = cols.kv_write_bytes / np.maximum(1.0, 2.0 * cols.shape[0] * cols.shape[4] * cols.shape[5])
            if cols.kind is KernelKind.ATTN_PREFILL:
                per_elem = per_elem / np.maximum(1.0, s[1])
            cats["kv_label"] = np.where(per_elem < 1.5, "fp8", "bfloat16")
        else:
            tokens, width = np.maximum(s[0], 1.0), np.maximum(s[1], 1.0)
            p.update(tokens=tokens, width=width)
            p["compute_s"] = tokens * width / hw.peak_flops_for(cols.dtype)
            cats["op"] = KIND_OP.get(cols.kind)
        return p, cats  # type: ignore[return-value]

    # -- table-keyed kinds (MoE, MLA, expert all-to-all) ----------------------------------------
    def _table_backend(self, table: str) -> str:
        """Backend level whose rows of `table` price the engine's kernels (its own, unless the
        profile's kernel sources name another)."""
        return self._table_backends.get(table, self._backend) or ""

    def _table_efficiency(self, works: list[KernelWork], hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        """(efficiency, provenance code) of kernels of one table-keyed kind: the family's predicted
        latency of the table row each kernel is (`table_kernels.work_columns`), expressed against the
        kernel's own roofline (so the graph's FLOP/byte count does not change the price)."""
        n = len(works)
        tables = sorted({table_of(w.kind, w.variant) for w in works})
        eff = np.ones(n)
        prov = np.full(n, int(Provenance.ROOFLINE), dtype=np.int64)
        own = np.array([roofline(w, hw).time_s() for w in works])
        for table in tables:
            sel = np.flatnonzero([table_of(w.kind, w.variant) == table for w in works])
            family = TABLE_FAMILY[table]
            if family not in self._families:
                continue
            cols = work_columns([works[i] for i in sel])
            if family != "ep_a2a":
                cols["backend"] = np.full(len(sel), self._table_backend(table), dtype=object)
            eff[sel], prov[sel] = self._table_rows(table, family, cols, own[sel], hw)
        return eff, prov

    def _table_efficiency_columns(self, cols: KernelColumns, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        """`_table_efficiency` of the rows of `cols` (one table-keyed kind), from the columns alone: the
        table rows by `table_kernels.kernel_columns` and each kernel's own roofline as `roofline` computes
        it, so the values are those of `_table_efficiency` of each row's `KernelWork`, bitwise (the
        arithmetic is elementwise; the family's prediction runs row by row). One pass per table."""
        n = len(cols)
        kind = cols.kind
        if kind.is_collective():
            g = cols.group_size
            # `collective_wire_bytes` with the same operations (table-keyed collectives: EP all-to-all).
            wire = np.zeros(n) if g <= 1 else (g - 1) / g * cols.comm_bytes
            own = np.maximum(wire / hw.link_for_group(g).bandwidth_bytes_per_s, 0.0)
        else:
            own = np.maximum(np.maximum(cols.flops / hw.peak_flops_for(cols.dtype),
                                        cols.bytes_moved() / hw.hbm_bandwidth_bytes_per_s), 0.0)
        variants = (np.asarray(cols.variants, dtype=object) if len(cols.variants)
                    else np.full(n, "", dtype=object))
        tables = np.array([table_of(kind, v) for v in dict.fromkeys(variants.tolist())], dtype=object)
        eff = np.ones(n)
        prov = np.full(n, int(Provenance.ROOFLINE), dtype=np.int64)
        for table in sorted(set(tables.tolist())):
            family = TABLE_FAMILY[table]
            if family not in self._families:
                continue
            if len(tables) == 1:
                sel = np.arange(n)
            else:
                sel = np.flatnonzero(np.array([table_of(kind, v) == table for v in variants.tolist()], dtype=bool))
            rows = kernel_columns(kind, cols.dtype, [s[sel] for s in cols.shape], variants[sel], table)
            if family != "ep_a2a":
                rows["backend"] = np.full(len(sel), self._table_backend(table), dtype=object)
            eff[sel], prov[sel] = self._table_rows(table, family, rows, own[sel], hw)
        return eff, prov

    def _table_rows(self, table: str, family: str, rows: dict[str, np.ndarray], own_s: np.ndarray,
                    hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        """(efficiency, provenance code) of table rows of one table: the family's predicted latency
        against each kernel's own roofline `own_s`. A row its backend never measured is priced by the
        kernel that stands in for it (`sim.perf.stand_ins`), as extrapolated."""
        stand_in = stand_ins(table, rows)
        tb = table_batch(table, rows, np.arange(len(own_s)), hw)
        y, outside, corrected = self.predict_log_slowdown(family, tb.prims, tb.cats, hw, rowwise=True)
        predicted = tb.roofline_s * np.exp(y)
        eff = np.clip(own_s / np.maximum(predicted, 1e-30), 1e-12, 1.0)
        prov = np.where(outside | stand_in, int(Provenance.EXTRAPOLATED),
                        np.where(corrected, int(Provenance.CALIBRATED), int(Provenance.TRANSFERRED)))
        return eff, prov

    # -- vectorised ----------------------------------------------------------------------------
    def predict_log_slowdown(self, family: str, prims: Mapping[str, np.ndarray],
                             cats: Mapping[str, np.ndarray], hw: HardwareSpec, *, rowwise: bool = False
                             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """log(time / roofline) (>= 0), an extrapolation mask and a calibrated mask, for arrays of
        one family's rows. `rowwise` runs the MLP one matrix-vector product per row, so a row's
        value does not depend on the batch it is priced in (the simulator's block pricing)."""
        n = len(next(iter(prims.values())))
        params = self._families.get(family)
        if params is None:
            return np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        y, outside = self.prior_log_slowdown(family, prims, cats, hw, rowwise=rowwise)
        corrected = np.zeros(n, dtype=bool)
        corr = self._corr.get(family)
        if corr is not None and params.correction is not None:
            keys = [np.asarray(cats[c], dtype=object) if c in cats else np.full(n, "", dtype=object)
                    for c in params.correction.categoricals]
            delta, corrected = correction_residual(corr, correction_coordinates(family, dict(prims)), keys,
                                                    rowwise=rowwise)
            y = y + delta
        return np.clip(y, 0.0, _MAX_LOG_SLOWDOWN), outside, corrected

    def prior_log_slowdown(self, family: str, prims: Mapping[str, np.ndarray],
                           cats: Mapping[str, np.ndarray], hw: HardwareSpec, *, rowwise: bool = False
                           ) -> tuple[np.ndarray, np.ndarray]:
        """The cross-generation part, unclipped (what a target-measured correction is fitted
        against), and the extrapolation mask."""
        params = self._families[family]
        n = len(next(iter(prims.values())))
        cont = features(VECTOR, family, dict(prims), float(hw.num_sms), float(hw.l2_cache_bytes),
                        hw.sm_version or 0)
        hots = [(values == level) if (values := cats.get(name)) is not None else np.zeros(n, dtype=bool)
                for name, levels in params.categoricals for level in levels]
        p = len(cont)
        x_all = np.empty((n, p + len(hots)))
        for i, c in enumerate(cont):
            x_all[:, i] = c
        for j, hot in enumerate(hots):
            x_all[:, p + j] = hot
        x = x_all[:, :p]
        outside = np.zeros(n, dtype=bool)
        rng = self._ranges[family]
        if len(rng):
            slack = _RANGE_SLACK * (rng[:, 1] - rng[:, 0])
            outside = ((x < rng[:, 0] - slack) | (x > rng[:, 1] + slack)).any(1)
            # Polynomial terms must not run away outside the data: hold features at the fitted range.
            np.maximum(x, rng[:, 0], out=x)
            np.minimum(x, rng[:, 1], out=x)
        mlp = self._mlp.get(family)
        if mlp is not None:
            # float32 hidden layers round differently in a matrix product than in a matrix-vector one.
            y: np.ndarray = mlp_forward(mlp, x_all[:, None, :])[:, 0] if rowwise else mlp_forward(mlp, x_all)
            return y + physics_offset(VECTOR, family, dict(prims), float(hw.num_sms), hw.sm_version or 0), outside
        w = self._coef[family]
        y = w[0] + x @ w[1:1 + p]
        lead = x[:, :NUM_INTERACTED]
        inter = 1 + p + len(hots)
        for j, hot in enumerate(hots):
            if hot.any():
                slopes = w[inter + j * NUM_INTERACTED: inter + (j + 1) * NUM_INTERACTED]
                y = y + hot * (w[1 + p + j] + lead @ slopes)
        return y + physics_offset(VECTOR, family, dict(prims), float(hw.num_sms), hw.sm_version or 0), outside
