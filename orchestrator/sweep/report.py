"""The outcome of a sweep: best trials (Pareto front), counts, timings; as a table, JSON and files.

Best trials are those that ran, met every `[slo]` bound and are not dominated on the
objectives (for one objective: the top few). When no trial meets the SLOs, the report lists the
closest misses instead, ranked by total violation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from orchestrator.render import table
from orchestrator.sweep.objective import constraint_values, pareto_indices, relative_violations
from orchestrator.sweep.results import TrialResult, TrialStatus
from orchestrator.sweep.serving import POOL_PREFIX, SERVING_KEY, is_disaggregated
from orchestrator.sweep.spec import SweepSpec
from sim.errors import ConfigError
from sim.serde import apply_overrides, json_text
from sim.specs.catalog import read_toml

_TOP_SINGLE: Final = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialRecord:
    """One trial as the study holds it at the end."""

    number: int
    state: str
    """Optuna state name: COMPLETE, PRUNED, FAIL (RUNNING only if interrupted)."""
    values: tuple[float, ...] | None
    result: TrialResult | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DriverTimings:
    """Driver-side seconds spent this session, for the overhead benchmark."""

    ask_s: float = 0.0
    """study.ask() plus drawing the parameters."""
    build_s: float = 0.0
    """Building and hashing the trial's scenario (cache key)."""
    log_s: float = 0.0
    """MLflow logging of trials."""
    tell_s: float = 0.0
    """Trial attributes, constraints and study.tell()."""
    num_trials: int = 0
    """Trials finished by this session."""
    wall_s: float = 0.0

    def per_trial_ms(self) -> dict[str, float]:
        n = max(self.num_trials, 1)
        return {"ask_ms": self.ask_s / n * 1e3, "build_ms": self.build_s / n * 1e3,
                "log_ms": self.log_s / n * 1e3, "tell_ms": self.tell_s / n * 1e3,
                "overhead_ms": (self.ask_s + self.build_s + self.log_s + self.tell_s) / n * 1e3}


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepReport:
    spec: SweepSpec
    records: tuple[TrialRecord, ...]
    best: tuple[int, ...]
    """Trial numbers on the feasible Pareto front (or top trials), best first."""
    closest: tuple[int, ...] = ()
    """When nothing is feasible: the least-violating trials."""
    ties: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """Per best trial: other front trials with exactly the same objective values (often the same
    behaviour from settings that do not matter at this load)."""
    num_cache_hits: int = 0
    num_actor_restarts: int = 0
    num_resubmitted: int = 0
    num_reconciled: int = 0
    timings: DriverTimings = field(default_factory=DriverTimings)
    storage: str = ""
    tracking: Mapping[str, str] = field(default_factory=dict)
    commands: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    """Per best trial: `kernelsight run ...` and `vllm serve ...` lines."""

    def counts(self) -> dict[str, int]:
        by_status = Counter(r.result.status.value if r.result else r.state.lower() for r in self.records)
        return dict(sorted(by_status.items()))

    def record(self, number: int) -> TrialRecord:
        return next(r for r in self.records if r.number == number)

    def to_json(self) -> dict[str, Any]:
        spec = self.spec

        def trial_json(number: int) -> dict[str, Any]:
            rec = self.record(number)
            res = rec.result
            assert res is not None
            return {
                "number": number,
                "values": {o.metric: v for o, v in zip(spec.objectives, rec.values or (), strict=False)},
                "params": dict(res.params), "scenario_hash": res.scenario_hash,
                "metrics": {k: _finite(v) for k, v in res.metrics.items()},
                "slo_violation": {k: _finite(v) for k, v in constraint_values(res.metrics, spec.slo).items()},
                "same_values_trials": list(self.ties.get(number, ())),
                **dict(self.commands.get(number, {})),
            }

        return {
            "study": spec.name, "sampler": spec.sampler, "n_trials": len(self.records),
            "objectives": [{"metric": o.metric, "direction": o.direction} for o in spec.objectives],
            "counts": self.counts(), "best": [trial_json(n) for n in self.best],
            "closest_misses": [trial_json(n) for n in self.closest],
            "cache_hits": self.num_cache_hits, "actor_restarts": self.num_actor_restarts,
            "resubmitted_trials": self.num_resubmitted, "reconciled_trials": self.num_reconciled,
            "driver_ms_per_trial": self.timings.per_trial_ms(), "wall_s": self.timings.wall_s,
            "trials_finished_this_run": self.timings.num_trials, "storage": self.storage,
            "tracking": dict(self.tracking),
            **({"pruned": self.pruned()} if self.spec.search.enabled else {}),
        }

    def pruned(self) -> list[dict[str, int]]:
        """Trials the `[search]` pruner stopped, with the requests of the rung they stopped at."""
        return [{"number": r.number, "requests": r.result.fidelity_requests} for r in self.records
                if r.result is not None and r.result.status is TrialStatus.PRUNED]

    def render(self) -> str:
        spec = self.spec
        counts = ", ".join(f"{v} {k}" for k, v in self.counts().items())
        head = f"study {spec.name}: {len(self.records)} trials ({counts}), {self.num_cache_hits} answered from cache\n"
        shown, title = (self.best, "Pareto front" if len(spec.objectives) > 1 else "best trials")
        if not shown:
            shown, title = self.closest, "no trial met the [slo] bounds; closest misses"
        if not shown:
            return head + "no trial ran successfully\n"
        keys = list(dict.fromkeys(k for n in shown for k in (self.record(n).result or _EMPTY).params))
        objective_metrics = [o.metric for o in spec.objectives]
        slo_metrics = [b.metric for b in spec.slo if b.metric not in objective_metrics]
        headers = ["trial", *objective_metrics, *slo_metrics, *(_short_key(k) for k in keys), "ties"]
        rows = []
        for n in shown:
            res = self.record(n).result
            assert res is not None
            rows.append([n, *(_with_interval(res.metrics, m) for m in objective_metrics),
                         *(_with_interval(res.metrics, m) for m in slo_metrics),
                         *(_fmt(res.params.get(k, "-")) for k in keys),
                         f"+{len(self.ties[n])}" if self.ties.get(n) else ""])
        out = head + f"{title}:\n" + table(headers, rows)
        if spec.slo_confidence is not None:
            out += (f"\nvalue [lo, hi]: {spec.slo_confidence:.0%} interval from {spec.interval_runs} perturbed runs "
                    "per trial; an [slo] bound is met only at the interval's pessimistic end\n")
        first = self.commands.get(shown[0], {})
        if "vllm_serve" in first:
            out += f"\ntrial {shown[0]} as a vLLM server:\n  {_indent(first['vllm_serve'])}\n"
            if "vllm_serve_prefill" in first:
                out += "  # behind a proxy: vLLM's disaggregated proxy or Dynamo's frontend (docs/disaggregation.md)\n"
        if "sglang_launch" in first:
            out += f"as an SGLang server:\n  {_indent(first['sglang_launch'])}\n"
        if "dynamo_vllm" in first:
            out += f"with NVIDIA Dynamo (vLLM workers):\n  {_indent(first['dynamo_vllm'])}\n"
        if "checkpoint_note" in first:
            out += f"note: {first['checkpoint_note']}\n"
        return out


