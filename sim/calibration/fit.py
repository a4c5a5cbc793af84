"""Fitting the efficiency model: ridge regression in log space, per kernel family.

Target: y = log(measured latency / roofline time) = -log(efficiency). Features: `kernel_features`
plus one-hot categoricals. Columns are standardised for the penalty and the scaling folded back
into raw-feature coefficients; the intercept is not penalised. Each GPU gets the same total
weight inside a family so GPUs with larger tables do not dominate. Rows measured faster than
0.95 x roofline (L2-resident benchmark artefacts, see the data README) are left out of fits.

Cross-generation: `fit_cross_generation` over several GPUs' rows. Target-measured:
`fit_correction` fits an additive correction (same layout, stronger penalty) on the residuals
of a base model on one GPU's microbenchmark rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
import pandas as pd

from sim.calibration.batch import FamilyBatch, family_batches
from sim.calibration.tables import columns_of
from sim.perf.fitted import NUM_INTERACTED, FamilyParams
from sim.perf.kernel_features import VECTOR, features
from sim.specs.hardware import HardwareSpec

CATEGORICALS: Final[dict[str, tuple[str, ...]]] = {
    "gemm": ("dtype", "backend"), "attn_prefill": ("dtype", "backend"),
    "attn_decode": ("dtype", "backend"), "pointwise": ("op",), "nccl": ("op",),
    "custom_allreduce": ("variant",),
}
CROSS_LAMBDA: Final = 1.0
CORRECTION_LAMBDA: Final = 30.0
MAX_FIT_ROWS: Final = 25_000
"""Rows per (GPU, family) used in a fit; a deterministic subsample above that."""
_FASTER_THAN_ROOFLINE: Final = float(np.log(0.95))


@dataclass(frozen=True, slots=True)
class Design:
    x: np.ndarray
    """Continuous features (n x p), without intercept or one-hots."""
    cats: dict[str, np.ndarray]
    y: np.ndarray


def design(fb: FamilyBatch, latency_s: np.ndarray, hw: HardwareSpec) -> Design:
    cont = features(VECTOR, fb.family, fb.prims, float(hw.num_sms), float(hw.l2_cache_bytes))
    n = len(fb.index)
    x = np.column_stack([np.broadcast_to(np.asarray(c, dtype=float), (n,)) for c in cont])
    y = np.log(latency_s / np.maximum(fb.roofline_s, 1e-15))
    return Design(x, fb.cats, y)


def _one_hot(cats: Mapping[str, np.ndarray], levels: tuple[tuple[str, tuple[str, ...]], ...],
             x: np.ndarray) -> np.ndarray:
    """One-hot columns, then each level's products with the leading continuous features."""
    n = len(x)
    cols = [(cats[name] == level).astype(float) if name in cats else np.zeros(n)
            for name, lv in levels for level in lv]
    inter = [c[:, None] * x[:, :NUM_INTERACTED] for c in cols]
    return np.hstack([np.column_stack(cols), *inter]) if cols else np.zeros((n, 0))


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


def _subsample(d: Design, limit: int) -> Design:
    keep = d.y > _FASTER_THAN_ROOFLINE
    idx = np.flatnonzero(keep)
    if len(idx) > limit:
        idx = np.sort(np.random.default_rng(0).choice(idx, size=limit, replace=False))
    return Design(d.x[idx], {k: v[idx] for k, v in d.cats.items()}, d.y[idx])


def fit_family(family: str, parts: list[Design], lam: float = CROSS_LAMBDA) -> FamilyParams:
    parts = [_subsample(d, MAX_FIT_ROWS) for d in parts]
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
    return FamilyParams(family=family, categoricals=levels, coef=tuple(float(c) for c in coef),
                        ranges=ranges)


def fit_cross_generation(rows_by_gpu: Mapping[str, pd.DataFrame],
                         hw_by_gpu: Mapping[str, HardwareSpec]) -> dict[str, FamilyParams]:
    return {fam: fit_family(fam, [d for _, d in parts])
            for fam, parts in gpu_designs(rows_by_gpu, hw_by_gpu).items()}


def linear_prediction(params: FamilyParams, d: Design) -> np.ndarray:
    x = np.hstack([np.ones((len(d.y), 1)), d.x, _one_hot(d.cats, params.categoricals, d.x)])
    pred: np.ndarray = x @ np.asarray(params.coef)
    return pred


def fit_correction(base: Mapping[str, FamilyParams], rows: pd.DataFrame, hw: HardwareSpec,
                   lam: float = CORRECTION_LAMBDA) -> dict[str, FamilyParams]:
    """Base families with a correction fitted on `rows` of the target (families without rows unchanged)."""
    out = dict(base)
    for fam, parts in gpu_designs({hw.name: rows}, {hw.name: hw}).items():
        if fam not in base:
            continue
        d = _subsample(parts[0][1], MAX_FIT_ROWS)
        if len(d.y) < 4:
            continue
        p = base[fam]
        resid = d.y - linear_prediction(p, d)
        x = np.hstack([d.x, _one_hot(d.cats, p.categoricals, d.x)])
        corr = ridge(x, resid, np.ones(len(resid)), lam)
        out[fam] = replace(p, correction=tuple(float(c) for c in corr))
    return out
