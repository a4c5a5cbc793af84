"""Achieved fraction of the roofline, per kernel. The roofline tier is efficiency 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sim.dtypes import DType
from sim.graph.kernels import KernelKind, KernelWork
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


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class KernelColumns:
    """Many launches of one kernel kind, dtype and group size, as columns of `KernelWork`'s
    numeric fields (float64 arrays of one length; `shape` one int64 array per shape entry)."""

    kind: KernelKind
    dtype: DType
    group_size: int
    flops: np.ndarray
    weight_bytes: np.ndarray
    activation_bytes: np.ndarray
    kv_read_bytes: np.ndarray
    kv_write_bytes: np.ndarray
    comm_bytes: np.ndarray
    shape: tuple[np.ndarray, ...]
    variants: tuple[str, ...] | np.ndarray = ()
    """`KernelWork.variant` per row, a tuple or object array (empty: every row has the blank
    variant). The table-keyed kinds (MOE, MLA_*, EP_ALL_TO_ALL) key their price on it; a builder
    that groups kernels into columns must keep kernels that differ only in variant apart or pass
    their variants here."""

    def __len__(self) -> int:
        return len(self.flops)

    def bytes_moved(self) -> np.ndarray:
        """`KernelWork.bytes_moved` per row (same order of additions)."""
        out: np.ndarray = self.weight_bytes + self.activation_bytes + self.kv_read_bytes + self.kv_write_bytes
        return out

    def work(self, i: int, name: str = "") -> KernelWork:
        """Row `i` as a `KernelWork`."""
        return KernelWork(kind=self.kind, name=name, dtype=self.dtype, flops=float(self.flops[i]),
                          weight_bytes=float(self.weight_bytes[i]), activation_bytes=float(self.activation_bytes[i]),
                          kv_read_bytes=float(self.kv_read_bytes[i]), kv_write_bytes=float(self.kv_write_bytes[i]),
                          comm_bytes=float(self.comm_bytes[i]), group_size=self.group_size,
                          shape=tuple(int(s[i]) for s in self.shape),
                          variant=str(self.variants[i]) if len(self.variants) else "")

    @staticmethod
    def of(works: Sequence[KernelWork]) -> KernelColumns:
        """Columns of works that share kind, dtype, group size and shape length."""
        w0 = works[0]
        assert all(w.kind is w0.kind and w.dtype is w0.dtype and w.group_size == w0.group_size
                   and len(w.shape) == len(w0.shape) for w in works), "mixed kernels"

        def col(name: str) -> np.ndarray:
            return np.fromiter((getattr(w, name) for w in works), dtype=float, count=len(works))

        shapes = np.array([w.shape for w in works], dtype=np.int64).reshape(len(works), len(w0.shape))
        return KernelColumns(kind=w0.kind, dtype=w0.dtype, group_size=w0.group_size, flops=col("flops"),
                             weight_bytes=col("weight_bytes"), activation_bytes=col("activation_bytes"),
                             kv_read_bytes=col("kv_read_bytes"), kv_write_bytes=col("kv_write_bytes"),
                             comm_bytes=col("comm_bytes"), shape=tuple(shapes.T.copy()),
                             variants=tuple(w.variant for w in works) if any(w.variant for w in works) else ())


@runtime_checkable
class ColumnEfficiencyModel(Protocol):
    """An `EfficiencyModel` that also prices columns of kernels at once (optional)."""

    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency: ...

    def efficiency_columns(self, cols: KernelColumns, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        """(efficiency values, provenance codes) per row, each equal to `efficiency` of that row's
        `KernelWork` up to float rounding (the vectorised path of the simulator's pricer)."""
        ...


class RooflineEfficiency:
    """The baseline tier: every kernel runs at its roofline bound."""

    def efficiency(self, work: KernelWork, hw: HardwareSpec) -> Efficiency:
        return Efficiency(1.0, Provenance.ROOFLINE)

    def efficiency_columns(self, cols: KernelColumns, hw: HardwareSpec) -> tuple[np.ndarray, np.ndarray]:
        n = len(cols)
        return np.ones(n), np.full(n, int(Provenance.ROOFLINE), dtype=np.int64)
