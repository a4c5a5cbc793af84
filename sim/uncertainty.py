"""End-to-end intervals: kernel uncertainty propagated through the simulator by seeded draws.

Each of K perturbed runs replays the same requests (same scenario seed) with every kernel family's
latency multiplied by one factor drawn from that family's leave-one-GPU-out residual distribution
(`sim.calibration.intervals`, tier the scenario's kernel model uses): a family's error is shared by
all its kernels in a run, as a GPU's systematic error is. Draw i of seed s uses the generator of
SeedSequence([s, 21, i]), families in sorted order, so the same seed gives the same factors (and
results) in any process. The interval of a metric is the pair of order statistics of the K perturbed
values that split-conformal uses at the table's level (k = ceil((K + 1)(1 - alpha / 2)), the range
when k >= K, i.e. K < 39 at 90%), widened to hold the point run. Then the end-to-end widening
(`sim.calibration.e2e_widening`, conformalized on the measured dev rows of `kernelsight validate`)
stretches it by a per-tier, per-metric-group factor for what the kernel draws do not cover (host,
scheduling, client protocol). Cost: K more simulations; the widening is free.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import numpy as np

from sim.api import last_arrival_s, scenario_efficiency, simulate
from sim.calibration.e2e_widening import E2EWidening, shipped_widening
from sim.calibration.intervals import IntervalTable, sample_log_factors, shipped_intervals
from sim.calibration.select import EfficiencyModels, shipped_calibration
from sim.engine.part_prices import PriceCache
from sim.engine.simulation import SimLimits
from sim.metrics.summary import SimSummary
from sim.perf.efficiency import EfficiencyModel
from sim.perf.perturbed import SIM_FAMILY, PerturbedEfficiency
from sim.perf.profile import EngineProfile
from sim.specs.scenario import Scenario

INTERVAL_METRICS: Final = (
    "ttft_mean_s", "ttft_median_s", "ttft_p90_s", "ttft_p99_s",
    "tpot_mean_s", "tpot_median_s", "tpot_p90_s", "tpot_p99_s",
    "e2el_mean_s", "e2el_p90_s",
    "request_throughput_per_s", "output_throughput_tokens_per_s", "total_token_throughput_tokens_per_s",
    "goodput_requests_per_s", "cost_per_million_output_tokens_usd",
)
"""SimSummary fields that get `<field>_lo` and `<field>_hi`."""
_STREAM: Final = 21
"""Second entry of the draws' seed sequence (keeps them apart from the workload's stream)."""


def kernel_tier(scenario: Scenario) -> str:
    """The tier whose residuals describe the scenario's kernel model ("auto" resolved as the selector
    does); a disaggregated scenario's is its pools' least measured one (roofline, then
    cross-generation, then target-measured)."""
    if scenario.disaggregation is not None:
        tiers = {_own_tier(pool.scenario) for pool in scenario.disaggregation.pools()}
        return next(t for t in ("roofline", "cross-generation", "target-measured", *sorted(tiers)) if t in tiers)
    return _own_tier(scenario)


def _own_tier(scenario: Scenario) -> str:
    tier = scenario.perf.tier
    if tier == "auto":
        found = scenario.perf.calibration is not None or shipped_calibration(scenario.hardware.name) is not None
        return "target-measured" if found else "cross-generation"
    return tier


def draw_log_factors(table: IntervalTable, tier: str, k: int, seed: int, sm_version: int | None = None,
                     uncorrected: frozenset[str] = frozenset()) -> list[dict[str, float]]:
    """K dicts family -> log latency factor on a GPU of `sm_version` (its architecture class's
    intervals; `uncorrected` families of a target-measured model draw from the cross-generation
    tier, `interval_tier`; draw i from SeedSequence([seed, 21, i]))."""
    fams = sorted(set(SIM_FAMILY.values()))
    return [sample_log_factors(table, tier, fams, np.random.default_rng(np.random.SeedSequence([seed, _STREAM, i])),
                               sm_version, uncorrected)
            for i in range(k)]


def uncorrected_families(model: EfficiencyModel) -> frozenset[str]:
    """The families `model` prices without a target-measured correction (none known: empty)."""
    families = getattr(model, "uncorrected_families", None)
    return families() if callable(families) else frozenset()


@dataclass(frozen=True, slots=True, kw_only=True)
class RunIntervals:
    k: int
    seed: int
    tier: str
    lo: dict[str, float | None]
    hi: dict[str, float | None]
    wall_s: float = 0.0
    samples: tuple[SimSummary, ...] = ()
    """The perturbed runs' summaries (for bounds on other metrics, see `bounds_of`)."""
    alpha: float = 0.1
    architecture: str | None = None
    """The architecture class whose residuals the draws came from (`IntervalTable.architecture`); a
    disaggregated run whose pools differ names both, prefill first (`seen-architecture / new-architecture`)."""
    e2e_log_widths: dict[str, float] = dataclasses.field(default_factory=dict)
    """Group -> end-to-end log width applied on top of the kernel draws (empty: kernel-only bounds)."""

    def fields(self) -> dict[str, float | None]:
        """{`<metric>_lo`: ..., `<metric>_hi`: ...} in `INTERVAL_METRICS` order."""
        out: dict[str, float | None] = {}
        for m in INTERVAL_METRICS:
            out[f"{m}_lo"] = self.lo.get(m)
            out[f"{m}_hi"] = self.hi.get(m)
        return out


