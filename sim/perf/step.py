"""Prices a step's kernel graph: per-kernel estimates, totals by kind, worst provenance.

`StepCostModel` owns the only cache (per instance, keyed by the frozen `KernelWork`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sim.graph.kernels import KernelGraph, KernelKind, KernelWork
from sim.perf.efficiency import EfficiencyModel
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
        self._memo: dict[KernelWork, KernelEstimate] = {}

    def estimate(self, work: KernelWork) -> KernelEstimate:
        cached = self._memo.get(work)
        if cached is not None:
            return cached
        rf = roofline(work, self._hw)
        eff = self._efficiency.efficiency(work, self._hw)
        assert 0.0 < eff.value <= 1.0 + 1e-12, (work.name, eff.value)
        est = KernelEstimate(work=work, roofline=rf, efficiency=eff.value,
                             time_s=rf.time_s() / eff.value, provenance=eff.provenance)
        self._memo[work] = est
        return est

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