def _with_interval(metrics: Mapping[str, float], name: str) -> str:
    """`value`, or `value [lo, hi]` when the trial has an interval for it."""
    lo, hi = metrics.get(f"{name}_lo"), metrics.get(f"{name}_hi")
    if lo is None or hi is None:
        return _fmt(metrics[name])
    return f"{_fmt(metrics[name])} [{_fmt(lo)}, {_fmt(hi)}]"


_EMPTY = TrialResult(number=-1, status=TrialStatus.FAILED, params={})


def is_feasible(record: TrialRecord, spec: SweepSpec) -> bool:
    """The trial ran and met every `[slo]` bound."""
    res = record.result
    return (record.state == "COMPLETE" and record.values is not None and res is not None
            and all(v <= 0 for v in constraint_values(res.metrics, spec.slo).values()))


def total_violation(record: TrialRecord, spec: SweepSpec) -> float:
    """How far a trial misses the `[slo]`: its relative violations summed (`relative_violations`)."""
    res = record.result
    if res is None:
        return math.inf
    return sum(max(v, 0.0) for v in relative_violations(res.metrics, spec.slo).values())


@dataclass(frozen=True, slots=True, kw_only=True)
class Selection:
    best: tuple[int, ...]
    closest: tuple[int, ...]
    ties: dict[int, tuple[int, ...]]


