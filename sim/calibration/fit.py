"""Fitting the efficiency model in log space, per kernel family.

Target: y = log(measured latency / roofline time) = -log(efficiency). Features: `kernel_features`
plus one-hot categoricals. Each GPU gets the same total weight inside a family so GPUs with larger
tables do not dominate. Rows measured faster than 0.95 x roofline (L2-resident benchmark
artefacts, see the data README) are left out of fits.

Cross-generation (`fit_cross_generation`, several GPUs' rows): a ridge model (columns
standardised for the penalty, scaling folded back, intercept unpenalised) for every family, plus
an MLP (`mlp_fit`) for the families where leave-one-GPU-out chose it (`LEARNER`). Target-measured
(`fit_correction`, one GPU's microbenchmark rows): the residual of the cross-generation prediction
is interpolated over log-shape coordinates by a Gaussian-process posterior mean (fixed RBF kernel,
length scales and noise chosen by leave-one-GPU-out), one group per backend/dtype/op level plus a
pooled group as fallback (`sim.perf.learners.CorrectionParams`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import pandas as pd

from sim.calibration.batch import FamilyBatch, family_batches
from sim.calibration.mlp_fit import fit_mlp
from sim.calibration.tables import columns_of
from sim.perf.fitted import NUM_INTERACTED, FamilyParams, FittedEfficiency
from sim.perf.kernel_features import (
    CORRECTION_COORDINATES,
    VECTOR,
    correction_coordinates,
    features,
    physics_offset,
)
from sim.perf.learners import POOLED, CorrectionGroup, CorrectionParams
from sim.specs.hardware import HardwareSpec

CATEGORICALS: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("dtype", "backend"), "attn_prefill": ("dtype", "backend"),
    "attn_decode": ("dtype", "backend"), "pointwise": ("op",), "nccl": ("op",),
    "custom_allreduce": ("variant",), "moe": ("dtype", "backend", "variant"), "mla_prefill": ("dtype", "backend"),
    "mla_decode": ("dtype", "backend"), "mla_bmm": ("dtype", "backend", "op"), "ep_a2a": ("op",),
}
LEARNER: Final[dict[str, str]] = {
    "gemm": "mlp", "attn_prefill": "mlp", "attn_decode": "mlp", "pointwise": "mlp", "nccl": "mlp",
    "custom_allreduce": "mlp", "moe": "mlp", "mla_prefill": "mlp", "mla_decode": "mlp", "mla_bmm": "mlp",
    "ep_a2a": "mlp",
}
"""Cross-generation learner per family, chosen by leave-one-GPU-out (docs/kernel-model.md)."""
CROSS_LAMBDA: Final = 1.0
MAX_FIT_ROWS: Final = 25_000
"""Rows per (GPU, family) used in a ridge fit; a deterministic subsample above that."""
MAX_MLP_ROWS: Final = 15_000
"""Rows per (GPU, family) used to train an MLP."""
CORRECTION_CATEGORICALS: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("backend", "dtype"), "attn_prefill": ("backend", "dtype"), "attn_decode": ("backend", "dtype"),
    "pointwise": ("op",), "nccl": ("op",), "custom_allreduce": ("variant",),
    "moe": ("backend", "dtype", "variant"), "mla_prefill": ("backend", "dtype"), "mla_decode": ("backend", "dtype"),
    "mla_bmm": ("backend", "dtype", "op"), "ep_a2a": ("op",),
}
"""Categoricals whose levels get their own correction group (a leading `backend` also gets a pooled group)."""
LENGTH_SCALES: Final[dict[str, tuple[float, ...]]] = {
    "gemm": (1.5, 2.0, 2.0),
    "attn_prefill": (1.5, 1.5, 1.5, 1.5, 1.5, 1.5),
    "attn_decode": (2.5, 2.5, 2.5, 2.5, 2.5),
    "pointwise": (1.0, 1.0),
    "nccl": (1.5, 1.5),
    "custom_allreduce": (1.5, 1.5),
    "moe": (1.5, 1.5, 1.5, 1.5, 1.5),
    "mla_prefill": (1.5, 1.5, 1.5, 0.5),
    "mla_decode": (1.5, 1.5, 1.5, 0.5),
    "mla_bmm": (1.5, 1.5),
    "ep_a2a": (1.5, 1.5, 1.5),
}
"""RBF length scales of the correction per coordinate (log units), chosen by leave-one-GPU-out."""
CORRECTION_NOISE: Final[dict[str, float]] = {
    "gemm": 0.05, "attn_prefill": 0.05, "attn_decode": 0.05, "pointwise": 0.05, "nccl": 0.01,
    "custom_allreduce": 0.01, "moe": 0.5, "mla_prefill": 0.05, "mla_decode": 0.05, "mla_bmm": 0.05,
    "ep_a2a": 0.1,
}
"""Noise-to-signal ratio of the correction's kernel interpolation (smoothing), per family."""
FALLBACK_GROUPS: Final[dict[str, tuple[str, ...]]] = {}
"""Wider groups a family's correction can also fit, for rows whose exact and backend-pooled groups
the sweep did not measure (`sim.perf.learners.lookup_order`): "backend" keeps the first categorical
(the backend) and pools the rest, "all" pools everything (the GPU's family-wide residual). None by
default: leave-one-GPU-out found them neutral once the plan measures every format the tables hold,
and harmful before (a module decode row took the attention kernels' residual), so such a row keeps
the cross-generation prediction (docs/kernel-model.md)."""
MAX_CENTERS: Final = 128
"""Kernel centres per correction group: bounds artifact size and prediction cost (each row is
compared with its group's centres)."""
_FASTER_THAN_ROOFLINE: Final = float(np.log(0.95))
OUTLIER_MADS: Final = 4.0
"""A calibration point whose leave-one-out residual lies beyond this many robust standard deviations
(1.4826 x MAD) of its group's leave-one-out residuals, and beyond `OUTLIER_MIN_LOG`, is an outlier."""
OUTLIER_MIN_LOG: Final = 0.2
OUTLIER_WEIGHT: Final = 0.01
"""An outlier keeps this share of its weight (its noise is 100 x): one slow measurement, such as
h100_sxm's vLLM bf16 GEMM at (m, n, k) = (4096, 16384, 2048) at 348 TFLOP/s among neighbours at
600-880, no longer bends the correction of every large GEMM around it."""
MAX_OUTLIER_SHARE: Final = 0.05
ROBUST_MAX_POINTS: Final = 1000
"""Groups with more distinct points skip the outlier step (each leave-one-out solve is cubic)."""


