"""An efficiency model scaled per kernel family: one seeded draw of the kernel model's error.

`PerturbedEfficiency(inner, log_factors)` prices every kernel as `inner` does, with its latency
multiplied by exp(log_factors[family]) (family of the kernel's kind, as `accuracy kernels` scores
them). A kernel cannot beat its roofline, so the efficiency is capped at 1. The engine code is
untouched: the simulator sees one more `EfficiencyModel` (`sim.uncertainty` draws the factors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np

from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import ColumnEfficiencyModel, Efficiency, EfficiencyModel, KernelColumns
from sim.perf.fitted import KIND_FAMILY
from sim.specs.hardware import HardwareSpec

SIM_FAMILY: Final[dict[KernelKind, str]] = {
    **KIND_FAMILY, KernelKind.MOE: "moe", KernelKind.MLA_PREFILL: "mla_prefill",
    KernelKind.MLA_DECODE: "mla_decode", KernelKind.MLA_BMM: "mla_bmm", KernelKind.EP_ALL_TO_ALL: "ep_a2a",
}
"""The accuracy family whose residuals describe the error of a simulated kernel kind."""


class PerturbedEfficiency:
    """`inner` with each family's latency scaled by a fixed factor; pure, like `inner`."""

    def __init__(self, inner: EfficiencyModel, log_factors: Mapping[str, float], default_log_factor: float = 0.0
                 ) -> None:
        self._inner = inner
        self._scale = {kind: math.exp(-log_factors.get(fam, default_log_factor)) for kind, fam in SIM_FAMILY.items()}
        self._default = math.exp(-default_log_factor)

    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency:
        eff = self._inner.efficiency(work, hw)
        return Efficiency(min(1.0, eff.value * self._scale.get(work.kind, self._default)), eff.provenance)

    def efficiency_columns(self, cols: KernelColumns, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        if isinstance(self._inner, ColumnEfficiencyModel):
            values, prov = self._inner.efficiency_columns(cols, hw)
        else:
            effs = [self._inner.efficiency(cols.work(i), hw) for i in range(len(cols))]
            values = np.array([e.value for e in effs], dtype=float)
            prov = np.array([int(e.provenance) for e in effs], dtype=np.int64)
        return np.minimum(1.0, values * self._scale.get(cols.kind, self._default)), prov
