"""Absolute percentage errors per row and their median / p90 per suite x tier x source.

APE = |predicted - measured| / measured. The headline metric of a row is its mean TTFT, mean
TPOT or output throughput (`rows.HEADLINE_METRICS`); trace rows also score median and p90
latencies (`DISTRIBUTION_METRICS`), reported in their own table. Signed error (predicted /
measured - 1) is kept so a bias shows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sim.calibration.e2e_widening import E2EWidening
from sim.validation.rows import HEADLINE_METRICS, ValidationRow
from sim.validation.runner import RowResult

DISTRIBUTION_METRICS = tuple(f"{m}_{q}_s" for m in ("ttft", "tpot", "e2el") for q in ("mean", "median", "p90"))


def ape(predicted: float, measured: float) -> float:
    if not (math.isfinite(predicted) and math.isfinite(measured)) or measured <= 0:
        return math.nan
    return abs(predicted - measured) / measured


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricStats:
    n: int
    median_ape: float
    p90_ape: float
    median_signed: float
    """Median of predicted / measured - 1 (positive: the simulator predicts too high)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupScore:
    suite: str
    tier: str
    source: str
    rows_scored: int
    rows_skipped: int
    rows_deferred: int
    rows_failed: int
    metrics: Mapping[str, MetricStats]
    """Keyed by headline name: ttft, tpot, throughput."""


def metric_stats(pairs: Sequence[tuple[float, float]]) -> MetricStats:
    """Stats over (predicted, measured) pairs with finite values."""
    good = [(p, m) for p, m in pairs if math.isfinite(p) and math.isfinite(m) and m > 0]
    if not good:
        return MetricStats(n=0, median_ape=math.nan, p90_ape=math.nan, median_signed=math.nan)
    pred = np.array([p for p, _ in good])
    meas = np.array([m for _, m in good])
    errs = np.abs(pred - meas) / meas
    return MetricStats(n=len(good), median_ape=float(np.median(errs)), p90_ape=float(np.percentile(errs, 90)),
                       median_signed=float(np.median(pred / meas - 1)))


def score_groups(rows: Iterable[ValidationRow], results: Iterable[RowResult], *, tiers: Sequence[str],
                 deferred: Mapping[str, str]) -> list[GroupScore]:
    """One `GroupScore` per (suite, tier, source) that has rows, plus `all` sources per suite x tier."""
    by_id = {r.row_id: r for r in rows}
    res = {(r.row_id, r.tier): r for r in results}
    groups: dict[tuple[str, str, str], list[tuple[ValidationRow, RowResult | None]]] = {}
    for row in by_id.values():
        for tier in tiers:
            item = (row, res.get((row.row_id, tier)))
            groups.setdefault((row.suite, tier, row.source), []).append(item)
            groups.setdefault((row.suite, tier, "all"), []).append(item)
    out: list[GroupScore] = []
    for (suite, tier, source), items in sorted(groups.items()):
        scored = [(row, r) for row, r in items if r is not None and r.status == "scored"]
        metrics = {}
        for name, key in HEADLINE_METRICS.items():
            pairs = [(r.predicted[key], row.measured[key]) for row, r in scored
                     if key in row.measured and key in r.predicted]
            if pairs:
                metrics[name] = metric_stats(pairs)
        out.append(GroupScore(
            suite=suite, tier=tier, source=source, rows_scored=len(scored),
            rows_skipped=sum(1 for row, r in items if (r is not None and r.status == "skipped")
                             or (r is None and row.skipped)),
            rows_deferred=sum(1 for row, r in items if r is None and row.row_id in deferred),
            rows_failed=sum(1 for _, r in items if r is not None and r.status == "failed"),
            metrics=metrics))
    return out


def interval_coverage(rows: Iterable[ValidationRow], results: Iterable[RowResult],
                      widening: E2EWidening | None = None) -> list[dict[str, object]]:
    """Per suite x tier x headline metric, over scored rows with intervals (`validate --intervals K`):
    rows, the share whose measured value lies in [lo, hi], and the mean of (hi - lo) / predicted; with
    `widening`, the same for the end-to-end widened bounds (`coverage_e2e`, `mean_rel_width_e2e`)."""
    cells: dict[tuple[str, str, str], list[tuple[bool, float, bool, float]]] = {}
    for suite, tier, name, point, meas, lo, hi in interval_samples(rows, results):
        wlo, whi = widening.widen(tier, name, point, lo, hi) if widening else (lo, hi)
        cells.setdefault((suite, tier, name), []).append(
            (lo <= meas <= hi, (hi - lo) / point, wlo <= meas <= whi, (whi - wlo) / point))
    out: list[dict[str, object]] = []
    for (suite, tier, metric), v in sorted(cells.items()):
        cell: dict[str, object] = {"suite": suite, "tier": tier, "metric": metric, "rows": len(v),
                                   "coverage": sum(c[0] for c in v) / len(v),
                                   "mean_rel_width": sum(c[1] for c in v) / len(v)}
        if widening is not None:
            cell.update(coverage_e2e=sum(c[2] for c in v) / len(v), mean_rel_width_e2e=sum(c[3] for c in v) / len(v))
        out.append(cell)
    return out


def interval_samples(rows: Iterable[ValidationRow], results: Iterable[RowResult]
                     ) -> list[tuple[str, str, str, float, float, float, float]]:
    """(suite, tier, headline metric, predicted, measured, lo, hi) of every scored row with kernel-only
    bounds; a disaggregated row's suite is `<suite> (disaggregated)`, so its coverage is reported on its
    own and the end-to-end widening (fitted on suite "dev") stays an aggregated-serving fit."""
    by_id = {r.row_id: r for r in rows}
    out: list[tuple[str, str, str, float, float, float, float]] = []
    for res in results:
        row = by_id.get(res.row_id)
        if row is None or res.status != "scored" or not res.bounds:
            continue
        for name, key in HEADLINE_METRICS.items():
            values = (res.predicted.get(key), row.measured.get(key), res.bounds.get(f"{key}_lo"),
                      res.bounds.get(f"{key}_hi"))
            if any(v is None or not math.isfinite(v) for v in values):
                continue
            point, meas, lo, hi = (float(v or 0.0) for v in values)
            suite = f"{row.suite} (disaggregated)" if row.disaggregated else row.suite
            out.append((suite, res.tier, name, point, meas, lo, hi))
    return out
