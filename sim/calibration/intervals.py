"""Calibrated intervals of kernel predictions: split-conformal quantiles of log residuals.

A residual is r = log(measured / predicted) of one kernel call. For each tier and kernel family the
shipped table holds the nominal 90% central interval [q_lo, q_hi] of r: the split-conformal order
statistics of the leave-one-GPU-out residuals of the dev GPUs (`kernelsight accuracy kernels
--intervals-out`), with the finite-sample correction: q_hi is the k-th smallest residual and q_lo
the k-th largest, k = ceil((n + 1)(1 - alpha / 2)), one tail of alpha / 2 each. A prediction t then
carries [t exp(q_lo), t exp(q_hi)]. The table also keeps a few inner quantiles of r, from which the
simulator draws one multiplicative latency factor per family (`sample_log_factors`) to propagate
kernel uncertainty through a run (`sim.uncertainty`). Layout: {"schema": 1, "nominal": 0.9,
"method": str, "produced_by": str, "data_sha256": {"aiconfigurator/<gpu>": sha}, "tiers": {tier: {family: {"n": int,
"lo_log": x, "hi_log": x, "levels": [...], "values": [...]}}}}; family "all" pools every family of
the tier (used for kinds no family's residuals cover). Loading rejects unknown keys and wrong types.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from sim.errors import ConfigError
from sim.specs.catalog import read_json_object

SCHEMA: Final = 1
ALPHA: Final = 0.1
"""Miscoverage of the shipped intervals: nominal 90% central, alpha / 2 in each tail."""
INNER_LEVELS: Final = tuple(round(0.1 * i, 2) for i in range(1, 10))
"""Inner quantile levels kept for sampling (the ends are the conformal bounds at alpha / 2, 1 - alpha / 2)."""
POOLED: Final = "all"
TIERS: Final = ("roofline", "cross-generation", "target-measured")
INTERVALS_FILE: Final = "intervals.json"
METHOD: Final = ("split-conformal on log(measured / predicted) residuals per tier and family; residuals "
                 "from leave-one-GPU-out predictions of the dev GPUs (cross-generation: model refitted "
                 "without the GPU; target-measured: correction fitted on the GPU's plan points, scored on "
                 "units the plan does not touch; roofline: no fit); b200_sxm never used; each tail at "
                 "the ceil((n+1)(1-alpha/2))-th order statistic")
_TOP_KEYS: Final = frozenset({"schema", "nominal", "method", "produced_by", "data_sha256", "tiers"})
_FAMILY_KEYS: Final = frozenset({"n", "lo_log", "hi_log", "levels", "values"})


Residuals = Mapping[str, Mapping[str, Mapping[str, np.ndarray]]]
"""GPU -> tier -> family -> log(measured / predicted) of that GPU's scored rows."""


def conformal_bounds(residuals: np.ndarray | Sequence[float], alpha: float = ALPHA) -> tuple[float, float]:
    """(q_lo, q_hi): the k-th largest and k-th smallest residual, k = ceil((n + 1)(1 - alpha / 2));
    (-inf, inf) when k > n (too few residuals for a finite interval at this level)."""
    r = np.sort(np.asarray(residuals, dtype=float))
    n = len(r)
    k = math.ceil((n + 1) * (1.0 - alpha / 2.0) - 1e-9)  # 1e-9: (n+1)*0.95 is an integer up to rounding
    if n == 0 or k > n:
        return -math.inf, math.inf
    return float(r[n - k]), float(r[k - 1])


@dataclass(frozen=True, slots=True, kw_only=True)
class FamilyInterval:
    n: int
    """Residuals the bounds come from."""
    lo_log: float
    hi_log: float
    levels: tuple[float, ...]
    """Quantile levels of `values`, increasing, from alpha / 2 to 1 - alpha / 2."""
    values: tuple[float, ...]
    """log(measured / predicted) at `levels` (the ends are `lo_log`, `hi_log`)."""

    def relative_width(self) -> float:
        """(hi - lo) / point of every interval this family gives."""
        return math.exp(self.hi_log) - math.exp(self.lo_log)


def family_interval(residuals: np.ndarray, alpha: float = ALPHA) -> FamilyInterval | None:
    """The interval of one family's residuals; None when too few residuals give a finite one."""
    lo, hi = conformal_bounds(residuals, alpha)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    inner = [float(v) for v in np.quantile(residuals, INNER_LEVELS)]
    values = [lo, *(min(max(v, lo), hi) for v in inner), hi]
    return FamilyInterval(n=len(residuals), lo_log=lo, hi_log=hi,
                          levels=(alpha / 2, *INNER_LEVELS, 1 - alpha / 2), values=tuple(values))