@dataclass(frozen=True, slots=True)
class Design:
    x: np.ndarray
    """Continuous features (n x p), without intercept or one-hots."""
    cats: dict[str, np.ndarray]
    y: np.ndarray
    prims: dict[str, np.ndarray]
    offset: np.ndarray | float = 0.0
    """Physics baseline log(time / roofline) already taken out of `y` (physics families)."""
    num_sms: float = 1.0
    sm_version: int = 0
    """The GPU's SMs and compute capability x10 (the wave-quantised baseline of `physics_offset`)."""


def design(fb: FamilyBatch, latency_s: np.ndarray, hw: HardwareSpec) -> Design:
    cont = features(VECTOR, fb.family, fb.prims, float(hw.num_sms), float(hw.l2_cache_bytes), hw.sm_version or 0)
    n = len(fb.index)
    x = np.column_stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in cont])
    y = np.log(latency_s / np.maximum(fb.roofline_s, 1e-15))
    return Design(x, fb.cats, y, fb.prims, num_sms=float(hw.num_sms), sm_version=hw.sm_version or 0)


def _one_hot(cats: Mapping[str, np.ndarray], levels: tuple[tuple[str, tuple[str, ...]], ...],
             x: np.ndarray, *, interactions: bool = True) -> np.ndarray:
    """One-hot columns, then (ridge) each level's products with the leading continuous features."""
    n = len(x)
    cols = [(cats[name] == level).astype(float) if name in cats else np.zeros(n)
            for name, lv in levels for level in lv]
    if not cols:
        return np.zeros((n, 0))
    if not interactions:
        return np.column_stack(cols)
    inter = [c[:, None] * x[:, :NUM_INTERACTED] for c in cols]
    return np.hstack([np.column_stack(cols), *inter])


def ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, lam: float) -> np.ndarray:
    """Weighted ridge with an unpenalised intercept; returns [intercept, coefs...] on raw scale."""
    sw = w / w.sum()
    mu = sw @ x
    sd = np.sqrt(sw @ (x - mu) ** 2)
    sd[sd < 1e-9] = 1.0
    z = (x - mu) / sd
    ybar = sw @ y
    a = (z * sw[:, None]).T @ z + lam / len(y) * np.eye(x.shape[1])
    b = (z * sw[:, None]).T @ (y - ybar)
    beta = np.linalg.solve(a, b)
    coef = beta / sd
    return np.concatenate([[ybar - mu @ coef], coef])


def gpu_designs(rows_by_gpu: Mapping[str, pd.DataFrame], hw_by_gpu: Mapping[str, HardwareSpec]
                ) -> dict[str, list[tuple[str, Design]]]:
    """Per family, (gpu, design) for every GPU that has rows of it."""
    out: dict[str, list[tuple[str, Design]]] = {}
    for gpu, rows in sorted(rows_by_gpu.items()):
        if not len(rows):
            continue
        cols = columns_of(rows)
        lat = rows.latency_s.to_numpy(dtype=float)
        for fb in family_batches(cols, hw_by_gpu[gpu]):
            out.setdefault(fb.family, []).append((gpu, design(fb, lat[fb.index], hw_by_gpu[gpu])))
    return out


def _take(d: Design, idx: np.ndarray) -> Design:
    return Design(d.x[idx], {k: v[idx] for k, v in d.cats.items()}, d.y[idx],
                  {k: np.asarray(v)[idx] if np.ndim(v) else v for k, v in d.prims.items()},
                  np.asarray(d.offset)[idx] if np.ndim(d.offset) else d.offset, d.num_sms, d.sm_version)


def _subsample(d: Design, limit: int) -> Design:
    idx = np.flatnonzero(d.y + d.offset > _FASTER_THAN_ROOFLINE)
    if len(idx) > limit:
        idx = np.sort(np.random.default_rng(0).choice(idx, size=limit, replace=False))
    return _take(d, idx)


def fit_family(family: str, parts: list[Design], lam: float = CROSS_LAMBDA,
               learner: str | None = None) -> FamilyParams:
    """Cross-generation parameters of one family from several GPUs' designs."""
    learner = learner or LEARNER.get(family, "ridge")
    # Physics families: the learner fits the residual over the alpha-beta baseline.
    parts = [replace(d, y=d.y - (off := physics_offset(VECTOR, family, d.prims, d.num_sms, d.sm_version)),
                     offset=off) for d in parts]
    full = [d for d in parts if len(d.y)]
    parts = [_subsample(d, MAX_FIT_ROWS) for d in full]
    parts = [d for d in parts if len(d.y)]
    if not parts:
        raise ValueError(f"no usable rows to fit family {family!r}")
    levels = tuple((name, tuple(sorted({str(v) for d in parts for v in d.cats[name] if str(v)})))
                   for name in CATEGORICALS[family])
    x = np.vstack([np.hstack([d.x, _one_hot(d.cats, levels, d.x)]) for d in parts])
    y = np.concatenate([d.y for d in parts])
    w = np.concatenate([np.full(len(d.y), 1.0 / len(d.y)) for d in parts])
    coef = ridge(x, y, w, lam)
    cont = np.vstack([d.x for d in parts])
    ranges = tuple((float(lo), float(hi)) for lo, hi in zip(cont.min(0), cont.max(0), strict=True))
    params = FamilyParams(family=family, categoricals=levels, coef=tuple(float(c) for c in coef),
                          ranges=ranges)
    if learner == "mlp":
        small = [_subsample(d, MAX_MLP_ROWS) for d in full]
        small = [d for d in small if len(d.y)]
        xm = np.vstack([np.hstack([d.x, _one_hot(d.cats, levels, d.x, interactions=False)]) for d in small])
        ym = np.concatenate([d.y for d in small])
        wm = np.concatenate([np.full(len(d.y), 1.0 / len(d.y)) for d in small])
        params = replace(params, mlp=fit_mlp(xm, ym, wm))
    return params


