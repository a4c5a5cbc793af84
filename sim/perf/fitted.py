"""Learned efficiency over the roofline: a linear model in log space per kernel family.

For each family, log(measured / roofline) is a linear function of the device-normalised features
of `sim.perf.kernel_features` plus one-hot categoricals (dtype, backend, collective op). The
cross-generation tier uses coefficients fitted on other GPUs; the target-measured tier adds a
correction (same layout) fitted on the target's microbenchmark sweep. Efficiency is
exp(-max(0, prediction)), so it stays in (0, 1] and time never drops below the roofline.

Parameters are plain numbers (see `sim.calibration.artifact` for the JSON form).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import Efficiency
from sim.perf.kernel_features import COLLECTIVE_FAMILIES, SCALAR, VECTOR, features
from sim.perf.roofline import collective_wire_bytes
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
_PROXY_KINDS: Final = frozenset({KernelKind.MOE_GEMM, KernelKind.SAMPLING, KernelKind.SEND_RECV})
"""Kinds priced by a related family's model: always reported as extrapolated."""
KIND_OP: Final[dict[KernelKind, str]] = {
    KernelKind.ALL_REDUCE: "all_reduce", KernelKind.ALL_GATHER: "all_gather",
    KernelKind.REDUCE_SCATTER: "reduce_scatter", KernelKind.ALL_TO_ALL: "alltoall",
    KernelKind.SEND_RECV: "all_gather", KernelKind.NORM: "norm",
    KernelKind.ELEMENTWISE: "elementwise", KernelKind.EMBEDDING: "embedding",
    KernelKind.SAMPLING: "elementwise",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyParams:
    """Fitted coefficients of one family.

    Layout: [intercept, continuous features (p), one-hots (L), then for each one-hot level its
    products with the first `NUM_INTERACTED` continuous features (L x NUM_INTERACTED)].
    """

    family: str
    categoricals: tuple[tuple[str, tuple[str, ...]], ...]
    """(name, levels) in coefficient order; an unseen or missing level contributes nothing."""
    coef: tuple[float, ...]
    correction: tuple[float, ...] | None = None
    """Target-measured additive correction in the same layout, or None (cross-generation)."""
    ranges: tuple[tuple[float, float], ...] = ()
    """(min, max) of each continuous feature in the fitting data, for the EXTRAPOLATED flag."""

    def num_levels(self) -> int:
        return sum(len(levels) for _, levels in self.categoricals)

    def num_continuous(self) -> int:
        return len(self.coef) - 1 - self.num_levels() * (1 + NUM_INTERACTED)

    def weights(self) -> tuple[float, ...]:
        if self.correction is None:
            return self.coef
        return tuple(a + b for a, b in zip(self.coef, self.correction, strict=True))

    def provenance(self) -> Provenance:
        return Provenance.TRANSFERRED if self.correction is None else Provenance.CALIBRATED


def _kv_dtype_label(work: KernelWork, batch: int, kv_heads: int, head_dim: int) -> str:
    per_elem = work.kv_write_bytes / max(1, 2 * batch * kv_heads * head_dim)
    if work.kind is KernelKind.ATTN_PREFILL:
        per_elem /= max(1, work.shape[1])
    return "fp8" if per_elem < 1.5 else "bfloat16"


class FittedEfficiency:
    """`EfficiencyModel` backed by fitted per-family parameters; pure and cheap per call."""

    def __init__(self, families: Mapping[str, FamilyParams], *, backend: str | None = None) -> None:
        self._families = dict(families)
        self._weights = {f: p.weights() for f, p in self._families.items()}
        self._backend = backend

    def families(self) -> Mapping[str, FamilyParams]:
        return self._families

    # -- single kernel -------------------------------------------------------------------------
    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency:
        family = KIND_FAMILY.get(work.kind)
        params = self._families.get(family) if family else None
        if family is None or params is None:
            return Efficiency(1.0, Provenance.ROOFLINE)
        prims, cats = self._primitives(family, work, hw)
        x = features(SCALAR, family, prims, float(hw.num_sms), float(hw.l2_cache_bytes))
        outside = _outside(x, params.ranges)
        if outside:
            # Polynomial terms must not run away outside the data: hold features at the fitted range.
            x = [min(max(xi, lo), hi) for xi, (lo, hi) in zip(x, params.ranges, strict=False)]
        w = self._weights[family]
        y = w[0]
        for i, xi in enumerate(x, start=1):
            y += w[i] * xi
        j = 1 + len(x)
        inter = j + params.num_levels()
        for name, levels in params.categoricals:
            value = cats.get(name)
            for level in levels:
                if level == value:
                    y += w[j]
                    for q in range(NUM_INTERACTED):
                        y += w[inter + q] * x[q]
                j += 1
                inter += NUM_INTERACTED
        prov = params.provenance()
        if work.kind in _PROXY_KINDS or outside:
            prov = Provenance.EXTRAPOLATED
        return Efficiency(math.exp(-min(max(y, 0.0), _MAX_LOG_SLOWDOWN)), prov)

    def _primitives(self, family: str, work: KernelWork, hw: HardwareSpec
                    ) -> tuple[dict[str, Any], dict[str, str | None]]:
        if family in COLLECTIVE_FAMILIES:
            link = hw.link_for_group(work.group_size)
            wire = collective_wire_bytes(work.kind, work.comm_bytes, work.group_size)
            return ({"network_s": wire / link.bandwidth_bytes_per_s, "msg": max(work.comm_bytes, 1.0),
                     "group": float(max(work.group_size, 2)),
                     "nvlink": 1.0 if link.kind == "nvlink" else 0.0,
                     "link_bw": link.bandwidth_bytes_per_s},
                    {"op": KIND_OP.get(work.kind)})
        p: dict[str, Any] = {
            "compute_s": work.flops / hw.peak_flops_for(work.dtype),
            "memory_s": work.bytes_moved() / hw.hbm_bandwidth_bytes_per_s,
            "bytes": max(work.bytes_moved(), 1.0),
        }
        s = work.shape
        cats: dict[str, str | None] = {"backend": self._backend}
        if family == "gemm":
            p.update(m=float(s[0]), n=float(s[1]), k=float(s[2]))
            cats["dtype"] = work.dtype.value
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
            cats["op"] = KIND_OP.get(work.kind)
        return p, cats

    # -- vectorised ----------------------------------------------------------------------------
    def predict_log_slowdown(self, family: str, prims: Mapping[str, np.ndarray],
                             cats: Mapping[str, np.ndarray], hw: HardwareSpec
                             ) -> tuple[np.ndarray, np.ndarray]:
        """log(time / roofline) (>= 0) and an extrapolation mask for arrays of one family."""
        params = self._families.get(family)
        n = len(next(iter(prims.values())))
        if params is None:
            return np.zeros(n), np.zeros(n, dtype=bool)
        x = features(VECTOR, family, dict(prims), float(hw.num_sms), float(hw.l2_cache_bytes))
        w = self._weights[family]
        y = np.full(n, w[0])
        outside = np.zeros(n, dtype=bool)
        for i, xi in enumerate(x, start=1):
            col = np.broadcast_to(np.asarray(xi, dtype=float), (n,))
            if params.ranges:
                lo, hi = params.ranges[i - 1]
                slack = _RANGE_SLACK * (hi - lo)
                outside |= (col < lo - slack) | (col > hi + slack)
                col = np.clip(col, lo, hi)
                x[i - 1] = col
            y += w[i] * col
        j = 1 + len(x)
        inter = j + params.num_levels()
        lead = [np.broadcast_to(np.asarray(xi, dtype=float), (n,)) for xi in x[:NUM_INTERACTED]]
        for name, levels in params.categoricals:
            values = cats.get(name)
            for level in levels:
                if values is not None:
                    hit = values == level
                    if hit.any():
                        y += hit * (w[j] + sum(w[inter + q] * lead[q] for q in range(NUM_INTERACTED)))
                j += 1
                inter += NUM_INTERACTED
        return np.clip(y, 0.0, _MAX_LOG_SLOWDOWN), outside


def _outside(x: list[float], ranges: tuple[tuple[float, float], ...]) -> bool:
    for xi, (lo, hi) in zip(x, ranges, strict=False):
        slack = _RANGE_SLACK * (hi - lo)
        if xi < lo - slack or xi > hi + slack:
            return True
    return False
