"""Prices a step's kernel graph: per-kernel estimates, totals by kind, worst provenance.

`StepCostModel` owns the only cache (per instance, keyed by the frozen `KernelWork`).
`estimate_columns` prices many launches of one kernel kind at once (the pricer's blocks), with
the same numbers as `estimate` row by row.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from sim.graph.kernels import KernelGraph, KernelKind, KernelWork
from sim.graph.shared_experts import beside_token_limit
from sim.perf.efficiency import ColumnEfficiencyModel, EfficiencyModel, KernelColumns
from sim.perf.roofline import Roofline, roofline
from sim.provenance import Provenance
from sim.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelEstimate:
    work: KernelWork
    roofline: Roofline
    efficiency: float
    time_s: float
    """Time of one launch."""
    provenance: Provenance


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelTiming:
    """One graph node priced: a launch's estimate times its repeat count."""

    estimate: KernelEstimate
    repeat: int

    def total_s(self) -> float:
        return self.estimate.time_s * self.repeat


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming:
    kernels: tuple[KernelTiming, ...]
    gpu_s: float
    """Compute kernels on the critical path."""
    comm_s: float
    """Collectives (not overlapped with compute)."""
    worst_provenance: Provenance

    def device_s(self) -> float:
        return self.gpu_s + self.comm_s

    def seconds_by_kind(self) -> dict[KernelKind, float]:
        out: dict[KernelKind, float] = defaultdict(float)
        for k in self.kernels:
            out[k.estimate.work.kind] += k.total_s()
        return dict(out)

    def seconds_by_name(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for k in self.kernels:
            out[k.estimate.work.name] += k.total_s()
        return dict(out)


class StepCostModel:
    """Prices kernel graphs on one device with one efficiency model."""

    def __init__(self, hw: HardwareSpec, efficiency: EfficiencyModel) -> None:
        self._hw = hw
        self._efficiency = efficiency
        self._columns: ColumnEfficiencyModel | None = (
            efficiency if isinstance(efficiency, ColumnEfficiencyModel) else None)
        """The model when it prices columns, checked once: a runtime protocol check costs ~10 us,
        as much as pricing a small column."""
        self._memo: dict[KernelWork, KernelEstimate] = {}

    def estimate(self, work: KernelWork) -> KernelEstimate:
        cached = self._memo.get(work)
        if cached is not None:
            return cached
        limit = beside_token_limit(work.variant)
        if limit is not None:
            est = self._beside(work, limit)
            self._memo[work] = est
            return est
        rf = roofline(work, self._hw)
        eff = self._efficiency.efficiency(work, self._hw)
        assert 0.0 < eff.value <= 1.0 + 1e-12, (work.name, eff.value)
        est = KernelEstimate(work=work, roofline=rf, efficiency=eff.value,
                             time_s=rf.time_s() / eff.value, provenance=eff.provenance)
        self._memo[work] = est
        return est

    def _beside(self, work: KernelWork, limit: int) -> KernelEstimate:
        """A shared-expert kernel beside the routed experts (`sim.graph.shared_experts`): in a step
        of at most `limit` tokens it costs its roofline time, the DRAM / tensor-core share it takes
        from the routed-expert kernel it hides under; in a larger step, what it costs on its own.
        Its provenance is the kernel model's for the same kernel: the roofline here is how much of
        a priced kernel stays exposed, not a fallback for a kernel the model cannot price."""
        alone = self.estimate(replace(work, variant=""))
        if work.shape[0] > limit:
            return replace(alone, work=work)
        return KernelEstimate(work=work, roofline=alone.roofline, efficiency=1.0,
                              time_s=alone.roofline.time_s(), provenance=alone.provenance)

    def prices_columns(self) -> bool:
        """Whether `estimate_columns` is vectorised (the efficiency model prices columns)."""
        return self._columns is not None

    def estimate_columns(self, cols: KernelColumns) -> tuple[np.ndarray, np.ndarray]:
        """(time of one launch, provenance code) per row: `estimate` of each row's `KernelWork`,
        vectorised when the efficiency model prices columns, else row by row."""
        columns = self._columns
        if columns is None:
            ests = [self.estimate(cols.work(i)) for i in range(len(cols))]
            return (np.array([e.time_s for e in ests], dtype=float),
                    np.array([int(e.provenance) for e in ests], dtype=np.int64))
        hw = self._hw
        if cols.kind.is_collective():
            link = hw.link_for_group(cols.group_size)
            # `collective_wire_bytes` with the same operations, on a column of message sizes.
            if cols.kind is KernelKind.SEND_RECV:
                wire_bytes = cols.comm_bytes
            elif cols.group_size <= 1:
                wire_bytes = np.zeros(len(cols))
            elif cols.kind is KernelKind.ALL_REDUCE:
                wire_bytes = 2.0 * (cols.group_size - 1) / cols.group_size * cols.comm_bytes
            else:
                wire_bytes = (cols.group_size - 1) / cols.group_size * cols.comm_bytes
            bound = np.maximum(wire_bytes / link.bandwidth_bytes_per_s, 0.0)
        else:
            bound = np.maximum(np.maximum(cols.flops / hw.peak_flops_for(cols.dtype),
                                          cols.bytes_moved() / hw.hbm_bandwidth_bytes_per_s), 0.0)
        beside = _beside_rows(cols)
        if beside is None:
            eff, prov = columns.efficiency_columns(cols, hw)
        else:
            # Shared-expert rows beside the routed experts cost their roofline time (`_beside`),
            # with the provenance of the same kernels without the variant, which price the rest.
            eff, prov = columns.efficiency_columns(replace(cols, variants=()), hw)
            eff = np.where(beside, 1.0, eff)
        assert bool(((eff > 0.0) & (eff <= 1.0 + 1e-12)).all()), (cols.kind, eff)
        time_s: np.ndarray = bound / eff
        return time_s, prov

    def cost(self, graph: KernelGraph) -> StepTiming:
        timings = tuple(KernelTiming(estimate=self.estimate(n.work), repeat=n.repeat) for n in graph.nodes)
        gpu = comm = 0.0
        worst = Provenance.MEASURED
        for t in timings:
            if t.estimate.work.kind.is_collective():
                comm += t.total_s()
            else:
                gpu += t.total_s()
            worst = max(worst, t.estimate.provenance)
        return StepTiming(kernels=timings, gpu_s=gpu, comm_s=comm, worst_provenance=worst)


def _beside_rows(cols: KernelColumns) -> np.ndarray | None:
    """Per row, whether it is a shared-expert kernel beside the routed experts within its token
    limit (`StepCostModel._beside`); None when no row carries the variant."""
    if not len(cols.variants):
        return None
    limits = [beside_token_limit(str(v)) for v in cols.variants]
    if all(limit is None for limit in limits):
        return None
    # The column prices the other rows without their variants: only blank ones may share it.
    assert all(limit is not None or not v for limit, v in zip(limits, cols.variants, strict=True)), cols.kind
    tokens = cols.shape[0]
    return np.array([limit is not None and int(tokens[i]) <= limit for i, limit in enumerate(limits)], dtype=bool)