def order_bounds(values: list[float], point: float, alpha: float) -> tuple[float, float]:
    """Conformal order statistics of `values` at level alpha (range when too few), holding `point`."""
    v = sorted(values)
    n = len(v)
    k = min(n, math.ceil((n + 1) * (1.0 - alpha / 2.0) - 1e-9))
    return min(v[n - k], point), max(v[k - 1], point)


def pool_scenarios(scenario: Scenario) -> list[Scenario]:
    """The scenarios whose kernel models a run prices with: the scenario, or its pools'."""
    if scenario.disaggregation is None:
        return [scenario]
    return [pool.scenario for pool in scenario.disaggregation.pools()]


class PerturbedModels:
    """The K perturbed models of one base model, built once: a sweep worker reuses them (and their
    priced parts in its `PriceCache`, whose key is the model object) across trials."""

    def __init__(self) -> None:
        self._models: dict[tuple[int, str, int, int, int | None],
                           tuple[EfficiencyModel, list[PerturbedEfficiency]]] = {}

    def get(self, base: EfficiencyModel, table: IntervalTable, tier: str, k: int, seed: int,
            sm_version: int | None = None) -> list[PerturbedEfficiency]:
        key = (id(base), tier, k, seed, sm_version)
        hit = self._models.get(key)
        if hit is not None and hit[0] is base:
            return hit[1]
        models = [PerturbedEfficiency(base, f)
                  for f in draw_log_factors(table, tier, k, seed, sm_version, uncorrected_families(base))]
        self._models[key] = (base, models)
        return models


