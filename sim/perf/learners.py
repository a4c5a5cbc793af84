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
            hi=np.asarray(self.hi), weights=tuple(np.asarray(w, dtype=np.float32) for w in self.weights),
            biases=tuple(np.asarray(b, dtype=np.float32) for b in self.biases))


@dataclass(frozen=True, slots=True)
class MlpArrays:
    mean: np.ndarray
    scale: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]


def silu(z: np.ndarray) -> np.ndarray:
    """z * sigmoid(z), in place (exp overflow for very negative z gives the right limit, -0)."""
    s = np.negative(z)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    out: np.ndarray = np.divide(z, s, out=s)
    return out


def clamp(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """min(max(x, lo), hi) into a new array (np.clip's dispatch overhead dominates on big batches)."""
    out: np.ndarray = np.maximum(x, lo)
    np.minimum(out, hi, out=out)
    return out


def row_products(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`x @ w` for the rows of `x` (n x p) one product at a time, so each row's value is the same
    whatever the other rows are: a single BLAS call over all rows rounds a row differently with the
    number of rows (its kernels take rows in blocks and the last few alone), and block pricing must
    price a count the same in any window (`sim.engine.block_pricing`)."""
    out: np.ndarray = np.matmul(x[:, None, :], w)[:, 0]
    return out


def mlp_forward(p: MlpArrays, x: np.ndarray) -> np.ndarray:
    """Network output for inputs `x` (n x p, or one row of p). Hidden layers in float32 (the
    weights' precision): ~1e-6 relative, far below the model's error, twice as fast."""
    h = clamp(x, p.lo, p.hi)
    h -= p.mean
    h /= p.scale
    h = h.astype(np.float32)
    last = len(p.weights) - 1
    for i, (w, b) in enumerate(zip(p.weights, p.biases, strict=True)):
        h = h @ w
        h += b
        if i < last:
            h = silu(h)
    out: np.ndarray = h[..., 0].astype(float)
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
        groups = {}
        for g in self.groups:
            pts = np.asarray(g.points, dtype=float).reshape(len(g.alpha), -1)
            groups[g.key] = (g.offset, pts, np.asarray(g.alpha, dtype=float), (pts * pts).sum(1))
        num_keys = len(self.categoricals)
        levels = tuple(tuple(sorted({k[i] for k in groups} - {POOLED})) for i in range(num_keys))
        return CorrectionArrays(length_scales=np.asarray(self.length_scales, dtype=float), groups=groups,
                                levels=levels, level_codes=tuple({v: j for j, v in enumerate(lv)} for lv in levels))


_G = tuple[float, np.ndarray, np.ndarray, np.ndarray]
_RBF_CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True, slots=True)
class CorrectionArrays:
    length_scales: np.ndarray
    groups: dict[tuple[str, ...], tuple[float, np.ndarray, np.ndarray, np.ndarray]]
    """key -> (offset, points, alpha, squared norms of the points)."""
    levels: tuple[tuple[str, ...], ...]
    """Per correction categorical, the values some group names (sorted, `POOLED` left out)."""
    level_codes: tuple[dict[str, int], ...]
    """Per correction categorical, value -> its index in `levels`."""


def rbf_mean(points: np.ndarray, alpha: np.ndarray, z: np.ndarray, sq: np.ndarray | None = None, *,
             rowwise: bool = False) -> np.ndarray:
    """sum_j alpha_j exp(-|z - z_j|^2 / 2) for each row of `z` (coordinates already scaled), in
    float64 (~1e-13 relative). The squared distances come from |z|^2 - 2 z.z_j + |z_j|^2, which
    cancels: with |z|^2 up to ~1e3 for real shapes, float32 put errors of ~1e-4 in the exponent,
    and the collective corrections' weights (|alpha| up to ~16) made that ~1e-4 of a latency.
    `rowwise` computes each row on its own, so its value does not depend on the other rows of
    the batch."""
    if rowwise:
        # Distances and kernel values for all rows at once (elementwise, and each row's sum runs
        # over its own last axis: the same bits as one row at a time), then one dot product per row.
        # Chunks of rows keep the n x points x d temporary near 8 MB.
        step = max(1, _RBF_CHUNK_ELEMENTS // max(1, points.size))
        out_rows: list[float] = []
        for start in range(0, len(z), step):
            diff = points[None, :, :] - z[start:start + step, None, :]
            diff *= diff
            kernel = diff.sum(2)
            kernel *= -0.5
            np.exp(kernel, out=kernel)
            out_rows.extend(float(row @ alpha) for row in kernel)
        return np.array(out_rows)
    k = z @ (-2.0 * points.T)
    k += (z * z).sum(1)[:, None]
    k += ((points * points).sum(1) if sq is None else sq)[None, :]
    np.maximum(k, 0.0, out=k)
    k *= -0.5
    np.exp(k, out=k)
    out: np.ndarray = k @ alpha
    return out


def _codes(values: np.ndarray, levels: dict[str, int]) -> np.ndarray:
    """Integer code of each value (-1 when not a level), by hashing rather than string compares."""
    return np.fromiter((levels.get(v, -1) for v in values.tolist()), dtype=np.int64, count=len(values))


def lookup_order(key: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Group keys that may serve a row with categorical values `key`, best first: its exact group;
    the group pooled at one categorical (first position first: another backend's measurement of
    the same format); the group keeping only the first categorical (same backend, any format); the
    group pooled over everything (the GPU's family-wide residual)."""
    n = len(key)
    out = [key, *((*key[:i], POOLED, *key[i + 1:]) for i in range(n))]
    if n > 2:
        out.append((key[0], *([POOLED] * (n - 1))))
    if n > 1:
        out.append(tuple([POOLED] * n))
    return out


def find_group(groups: dict[tuple[str, ...], _G], key: tuple[str, ...]) -> _G | None:
    """The group that serves `key` (`lookup_order`), or None."""
    for k in lookup_order(key):
        group = groups.get(k)
        if group is not None:
            return group
    return None


def correction_residual(c: CorrectionArrays, coords: np.ndarray, keys: list[np.ndarray], *, rowwise: bool = False
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(residual log slowdown, corrected mask) for rows with coordinates `coords` (n x d).

    `keys[i]` holds each row's value of the i-th correction categorical; each distinct key takes
    the group `find_group` gives it.
    """
    n = len(coords)
    out = np.zeros(n)
    done = np.zeros(n, dtype=bool)
    if n == 0:
        return out, done
    z = coords / c.length_scales
    # Distinct keys by integer codes per categorical (hashing, not string compares per row); a
    # value that no group names gets code -1 and can only be served by a group pooled there.
    levels = c.levels
    codes = [_codes(col, lc) for col, lc in zip(keys, c.level_codes, strict=True)]
    combined = np.zeros(n, dtype=np.int64)
    for code, lv in zip(codes, levels, strict=True):
        combined = combined * (len(lv) + 1) + (code + 1)
    distinct, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    for j in range(len(distinct)):
        row = int(first[j])
        key = tuple(lv[code[row]] if code[row] >= 0 else "\x00"
                    for code, lv in zip(codes, levels, strict=True))
        group = find_group(c.groups, key)
        if group is None:
            continue
        offset, points, alpha, sq = group
        idx = np.flatnonzero(inverse == j)
        out[idx] = offset + rbf_mean(points, alpha, z[idx], sq, rowwise=rowwise)
        done[idx] = True
    return out, done


def correction_one(c: CorrectionArrays, coords: np.ndarray, key: tuple[str, ...]) -> float | None:
    """The correction of one row (coordinates `coords`, categorical values `key`), or None when no
    group serves it (`find_group`)."""
    group = find_group(c.groups, key)
    if group is None:
        return None
    offset, points, alpha, _ = group
    diff = points - coords / c.length_scales
    return offset + float(np.exp(-0.5 * np.einsum("ij,ij->i", diff, diff)) @ alpha)