def fit_cross_generation(rows_by_gpu: Mapping[str, pd.DataFrame], hw_by_gpu: Mapping[str, HardwareSpec],
                         learners: Mapping[str, str] | None = None) -> dict[str, FamilyParams]:
    learners = learners or LEARNER
    return {fam: fit_family(fam, [d for _, d in parts], learner=learners.get(fam, "ridge"))
            for fam, parts in gpu_designs(rows_by_gpu, hw_by_gpu).items()}


@dataclass(frozen=True, slots=True)
class CorrectionSettings:
    length_scales: Mapping[str, tuple[float, ...]]
    noise: Mapping[str, float]
    fallback: Mapping[str, tuple[str, ...]] | None = None
    """Per family, the wider fallback groups fitted (`FALLBACK_GROUPS`; None: those defaults)."""


def _farthest_points(z: np.ndarray, m: int) -> np.ndarray:
    """Indices of `m` points spread over `z` (greedy farthest-point order from the first point)."""
    chosen = [0]
    d2 = ((z - z[0]) ** 2).sum(1)
    for _ in range(m - 1):
        i = int(np.argmax(d2))
        chosen.append(i)
        d2 = np.minimum(d2, ((z - z[i]) ** 2).sum(1))
    return np.array(sorted(chosen))


def robust_weights(z: np.ndarray, counts: np.ndarray, resid: np.ndarray, noise: float) -> np.ndarray:
    """`counts` with outliers' weight cut to `OUTLIER_WEIGHT` (see `OUTLIER_MADS`).

    Leave-one-out residuals of the exact GP posterior mean in closed form: loo_i = a_i / [K^-1]_ii
    with a = K^-1 resid (Rasmussen & Williams, eq. 5.12); an isolated bad point stands out there,
    while a region that is genuinely slower is predicted by its neighbours and is kept. One point
    at a time, worst first, then the residuals are recomputed: a bad point also pulls its
    neighbours' leave-one-out predictions, and those must not be flagged with it. At most
    `MAX_OUTLIER_SHARE` of a group's points are cut.
    """
    n = len(z)
    if n < 8 or n > ROBUST_MAX_POINTS:
        return counts
    kernel = np.exp(-0.5 * ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1))
    weights = counts.astype(float).copy()
    for _ in range(int(MAX_OUTLIER_SHARE * n)):
        k_inv = np.linalg.inv(kernel + np.diag(noise / weights))
        loo = (k_inv @ resid) / np.diag(k_inv)
        loo[weights < counts] = 0.0  # already cut
        spread = 1.4826 * float(np.median(np.abs(loo - np.median(loo))))
        worst = int(np.argmax(np.abs(loo)))
        if abs(loo[worst]) <= max(OUTLIER_MADS * spread, OUTLIER_MIN_LOG):
            break
        weights[worst] *= OUTLIER_WEIGHT
    return weights


