"""Achieved fraction of the roofline, per kernel. The roofline tier is efficiency 1."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.graph.kernels import KernelWork
from sim.provenance import Provenance
from sim.specs.hardware import HardwareSpec


@dataclass(frozen=True, slots=True)
class Efficiency:
    value: float
    """In (0, 1]: roofline time / predicted time."""
    provenance: Provenance


class EfficiencyModel(Protocol):
    """Achieved fraction of roofline throughput for a kernel on a device.

    Implementations are pure: the same (work, hw) gives the same `Efficiency`, with no I/O and
    no clock; fitted parameters are constructor arguments.
    """

    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency: ...


class RooflineEfficiency:
    """The baseline tier: every kernel runs at its roofline bound."""

    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency:
        return Efficiency(1.0, Provenance.ROOFLINE)
