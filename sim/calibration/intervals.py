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
"lo_log": x, "hi_log": x, "levels": [...], "values": [...]}}}, "seen_sm_versions": [int, ...]}; family
"all" pools every family of the tier (used for kinds no family's residuals cover). Loading rejects
unknown keys and wrong types.

Architecture classes (Mondrian conformal by GPU class): a fitted tier's error depends on whether the
target's architecture (SM version) is among the GPUs the model was fitted on. In leave-one-GPU-out
that splits the dev GPUs: h100_sxm and h200_sxm each have the other (`seen-architecture`); a100_sxm,
l40s and rtx_pro_6000_server have no other GPU of their SM version (`new-architecture`), like a
GPU nobody has measured. So the cross-generation and target-measured tiers also get one interval
table per class, `<tier>:seen-architecture` and `<tier>:new-architecture`, each from the residuals of
the dev GPUs of that class; a target is `seen-architecture` when its SM version is in
`seen_sm_versions` (the dev GPUs'), else `new-architecture`. The unstratified tier stays as the
fallback: a family without residuals in the class takes the tier's own interval for the family,
then the class's pooled one.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection, Mapping, Sequence
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
SEEN: Final = "seen-architecture"
NEW: Final = "new-architecture"
STRATIFIED_TIERS: Final = ("cross-generation", "target-measured")
"""Tiers whose intervals are also kept per architecture class (the fitted ones)."""
INTERVALS_FILE: Final = "intervals.json"
METHOD: Final = ("split-conformal on log(measured / predicted) residuals per tier and family; residuals "
                 "from leave-one-GPU-out predictions of the dev GPUs (cross-generation: model refitted "
                 "without the GPU; target-measured: correction fitted on the GPU's plan points, scored on "
                 "units the plan does not touch; roofline: no fit); b200_sxm never used; each tail at "
                 "the ceil((n+1)(1-alpha/2))-th order statistic; fitted tiers also per architecture class "
                 "(seen / new SM version: dev GPUs with / without another dev GPU of their SM version)")
_TOP_KEYS: Final = frozenset({"schema", "nominal", "method", "produced_by", "data_sha256", "tiers"})
_OPTIONAL_KEYS: Final = frozenset({"seen_sm_versions"})
_FAMILY_KEYS: Final = frozenset({"n", "lo_log", "hi_log", "levels", "values"})


Residuals = Mapping[str, Mapping[str, Mapping[str, np.ndarray]]]
"""GPU -> tier -> family -> log(measured / predicted) of that GPU's scored rows."""


def class_tier(tier: str, architecture: str) -> str:
    """The key of `tier`'s intervals for one architecture class (`SEEN` or `NEW`)."""
    return f"{tier}:{architecture}"


def architecture_class(sm_version: int | None, fitted_on: Sequence[int | None]) -> str:
    """`SEEN` when a GPU of this SM version is among those a model was fitted on, else `NEW`."""
    return SEEN if sm_version is not None and sm_version in fitted_on else NEW


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
    seen_sm_versions: tuple[int, ...] = ()
    """SM versions of the dev GPUs the shipped models are fitted on (empty: no classes)."""

    def architecture(self, tier: str, sm_version: int | None) -> str | None:
        """The architecture class (`SEEN` / `NEW`) whose table `tier` takes for a GPU of
        `sm_version` (a GPU with none, such as a non-NVIDIA part, is `NEW`: no dev GPU is of its
        kind); None where the unstratified tier serves (no class tables)."""
        if not self.seen_sm_versions:
            return None
        cls = architecture_class(sm_version, self.seen_sm_versions)
        return cls if class_tier(tier, cls) in self.tiers else None

    def family(self, tier: str, family: str, sm_version: int | None = None) -> FamilyInterval | None:
        """The family's interval in `tier` for a GPU of `sm_version` (its architecture class's table
        where there is one; None: the unstratified tier), else the class's pooled one, else the
        tier's pooled one, else None."""
        cls = self.architecture(tier, sm_version)
        return lookup(self.tiers.get(class_tier(tier, cls), {}) if cls else {}, self.tiers.get(tier, {}), family)

    def bounds(self, tier: str, families: np.ndarray, latency: np.ndarray, sm_version: int | None = None,
               uncorrected: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(lo, hi) of point predictions `latency` whose families are `families` (object array) on a
        GPU of `sm_version`; a tier without intervals gives lo = hi = latency. `uncorrected` (a row
        mask): target-measured rows the calibration did not correct, which take the cross-generation
        interval (`interval_tier`)."""
        lo_log = np.zeros(len(latency))
        hi_log = np.zeros(len(latency))
        plain = np.zeros(len(latency), dtype=bool) if uncorrected is None else np.asarray(uncorrected, dtype=bool)
        for fam in np.unique(families.astype(str)) if len(families) else ():
            for cross in (False, True):
                sel = (families == fam) & (plain == cross)
                if not sel.any():
                    continue
                fi = self.family(interval_tier(tier, str(fam), {str(fam)} if cross else ()), str(fam), sm_version)
                if fi is not None:
                    lo_log[sel], hi_log[sel] = fi.lo_log, fi.hi_log
        return latency * np.exp(lo_log), latency * np.exp(hi_log)

    def to_json(self) -> dict[str, Any]:
        def fam_json(fi: FamilyInterval) -> dict[str, Any]:
            return {"n": fi.n, "lo_log": _round(fi.lo_log), "hi_log": _round(fi.hi_log), "levels": list(fi.levels),
                    "values": [_round(v) for v in fi.values]}
        out: dict[str, Any] = {
            "schema": SCHEMA, "nominal": self.nominal, "method": self.method, "produced_by": self.produced_by,
            "data_sha256": dict(sorted(self.data_sha256.items())),
            "tiers": {t: {f: fam_json(fi) for f, fi in sorted(fams.items())} for t, fams in sorted(self.tiers.items())}}
        if self.seen_sm_versions:
            out["seen_sm_versions"] = list(self.seen_sm_versions)
        return out

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        os.replace(tmp, path)


def lookup(cls: Mapping[str, FamilyInterval], base: Mapping[str, FamilyInterval], family: str
           ) -> FamilyInterval | None:
    """A family's interval: the class table's, the tier's, the class's pooled, the tier's pooled."""
    return cls.get(family) or base.get(family) or cls.get(POOLED) or base.get(POOLED)


def _round(v: float) -> float:
    return float(f"{v:.6g}")


def _bad(path: Path, key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(source=str(path), key=key, value=value, rule=rule)


def load_intervals(path: Path) -> IntervalTable:
    data = read_json_object(path, "interval table")
    if not _TOP_KEYS <= set(data) <= _TOP_KEYS | _OPTIONAL_KEYS:
        raise _bad(path, "<root>", sorted((set(data) - _OPTIONAL_KEYS) ^ _TOP_KEYS),
                   f"keys must be {sorted(_TOP_KEYS)} (optional: {sorted(_OPTIONAL_KEYS)})")
    if data["schema"] != SCHEMA:
        raise _bad(path, "schema", data["schema"], f"must be {SCHEMA}")
    tiers: dict[str, dict[str, FamilyInterval]] = {}
    if not isinstance(data["tiers"], dict):
        raise _bad(path, "tiers", data["tiers"], "must be an object")
    for tier, fams in data["tiers"].items():
        base, _, cls = tier.partition(":")
        known = base in TIERS and (not cls or (base in STRATIFIED_TIERS and cls in (SEEN, NEW)))
        if not known or not isinstance(fams, dict):
            raise _bad(path, f"tiers.{tier}", tier, f"tier must be one of {', '.join(TIERS)} (fitted tiers also "
                       f"'<tier>:{SEEN}' / '<tier>:{NEW}') and hold an object")
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
    seen = data.get("seen_sm_versions", [])
    if not isinstance(seen, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in seen):
        raise _bad(path, "seen_sm_versions", seen, "must be a list of SM versions (integers)")
    return IntervalTable(tiers=tiers, nominal=float(data["nominal"]), method=str(data["method"]),
                         produced_by=str(data["produced_by"]), data_sha256=dict(sha), seen_sm_versions=tuple(seen))


def shipped_intervals() -> IntervalTable | None:
    """The interval table shipped in sim/data/calibration, None when absent."""
    path = Path(__file__).resolve().parent.parent / "data" / "calibration" / INTERVALS_FILE
    return load_intervals(path) if path.is_file() else None


def interval_tier(tier: str, family: str, uncorrected: Collection[str]) -> str:
    """The tier whose residuals describe a `tier` prediction of `family`: a target-measured
    prediction of a family the target's calibration does not correct (`uncorrected`; e.g. pointwise
    kernels on a GPU without pointwise tables) is the cross-generation one, so it takes that
    tier's interval; the target-measured residuals come from GPUs whose family was corrected."""
    return "cross-generation" if tier == "target-measured" and family in uncorrected else tier


def sample_log_factors(table: IntervalTable, tier: str, families: Sequence[str], rng: np.random.Generator,
                       sm_version: int | None = None, uncorrected: Collection[str] = ()) -> dict[str, float]:
    """One log latency factor per family, drawn from the family's residual distribution on a GPU of
    `sm_version` (`IntervalTable.family`, the tier `interval_tier` names) between its interval ends:
    inverse-CDF on the stored quantiles, the tails clamped to the ends. Families in sorted order,
    one uniform each, so the same generator state gives the same factors anywhere."""
    out: dict[str, float] = {}
    for fam in sorted(set(families)):
        u = float(rng.random())
        f = table.family(interval_tier(tier, fam, uncorrected), fam, sm_version)
        out[fam] = 0.0 if f is None else float(np.interp(u, f.levels, f.values))
    return out


def _classes(gpus: Sequence[str], dev_gpus: Sequence[str], architectures: Mapping[str, int | None] | None
             ) -> dict[str, str]:
    """Each GPU's architecture class in leave-one-GPU-out: whether another dev GPU shares its SM version."""
    if architectures is None:
        return {}
    return {g: architecture_class(architectures.get(g), [architectures.get(o) for o in dev_gpus if o != g])
            for g in gpus}


def _pools(residuals: Residuals, gpus: Sequence[str], tier: str) -> dict[str, list[np.ndarray]]:
    pool: dict[str, list[np.ndarray]] = {}
    for g in gpus:
        for fam, r in residuals.get(g, {}).get(tier, {}).items():
            pool.setdefault(fam, []).append(r)
    return pool


def table_from_logo(residuals: Residuals, dev_gpus: Sequence[str], data_sha256: Mapping[str, str],
                    produced_by: str, alpha: float = ALPHA,
                    architectures: Mapping[str, int | None] | None = None) -> IntervalTable:
    """The shipped table: every tier's intervals from all dev GPUs' leave-one-GPU-out residuals
    (GPUs outside `dev_gpus`, the evaluation GPU, never contribute); with `architectures` (GPU ->
    SM version) the fitted tiers also per architecture class."""
    tiers: dict[str, dict[str, FamilyInterval]] = {}
    classes = _classes(dev_gpus, dev_gpus, architectures)
    for tier in TIERS:
        pool = _pools(residuals, dev_gpus, tier)
        if pool:
            tiers[tier] = fit_tier(pool, alpha)
        if tier in STRATIFIED_TIERS:
            for cls in (SEEN, NEW):
                members = [g for g in dev_gpus if classes.get(g) == cls]
                pool = _pools(residuals, members, tier)
                if pool:
                    tiers[class_tier(tier, cls)] = fit_tier(pool, alpha)
    seen = tuple(sorted({v for g in dev_gpus if (v := (architectures or {}).get(g)) is not None}))
    return IntervalTable(tiers=tiers, produced_by=produced_by, nominal=1.0 - alpha, seen_sm_versions=seen,
                         data_sha256={**{f"aiconfigurator/{g}": s for g, s in data_sha256.items() if g in dev_gpus},
                                      **{k: s for k, s in data_sha256.items() if "/" in k}})  # e.g. Vidur's table


# -- coverage (leave-one-GPU-out, nested) -------------------------------------------------------

def nested_coverage(residuals: Residuals, dev_gpus: Sequence[str], alpha: float = ALPHA,
                    architectures: Mapping[str, int | None] | None = None) -> list[dict[str, Any]]:
    """Per GPU, tier and family: empirical coverage and relative width of the intervals fitted on the
    OTHER dev GPUs' residuals (a GPU outside `dev_gpus` is scored with all dev GPUs' quantiles and
    never contributes to any quantile). With `architectures` (GPU -> SM version) a fitted tier's
    interval comes from the other dev GPUs of the GPU's architecture class (`table_from_logo`),
    with the same fallbacks as `IntervalTable.family`; each row says the class."""
    out: list[dict[str, Any]] = []
    classes = _classes(list(residuals), dev_gpus, architectures)
    for gpu, tiers in residuals.items():
        others = [g for g in dev_gpus if g != gpu and g in residuals]
        for tier, fams in tiers.items():
            table = fit_tier(_pools(residuals, others, tier), alpha)
            cls = classes.get(gpu, "") if tier in STRATIFIED_TIERS else ""
            by_class = fit_tier(_pools(residuals, [g for g in others if classes.get(g) == cls], tier), alpha) \
                if cls else {}
            for fam, r in sorted(fams.items()):
                fi = lookup(by_class, table, fam)
                if fi is None or len(r) == 0:
                    continue
                inside = (r >= fi.lo_log) & (r <= fi.hi_log)
                out.append({"gpu": gpu, "tier": tier, "family": fam, "rows": len(r), "n_quantile": fi.n,
                            "coverage": float(inside.mean()), "rel_width": fi.relative_width(),
                            "architecture": cls})
    return out