def balanced(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each GPU's residuals thinned to the same count m (the smallest GPU's): its order statistics at
    levels (i + 0.5) / m, so that every GPU weighs the same in the pooled quantiles (the GPU is the
    exchangeable unit a new GPU is drawn like; row counts differ 10x between GPUs)."""
    if not parts:
        return []
    m = min(len(p) for p in parts)
    levels = (np.arange(m) + 0.5) / m
    return [np.quantile(p, levels, method="inverted_cdf") if len(p) > m else np.asarray(p) for p in parts]


def fit_tier(residuals: Mapping[str, Sequence[np.ndarray]], alpha: float = ALPHA) -> dict[str, FamilyInterval]:
    """Family -> interval from the family's residual arrays (one per GPU, each thinned by `balanced`,
    then pooled), plus the `POOLED` entry over every family."""
    out: dict[str, FamilyInterval] = {}
    everything: list[np.ndarray] = []
    for fam, parts in sorted(residuals.items()):
        arrays = balanced([np.asarray(p, dtype=float) for p in parts if len(p)])
        if not arrays:
            continue
        pooled = np.concatenate(arrays)
        everything.append(pooled)
        fi = family_interval(pooled, alpha)
        if fi is not None:
            out[fam] = fi
    if everything:
        fi = family_interval(np.concatenate(everything), alpha)
        if fi is not None:
            out[POOLED] = fi
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class IntervalTable:
    tiers: dict[str, dict[str, FamilyInterval]]
    nominal: float = 1.0 - ALPHA
    method: str = METHOD
    produced_by: str = ""
    data_sha256: dict[str, str]

    def family(self, tier: str, family: str) -> FamilyInterval | None:
        """The family's interval in `tier`, else the tier's pooled one, else None."""
        t = self.tiers.get(tier, {})
        return t.get(family) or t.get(POOLED)

    def bounds(self, tier: str, families: np.ndarray, latency: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of point predictions `latency` whose families are `families` (object array);
        a tier without intervals gives lo = hi = latency."""
        lo_log = np.zeros(len(latency))
        hi_log = np.zeros(len(latency))
        for fam in np.unique(families.astype(str)) if len(families) else ():
            fi = self.family(tier, str(fam))
            if fi is not None:
                sel = families == fam
                lo_log[sel], hi_log[sel] = fi.lo_log, fi.hi_log
        return latency * np.exp(lo_log), latency * np.exp(hi_log)

    def to_json(self) -> dict[str, Any]:
        def fam_json(fi: FamilyInterval) -> dict[str, Any]:
            return {"n": fi.n, "lo_log": _round(fi.lo_log), "hi_log": _round(fi.hi_log), "levels": list(fi.levels),
                    "values": [_round(v) for v in fi.values]}
        return {"schema": SCHEMA, "nominal": self.nominal, "method": self.method, "produced_by": self.produced_by,
                "data_sha256": dict(sorted(self.data_sha256.items())),
                "tiers": {t: {f: fam_json(fi) for f, fi in sorted(fams.items())}
                          for t, fams in sorted(self.tiers.items())}}

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def _bad(path: Path, key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(source=str(path), key=key, value=value, rule=rule)


def load_intervals(path: Path) -> IntervalTable:
    data = read_json_object(path, "interval table")
    if set(data) != _TOP_KEYS:
        raise _bad(path, "<root>", sorted(set(data) ^ _TOP_KEYS), f"keys must be {sorted(_TOP_KEYS)}")
    if data["schema"] != SCHEMA:
        raise _bad(path, "schema", data["schema"], f"must be {SCHEMA}")
    tiers: dict[str, dict[str, FamilyInterval]] = {}
    if not isinstance(data["tiers"], dict):
        raise _bad(path, "tiers", data["tiers"], "must be an object")
    for tier, fams in data["tiers"].items():
        if tier not in TIERS or not isinstance(fams, dict):
            raise _bad(path, f"tiers.{tier}", tier, f"tier must be one of {', '.join(TIERS)} and hold an object")
        tiers[tier] = {}
        for fam, d in fams.items():
            key = f"tiers.{tier}.{fam}"
            if not isinstance(d, dict) or set(d) != _FAMILY_KEYS:
                raise _bad(path, key, d, f"must be an object with keys {sorted(_FAMILY_KEYS)}")
            try:
                levels = tuple(float(v) for v in d["levels"])
                values = tuple(float(v) for v in d["values"])
                fi = FamilyInterval(n=int(d["n"]), lo_log=float(d["lo_log"]), hi_log=float(d["hi_log"]),
                                    levels=levels, values=values)
            except (TypeError, ValueError) as exc:
                raise _bad(path, key, d, f"numbers expected ({exc})") from None
            if (len(levels) != len(values) or len(levels) < 2 or list(levels) != sorted(levels)
                    or list(values) != sorted(values) or not fi.lo_log <= fi.hi_log):
                raise _bad(path, key, d, "levels and values must be increasing, of one length, lo_log <= hi_log")
            tiers[tier][fam] = fi
    sha = data["data_sha256"]
    if not isinstance(sha, dict) or not all(isinstance(v, str) for v in sha.values()):
        raise _bad(path, "data_sha256", sha, "must map tables (aiconfigurator/<gpu>) to digests")
    return IntervalTable(tiers=tiers, nominal=float(data["nominal"]), method=str(data["method"]),
                         produced_by=str(data["produced_by"]), data_sha256=dict(sha))


def shipped_intervals() -> IntervalTable | None:
    """The interval table shipped in sim/data/calibration, None when absent."""
    path = Path(__file__).resolve().parent.parent / "data" / "calibration" / INTERVALS_FILE
    return load_intervals(path) if path.is_file() else None


def sample_log_factors(table: IntervalTable, tier: str, families: Sequence[str], rng: np.random.Generator
                       ) -> dict[str, float]:
    """One log latency factor per family, drawn from the family's residual distribution (the tier's
    pooled one for a family without its own) between its interval ends: inverse-CDF on the stored
    quantiles, the tails clamped to the ends. Families in sorted order, one uniform each, so the
    same generator state gives the same factors anywhere."""
    out: dict[str, float] = {}
    for fam in sorted(set(families)):
        u = float(rng.random())
        f = table.family(tier, fam)
        out[fam] = 0.0 if f is None else float(np.interp(u, f.levels, f.values))
    return out


def table_from_logo(residuals: Residuals, dev_gpus: Sequence[str], data_sha256: Mapping[str, str],
                    produced_by: str, alpha: float = ALPHA) -> IntervalTable:
    """The shipped table: every tier's intervals from all dev GPUs' leave-one-GPU-out residuals
    (GPUs outside `dev_gpus`, the evaluation GPU, never contribute)."""
    tiers: dict[str, dict[str, FamilyInterval]] = {}
    for tier in TIERS:
        pool: dict[str, list[np.ndarray]] = {}
        for g in dev_gpus:
            for fam, r in residuals.get(g, {}).get(tier, {}).items():
                pool.setdefault(fam, []).append(r)
        if pool:
            tiers[tier] = fit_tier(pool, alpha)
    return IntervalTable(tiers=tiers, produced_by=produced_by, nominal=1.0 - alpha,
                         data_sha256={f"aiconfigurator/{g}": s for g, s in data_sha256.items() if g in dev_gpus})


# -- coverage (leave-one-GPU-out, nested) -------------------------------------------------------

def nested_coverage(residuals: Residuals, dev_gpus: Sequence[str], alpha: float = ALPHA
                    ) -> list[dict[str, Any]]:
    """Per GPU, tier and family: empirical coverage and relative width of the intervals fitted on the
    OTHER dev GPUs' residuals (a GPU outside `dev_gpus` is scored with all dev GPUs' quantiles and
    never contributes to any quantile)."""
    out: list[dict[str, Any]] = []
    for gpu, tiers in residuals.items():
        others = [g for g in dev_gpus if g != gpu and g in residuals]
        for tier, fams in tiers.items():
            pool: dict[str, list[np.ndarray]] = {}
            for g in others:
                for fam, r in residuals[g].get(tier, {}).items():
                    pool.setdefault(fam, []).append(r)
            table = fit_tier(pool, alpha)
            for fam, r in sorted(fams.items()):
                fi = table.get(fam)
                if fi is None or len(r) == 0:
                    continue
                inside = (r >= fi.lo_log) & (r <= fi.hi_log)
                out.append({"gpu": gpu, "tier": tier, "family": fam, "rows": len(r), "n_quantile": fi.n,
                            "coverage": float(inside.mean()), "rel_width": fi.relative_width()})
    return out