def select_best(records: Sequence[TrialRecord], spec: SweepSpec) -> Selection:
    """The feasible front (or top few for one objective), one trial per distinct objective value
    vector (the lowest-numbered; the others are its ties); else the closest misses."""
    feasible = [r for r in records if is_feasible(r, spec)]
    sign = [1.0 if o.direction == "minimize" else -1.0 for o in spec.objectives]
    if not feasible:
        ran = [r for r in records if r.state == "COMPLETE" and r.values is not None and r.result is not None]
        misses = sorted(ran, key=lambda r: (total_violation(r, spec), r.number))
        return Selection(best=(), closest=tuple(r.number for r in misses[:_TOP_SINGLE]), ties={})
    groups: dict[tuple[float, ...], list[int]] = {}
    for r in sorted(feasible, key=lambda r: r.number):
        groups.setdefault(_values(r), []).append(r.number)
    points = list(groups)
    if len(spec.objectives) == 1:
        chosen = sorted(points, key=lambda p: sign[0] * p[0])[:_TOP_SINGLE]
    else:
        chosen = sorted((points[i] for i in pareto_indices(points, spec.objectives)), key=lambda p: sign[0] * p[0])
    return Selection(best=tuple(groups[p][0] for p in chosen), closest=(),
                     ties={groups[p][0]: tuple(groups[p][1:]) for p in chosen if len(groups[p]) > 1})


def _values(record: TrialRecord) -> tuple[float, ...]:
    assert record.values is not None
    return record.values


def report_files(report: SweepReport) -> dict[str, bytes]:
    """pareto_front.csv/.png, trials.csv and best_configs.json for the parent MLflow run."""
    from orchestrator.plot_style import axis_label, config_label
    from orchestrator.sweep.artifacts import pareto_png, table_csv

    spec = report.spec
    rows = [_row(r, spec) for r in report.records]
    front = set(report.best) | {n for tied in report.ties.values() for n in tied}
    files = {
        "trials.csv": table_csv(rows),
        "pareto_front.csv": table_csv([row for row, r in zip(rows, report.records, strict=True) if r.number in front]),
        "best_configs.json": json_text(report.to_json()["best"]).encode(),
    }
    ran = [r for r in report.records if r.state == "COMPLETE" and r.values is not None and r.result is not None]
    if ran:
        index = {r.number: i for i, r in enumerate(ran)}
        base_gpu = _base_hardware(spec)
        params = [r.result.params if r.result is not None else {} for r in ran]
        files["pareto_front.png"] = pareto_png(
            [_values(r) for r in ran], [is_feasible(r, spec) for r in ran],
            [index[n] for n in report.best if n in index],
            [axis_label(o.metric, o.direction) for o in spec.objectives],
            title=f"study {spec.name}: " + " vs ".join(o.metric for o in spec.objectives),
            gpus=[str(p["hardware.name"]) if "hardware.name" in p else base_gpu for p in params],
            modes=_serving_modes(spec, params),
            point_labels=[config_label(p) for p in params])
    return files


def _serving_modes(spec: SweepSpec, params: list[Mapping[str, Any]]) -> list[str] | None:
    """`aggregated` / `disaggregated` per plotted trial when the sweep compares the two, else None."""
    try:
        base = read_toml(Path(spec.base_scenario))
    except ConfigError:
        base = {}
    base = apply_overrides(base, spec.base_set)
    modes = ["disaggregated" if is_disaggregated(p, base) else "aggregated" for p in params]
    swept = any(p.key == SERVING_KEY or p.key.startswith(POOL_PREFIX) for p in spec.space)
    return modes if swept or "disaggregated" in modes else None


def _base_hardware(spec: SweepSpec) -> str | None:
    """The base scenario's GPU (for the colour of trials that do not vary `hardware.name`)."""
    if "hardware.name" in spec.base_set:
        return str(spec.base_set["hardware.name"])
    try:
        hardware = read_toml(Path(spec.base_scenario)).get("hardware", {})
    except ConfigError:
        return None
    name = hardware.get("name") if isinstance(hardware, dict) else None
    return name if isinstance(name, str) else None


def _row(r: TrialRecord, spec: SweepSpec) -> dict[str, Any]:
    res = r.result
    row: dict[str, Any] = {"trial": r.number, "state": r.state, "status": res.status.value if res else ""}
    for o, v in zip(spec.objectives, r.values or (), strict=False):
        row[o.metric] = v
    if res is not None:
        row.update({f"param.{k}": v for k, v in res.params.items()})
        row.update({k: v for k, v in res.metrics.items() if k not in row})
        row["scenario_hash"] = res.scenario_hash
        row["reason"] = res.reason.splitlines()[0] if res.reason else ""
        if res.status is TrialStatus.PRUNED:
            row["pruned_at_requests"] = res.fidelity_requests
    return row


def _short_key(key: str) -> str:
    """A column name: the key's last part, with the pool for pool keys (`prefill.num_workers`)."""
    parts = key.split(".")
    return f"{parts[1]}.{parts[-1]}" if parts[0] == "disaggregation" and len(parts) > 2 else parts[-1]


def _indent(lines: str) -> str:
    return lines.replace("\n", "\n  ")


def _fmt(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return str(value)


def _finite(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)
