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
"""Constraint set to `CONFIG_VIOLATION` on trials whose configuration cannot run (invalid combination or
no memory fit), 0 on the others."""
CONFIG_VIOLATION: Final = math.inf
"""Larger than any runnable trial's `relative_violations` sum, which is unbounded (TTFT 20 s against a
2 s bound is 9): TPE and NSGA-II rank infeasible trials by the sum of their positive constraints, so a
configuration that cannot run must sit below every one that ran (a trial with a NaN metric ties it)."""


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


def relative_violations(metrics: Mapping[str, float], slo: Sequence[BoundSpec]) -> dict[str, float]:
    """`constraint_values` in units of each bound ((value - bound) / |bound|; a bound of 0 as is): what
    Optuna is told and what ranks near misses. The sum over several bounds then weighs a TTFT in seconds,
    a throughput in tokens/s and a fraction alike (before 2026-12-04 the sum was of raw differences, so a
    trial 10x over a 1 s TTFT bound counted as closer than one 1% under a 1000 tokens/s floor, and a
    configuration that cannot run, told 1, ranked above any runnable trial more than 1 unit off)."""
    return {b.metric: max(_relative(b, metrics[m]) for m in (b.metric, f"{b.metric}_lo", f"{b.metric}_hi")
                          if m in metrics)
            for b in slo}


def _relative(bound: BoundSpec, value: float) -> float:
    """`BoundSpec.violation` with each side divided by the size of its own bound."""
    if value != value:  # NaN
        return math.inf
    over = (value - bound.max_value) / (abs(bound.max_value) or 1.0) if bound.max_value is not None else -math.inf
    under = (bound.min_value - value) / (abs(bound.min_value) or 1.0) if bound.min_value is not None else -math.inf
    return max(over, under)


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
