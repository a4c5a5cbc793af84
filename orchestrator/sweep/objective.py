"""Objective values and SLO constraint values of a trial, from its metrics and the sweep spec.

Constraint values follow Optuna's convention: a trial is feasible when every value is <= 0.
A metric that is NaN (for example TPOT when no request produced two tokens) violates its bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from orchestrator.sweep.spec import BoundSpec, ObjectiveSpec

CONFIG_CONSTRAINT: Final = "config_runs"
"""Constraint set to 1 on trials whose configuration cannot run (invalid combination or no memory fit)."""


def objective_values(metrics: Mapping[str, float], objectives: Sequence[ObjectiveSpec]) -> list[float] | None:
    """The objective values in spec order, or None when one is NaN (nothing to rank)."""
    values = [metrics[o.metric] for o in objectives]
    return None if any(math.isnan(v) for v in values) else values


def constraint_values(metrics: Mapping[str, float], slo: Sequence[BoundSpec]) -> dict[str, float]:
    """Violation per `[slo]` metric: <= 0 when met. A trial evaluated with intervals (sweep
    `slo_confidence`: metrics `<name>_lo`, `<name>_hi`) is judged at the interval's pessimistic end
    (the upper end of a maximum, the lower end of a minimum)."""
    return {b.metric: max(b.violation(metrics[m]) for m in (b.metric, f"{b.metric}_lo", f"{b.metric}_hi")
                          if m in metrics)
            for b in slo}


def meets_slo(metrics: Mapping[str, float], slo: Sequence[BoundSpec]) -> bool:
    return all(v <= 0 for v in constraint_values(metrics, slo).values())


def dominates(a: Sequence[float], b: Sequence[float], signs: Sequence[float]) -> bool:
    """`a` is at least as good as `b` everywhere and better somewhere (signs: +1 minimise, -1 maximise)."""
    better = False
    for x, y, s in zip(a, b, signs, strict=True):
        if s * x > s * y:
            return False
        if s * x < s * y:
            better = True
    return better


def pareto_indices(points: Sequence[Sequence[float]], objectives: Sequence[ObjectiveSpec]) -> list[int]:
    """Indices of the non-dominated points; for one objective, all points tied for the best value."""
    signs = [1.0 if o.direction == "minimize" else -1.0 for o in objectives]
    return [i for i, p in enumerate(points) if not any(dominates(q, p, signs) for q in points)]