def run_intervals(scenario: Scenario, point: SimSummary, k: int, *, seed: int | None = None,
                  table: IntervalTable | None = None, efficiency: EfficiencyModel | None = None,
                  profile: EngineProfile | None = None, limits: SimLimits | None = None,
                  prices: PriceCache | None = None, models: PerturbedModels | None = None,
                  progress: Callable[[int], None] | None = None, confidence: float | None = None,
                  widening: E2EWidening | None = None, kernel_only: bool = False,
                  efficiency_models: EfficiencyModels | None = None) -> RunIntervals:
    """Intervals of `INTERVAL_METRICS` around `point` (the unperturbed run of `scenario`) from K
    perturbed runs; seed defaults to the scenario's, confidence to the table's nominal level (the
    draws themselves always come from the table's central interval). No table or k = 0: lo = hi = point.
    `widening` defaults to the shipped end-to-end widening; `kernel_only` leaves it out. `efficiency`
    is the aggregated run's kernel model (a disaggregated run's pools select their own, through
    `efficiency_models` when given)."""
    start = time.perf_counter()
    seed = scenario.seed if seed is None else seed
    tier = kernel_tier(scenario)
    table = table if table is not None else shipped_intervals()
    samples: list[SimSummary] = []
    parts = pool_scenarios(scenario)
    if table is not None and k > 0 and all(kernel_tier(sc) in table.tiers for sc in parts):
        perturbed, drawn_from = models or PerturbedModels(), table
        if scenario.disaggregation is None:
            efficiency = efficiency or scenario_efficiency(scenario, profile, models=efficiency_models)
        else:
            efficiency = None
        # Each pool's own model (its hardware, tier and backend) is perturbed with draws from its
        # architecture class; the first model a pool selects is kept, so every draw wraps the same
        # object and the perturbed models (and their priced parts) are reused.
        bases: dict[int, EfficiencyModel] = {}

        def perturb(i: int) -> Callable[[EfficiencyModel, Scenario], EfficiencyModel]:
            def wrap(model: EfficiencyModel, sc: Scenario) -> EfficiencyModel:
                base = bases.setdefault(id(sc), model)
                return perturbed.get(base, drawn_from, kernel_tier(sc), k, seed, sc.hardware.sm_version)[i]
            return wrap

        for i in range(k):
            samples.append(simulate(scenario, efficiency=efficiency, profile=profile, limits=limits,
                                    prices=prices, efficiency_wrapper=perturb(i), models=efficiency_models).summary)
            if progress is not None:
                progress(len(samples))
    alpha = 1.0 - (confidence if confidence is not None else table.nominal if table is not None else 0.9)
    lo: dict[str, float | None] = {}
    hi: dict[str, float | None] = {}
    for m in INTERVAL_METRICS:
        p = getattr(point, m)
        vals = [getattr(s, m) for s in samples]
        if p is None or any(v is None for v in vals):
            lo[m] = hi[m] = p
            continue
        lo[m], hi[m] = order_bounds([float(v) for v in vals], float(p), alpha) if vals else (p, p)
    wide = None if kernel_only or not samples else (widening if widening is not None else shipped_widening())
    if wide is not None:
        for m in INTERVAL_METRICS:
            p, low, high = getattr(point, m), lo[m], hi[m]
            if p is not None and low is not None and high is not None:
                lo[m], hi[m] = wide.widen(tier, m, float(p), low, high)
    if wide is not None:
        _clamp_to_arrivals(lo, hi, point, last_arrival_s(scenario))
    widths = dict(wide.log_widths.get(tier, {})) if wide else {}
    # A disaggregated run whose pools are of two classes names both (prefill first).
    classes = [c for c in dict.fromkeys(table.architecture(kernel_tier(sc), sc.hardware.sm_version)
                                        for sc in parts) if c] if table else []
    return RunIntervals(k=len(samples), seed=seed, tier=tier, lo=lo, hi=hi, wall_s=time.perf_counter() - start,
                        samples=tuple(samples), alpha=alpha, architecture=" / ".join(classes) or None,
                        e2e_log_widths=widths)


RATE_METRICS: Final = ("request_throughput_per_s", "output_throughput_tokens_per_s",
                       "total_token_throughput_tokens_per_s", "goodput_requests_per_s")
"""Metrics that are counts over the run's duration (at most count / last arrival)."""


def _clamp_to_arrivals(lo: dict[str, float | None], hi: dict[str, float | None], point: SimSummary,
                       last_arrival: float) -> None:
    """Keep the widened ends possible: a run lasts at least until its last arrival, so each rate is
    at most its point value x point duration / last arrival (and cost per output token at least the
    point's / that factor). The end-to-end widening is fitted on saturated rows and would otherwise
    promise an arrival-bound run more throughput than is offered."""
    if not last_arrival > 0 or not point.duration_s > 0:
        return
    factor = max(1.0, point.duration_s / last_arrival)
    for m in RATE_METRICS:
        p, high = getattr(point, m), hi.get(m)
        if p is not None and high is not None:
            hi[m] = min(high, float(p) * factor)
    p, low = point.cost_per_million_output_tokens_usd, lo.get("cost_per_million_output_tokens_usd")
    if p is not None and low is not None and math.isfinite(p):
        lo["cost_per_million_output_tokens_usd"] = max(low, p / factor)


def bounds_of(point: Mapping[str, float], samples: list[Mapping[str, float]], alpha: float
              ) -> dict[str, float]:
    """`<name>_lo`, `<name>_hi` of every finite number in `point` from the same numbers of the
    perturbed runs (`order_bounds`); a value that is not finite in some run gets lo = hi = point."""
    out: dict[str, float] = {}
    for name, p in point.items():
        vals = [s.get(name, math.nan) for s in samples]
        if not samples or not math.isfinite(p) or not all(math.isfinite(v) for v in vals):
            out[f"{name}_lo"] = out[f"{name}_hi"] = p
            continue
        out[f"{name}_lo"], out[f"{name}_hi"] = order_bounds([float(v) for v in vals], float(p), alpha)
    return out


def interval_fields(summary: Mapping[str, object], intervals: RunIntervals) -> dict[str, object]:
    """`summary` with the interval fields added after the point fields."""
    return {**summary, **intervals.fields(), "intervals_k": intervals.k, "intervals_seed": intervals.seed,
            "intervals_e2e_log_widths": intervals.e2e_log_widths}