def _group(key: tuple[str, ...], z: np.ndarray, r: np.ndarray, noise: float,
           max_centers: int = MAX_CENTERS) -> CorrectionGroup:
    """GP posterior-mean weights of one group's points (duplicates of a point averaged).

    Up to `max_centers` distinct points: the exact posterior mean. Beyond: the subset-of-regressors
    approximation on `max_centers` farthest-point centres (all points still inform the weights),
    which bounds the prediction cost per row.
    """
    uniq, inverse = np.unique(np.round(z, 9), axis=0, return_inverse=True)
    inverse = inverse.ravel()
    counts = np.bincount(inverse, minlength=len(uniq)).astype(float)
    rm = np.bincount(inverse, weights=r, minlength=len(uniq)) / counts
    counts = robust_weights(uniq, counts, rm - float(np.average(rm, weights=counts)), noise)
    offset = float(np.average(rm, weights=counts))
    resid = rm - offset
    if len(uniq) <= max_centers:
        d2 = ((uniq[:, None, :] - uniq[None, :, :]) ** 2).sum(-1)
        alpha = np.linalg.solve(np.exp(-0.5 * d2) + np.diag(noise / counts), resid)
        centres = uniq
    else:
        centres = uniq[_farthest_points(uniq, max_centers)]
        k_cx = np.exp(-0.5 * ((centres[:, None, :] - uniq[None, :, :]) ** 2).sum(-1))
        k_cc = np.exp(-0.5 * ((centres[:, None, :] - centres[None, :, :]) ** 2).sum(-1))
        prec = counts / noise
        a = (k_cx * prec) @ k_cx.T + k_cc + 1e-9 * np.eye(len(centres))
        alpha = np.linalg.solve(a, (k_cx * prec) @ resid)
    return CorrectionGroup(key=key, offset=offset, points=tuple(tuple(float(v) for v in p) for p in centres),
                           alpha=tuple(float(a) for a in alpha))


def fit_correction_family(family: str, d: Design, prior: np.ndarray,
                          settings: CorrectionSettings | None = None) -> CorrectionParams | None:
    """The target-measured correction of one family from one GPU's design and its prior prediction."""
    settings = settings or CorrectionSettings(LENGTH_SCALES, CORRECTION_NOISE)
    keep = d.y > _FASTER_THAN_ROOFLINE
    if keep.sum() < 2:
        return None
    scales = np.asarray(settings.length_scales[family], dtype=float)
    z = correction_coordinates(family, d.prims)[keep] / scales
    r = (d.y - prior)[keep]
    names = CORRECTION_CATEGORICALS[family]
    cols = [np.asarray(d.cats[c], dtype=object)[keep] if c in d.cats else np.full(int(keep.sum()), "", dtype=object)
            for c in names]
    keys = list(zip(*[c.astype(str) for c in cols], strict=True))
    groups: list[CorrectionGroup] = []
    exact = sorted(set(keys))
    key_arr = np.array(["\x1f".join(k) for k in keys], dtype=object)
    for key in exact:
        sel = key_arr == "\x1f".join(key)
        groups.append(_group(key, z[sel], r[sel], settings.noise[family]))
    # Pooled over backends: the fallback for a backend the sweep did not measure (the same
    # operation in another framework). Operations are never pooled: their residuals differ.
    rest = sorted({k[1:] for k in keys}) if names[0] == "backend" else []
    for tail in rest:
        sel = np.array([k[1:] == tail for k in keys])
        groups.append(_group((POOLED, *tail), z[sel], r[sel], settings.noise[family]))
    fallback = (FALLBACK_GROUPS if settings.fallback is None else settings.fallback).get(family, ())
    if "backend" in fallback and len(names) >= 2:
        for head in sorted({k[0] for k in keys}):
            sel = np.array([k[0] == head for k in keys])
            groups.append(_group((head, *([POOLED] * (len(names) - 1))), z[sel], r[sel], settings.noise[family]))
    if "all" in fallback:
        groups.append(_group(tuple([POOLED] * len(names)), z, r, settings.noise[family]))
    return CorrectionParams(coordinates=CORRECTION_COORDINATES[family], length_scales=tuple(float(s) for s in scales),
                            categoricals=names, groups=tuple(groups), num_points=int(keep.sum()))


def fit_correction(base: Mapping[str, FamilyParams], rows: pd.DataFrame, hw: HardwareSpec,
                   settings: CorrectionSettings | None = None) -> dict[str, FamilyParams]:
    """Base families with a correction fitted on `rows` of the target (families without rows unchanged)."""
    out = {f: replace(p, correction=None) for f, p in base.items()}
    model = FittedEfficiency(out)
    for fam, parts in gpu_designs({hw.name: rows}, {hw.name: hw}).items():
        if fam not in base:
            continue
        d = parts[0][1]
        prior, _ = model.prior_log_slowdown(fam, d.prims, d.cats, hw)
        corr = fit_correction_family(fam, d, prior, settings)
        if corr is not None:
            out[fam] = replace(out[fam], correction=corr)
    return out
