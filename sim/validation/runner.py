"""Simulate one validation row under one kernel-model tier and predict what was measured."""

from __future__ import annotations

import csv
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sim.api import simulate
from sim.calibration.select import EfficiencyModels, shipped_calibration
from sim.engine.part_prices import PriceCache
from sim.errors import ConfigError
from sim.metrics.summary import SimSummary
from sim.perf.profile import EngineProfile
from sim.specs.scenario import scenario_from_dict
from sim.uncertainty import PerturbedModels, bounds_of, run_intervals
from sim.validation.rows import Replay, ValidationRow

Tier = Literal["cross-generation", "target-measured"]
TIERS: tuple[Tier, ...] = ("cross-generation", "target-measured")
Status = Literal["scored", "skipped", "failed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RowResult:
    row_id: str
    tier: str
    status: Status
    predicted: Mapping[str, float] = field(default_factory=dict)
    reason: str | None = None
    wall_s: float = 0.0
    num_steps: int = 0
    time_share: Mapping[str, float] = field(default_factory=dict)
    """Share of simulated busy time by kernel kind, plus `host` and `launch_floor`."""
    num_preemptions: int = 0
    kv_usage_max_frac: float = 0.0
    worst_provenance: str = ""
    bounds: Mapping[str, float] = field(default_factory=dict)
    """`<metric>_lo` / `<metric>_hi` of each predicted metric from `interval_runs` perturbed runs
    (`validate --intervals K`, sim.uncertainty); empty without them."""
    interval_runs: int = 0
    same_simulation_as: str | None = None
    """The row whose simulation this result repeats (`ValidationRow.simulation_key`: the same scenario
    and replay, so the same results); `wall_s` is then 0: nothing was simulated for this row."""


def tier_skip_reason(row: ValidationRow, tier: Tier) -> str | None:
    if row.skip_reason is not None:
        return row.skip_reason
    if tier == "target-measured" and shipped_calibration(row.hardware) is None:
        return f"no target-measured calibration ships for {row.hardware}"
    return None


def scenario_sections(row: ValidationRow, tier: Tier, work_dir: Path) -> dict[str, Any]:
    """The row's scenario dict for `tier`; a trace row's requests are written under `work_dir`."""
    assert row.sections is not None and row.replay is not None
    sections = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in row.sections.items()}
    sections["perf"] = {"tier": tier}
    if row.replay.kind == "trace":
        path = work_dir / (re.sub(r"[^A-Za-z0-9_.-]+", "_", row.row_id) + ".csv")
        write_trace(path, row.replay)
        sections["workload"] = {**sections["workload"], "dataset_path": str(path)}
    return sections


def write_trace(path: Path, replay: Replay) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "input_tokens", "output_tokens"])
        for t in replay.trace:
            w.writerow([repr(t.arrival_s), t.input_tokens, t.output_tokens])


def evaluate_row(row: ValidationRow, tier: Tier, work_dir: Path, *,
                 profile: EngineProfile | None = None, models: EfficiencyModels | None = None,
                 prices: PriceCache | None = None, intervals: int = 0,
                 perturbed: PerturbedModels | None = None) -> RowResult:
    """Simulate `row` with the `tier` kernel model; `profile` overrides the backend's shipped profile.

    `models` and `prices` are a long-lived caller's kernel models and priced step parts (a validate
    worker's, shared by the rows it simulates of the same hardware, model, precision, layout and
    tier): the same results as building and pricing them afresh for each row, at less cost.
    `intervals` > 0: also the nominal 90% intervals of the predicted metrics from that many perturbed
    runs (`sim.uncertainty.run_intervals`: the perturbation wraps the row's kernel model, or each
    pool's in a disaggregated row);
    `perturbed` keeps the perturbed models across a worker's rows, so `prices` serves them too."""
    reason = tier_skip_reason(row, tier)
    if reason is not None:
        return RowResult(row_id=row.row_id, tier=tier, status="skipped", reason=reason)
    assert row.replay is not None
    start = time.perf_counter()
    try:
        scenario = scenario_from_dict(scenario_sections(row, tier, work_dir), source=row.row_id)
        # The row (or each pool of a disaggregated row) selects its kernel model through `models`.
        result = simulate(scenario, profile=profile, prices=prices, models=models)
    except ConfigError as exc:
        return RowResult(row_id=row.row_id, tier=tier, status="skipped", reason=f"{exc.key}={exc.value}: {exc.rule}")
    s = result.summary
    predicted = _predicted(row.replay, s)
    status: Status = "scored" if all(math.isfinite(v) for v in predicted.values()) else "failed"
    bounds: dict[str, float] = {}
    runs = 0
    if intervals > 0 and status == "scored":
        iv = run_intervals(scenario, s, intervals, profile=profile, prices=prices, models=perturbed,
                           efficiency_models=models)
        bounds = bounds_of(predicted, [_predicted(row.replay, x) for x in iv.samples], iv.alpha)
        runs = iv.k
    return RowResult(
        row_id=row.row_id, tier=tier, status=status, predicted=predicted,
        reason=None if status == "scored" else "simulation produced no finished requests",
        wall_s=time.perf_counter() - start, num_steps=s.num_steps, time_share=result.breakdown.share_by_kind(),
        num_preemptions=s.num_preemptions, kv_usage_max_frac=s.kv_usage_max_frac,
        worst_provenance=s.worst_provenance, bounds=bounds, interval_runs=runs,
    )


def _predicted(replay: Replay, s: SimSummary) -> dict[str, float]:
    """What the row measured, from the simulated run's summary (plus output throughput for reference)."""
    out = {"output_throughput_tokens_per_s": s.output_throughput_tokens_per_s}
    if replay.kind == "trace":
        out.update({f"{m}_{q}_s": float(getattr(s, f"{m}_{q}_s")) for m in ("ttft", "tpot", "e2el")
                    for q in ("mean", "median", "p90")})
    elif replay.kind in ("closed_loop", "single_request"):
        out.update(ttft_mean_s=s.ttft_mean_s, tpot_mean_s=s.tpot_mean_s)
    if replay.kind == "single_request":
        del out["tpot_mean_s"]
    return out
