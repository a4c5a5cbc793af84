"""Numpy inference of the learned parts of the kernel model, from plain numbers.

Two learners, both fitted in `sim.calibration` and stored as JSON numbers (never pickled):

- `MlpParams`: a small multilayer perceptron (SiLU hidden layers) on standardised features; the
  cross-generation tier's nonlinear learner for families where leave-one-GPU-out chose it.
- `CorrectionParams`: the target-measured correction, a kernel interpolator (Gaussian-process
  posterior mean with a fixed RBF kernel) of the residual log slowdown over a few log-shape
  coordinates, one group of measured points per categorical level (backend, dtype, op, ...).
  Far from any measured point it decays to the group's mean residual.

Everything here is a pure function of arrays; the parameter objects convert themselves to numpy
arrays once (`arrays()`), and `FittedEfficiency` keeps those.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

POOLED: Final = "*"
"""Categorical value of a correction group fitted on all levels of that categorical (fallback)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MlpParams:
    """y = W_L(... silu(W_1 z + b_1) ...) + b_L with z = (clip(x, lo, hi) - mean) / scale."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]
    lo: tuple[float, ...]
    """Per-input lower clip (fitted range); inputs are held inside it so the net never extrapolates wildly."""
    hi: tuple[float, ...]
    weights: tuple[tuple[tuple[float, ...], ...], ...]
    """Per layer, (inputs x outputs) matrix as rows."""
    biases: tuple[tuple[float, ...], ...]

    def arrays(self) -> MlpArrays:
        return MlpArrays(
            mean=np.asarray(self.mean), scale=np.asarray(self.scale), lo=np.asarray(self.lo),
            hi=np.asarray(self.hi), weights=tuple(np.asarray(w, dtype=float) for w in self.weights),
            biases=tuple(np.asarray(b, dtype=float) for b in self.biases))


@dataclass(frozen=True, slots=True)
class MlpArrays:
    mean: np.ndarray
    scale: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]


def silu(z: np.ndarray) -> np.ndarray:
    out: np.ndarray = z / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))
    return out


def mlp_forward(p: MlpArrays, x: np.ndarray) -> np.ndarray:
    """Network output for inputs `x` (n x p)."""
    h = (np.clip(x, p.lo, p.hi) - p.mean) / p.scale
    last = len(p.weights) - 1
    for i, (w, b) in enumerate(zip(p.weights, p.biases, strict=True)):
        h = h @ w + b
        if i < last:
            h = silu(h)
    out: np.ndarray = h[:, 0]
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionGroup:
    """Measured points of one categorical level and their kernel weights."""

    key: tuple[str, ...]
    """Values of the family's correction categoricals, `POOLED` where the group pools all levels."""
    offset: float
    """Mean residual of the group: the correction far from every measured point."""
    points: tuple[tuple[float, ...], ...]
    """Coordinates of the measured points, already divided by the length scales."""
    alpha: tuple[float, ...]
    """Weights: residual(z) = offset + sum_j alpha_j exp(-|z - z_j|^2 / 2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CorrectionParams:
    coordinates: tuple[str, ...]
    """Names of the shape coordinates (see `sim.perf.kernel_features.correction_coordinates`)."""
    length_scales: tuple[float, ...]
    categoricals: tuple[str, ...]
    """Categoricals that key the groups, in key order."""
    groups: tuple[CorrectionGroup, ...]
    num_points: int = 0
    """Measured points the correction was fitted on."""

    def arrays(self) -> CorrectionArrays:
        return CorrectionArrays(
            length_scales=np.asarray(self.length_scales, dtype=float),
            groups={g.key: (g.offset, np.asarray(g.points, dtype=float).reshape(len(g.alpha), -1),
                            np.asarray(g.alpha, dtype=float)) for g in self.groups})


@dataclass(frozen=True, slots=True)
class CorrectionArrays:
    length_scales: np.ndarray
    groups: dict[tuple[str, ...], tuple[float, np.ndarray, np.ndarray]]


def rbf_mean(points: np.ndarray, alpha: np.ndarray, z: np.ndarray) -> np.ndarray:
    """sum_j alpha_j exp(-|z - z_j|^2 / 2) for each row of `z` (coordinates already scaled)."""
    d2 = (z * z).sum(1)[:, None] + (points * points).sum(1)[None, :] - 2.0 * (z @ points.T)
    out: np.ndarray = np.exp(-0.5 * np.maximum(d2, 0.0)) @ alpha
    return out


def correction_residual(c: CorrectionArrays, coords: np.ndarray, keys: list[np.ndarray]
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(residual log slowdown, corrected mask) for rows with coordinates `coords` (n x d).

    `keys[i]` holds each row's value of the i-th correction categorical. A row takes the group
    of its exact key; failing that, the group where the first categorical that differs is pooled.
    """
    n = len(coords)
    out = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    z = coords / c.length_scales
    # Exact groups first, then pooled fallbacks (keys with POOLED entries) for rows still open.
    for key in sorted(c.groups, key=lambda k: sum(v == POOLED for v in k)):
        offset, points, alpha = c.groups[key]
        hit = ~done
        for col, value in zip(keys, key, strict=True):
            if value != POOLED:
                hit &= col == value
        if not hit.any():
            continue
        idx = np.flatnonzero(hit)
        out[idx] = offset + rbf_mean(points, alpha, z[idx])
        done[idx] = True
    return out, done
