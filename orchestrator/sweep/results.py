"""What travels between the driver and the actors: `TrialInput` out, `TrialResult` back.

A `TrialResult` is plain data (no simulator objects) so it pickles across Ray and round-trips
through the JSON user attribute the driver stores on each Optuna trial; that stored copy is what
a resumed sweep rebuilds its cache and late MLflow records from. Rendered artifacts (Parquet,
PNG bytes) travel with the result but are not stored in Optuna.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from orchestrator.sweep.spec import ParamValue
from sim.metrics.summary import KernelBreakdown as Breakdown

__all__ = ["Breakdown", "TrialInput", "TrialResult", "TrialStatus"]


class TrialStatus(StrEnum):
    OK = "ok"
    """Simulated; metrics are valid (the SLOs may or may not be met)."""
    INFEASIBLE = "infeasible"
    """Well-formed but cannot run: the model does not fit, or no room for one request's KV cache."""
    INVALID = "invalid"
    """The parameter combination breaks a scenario rule (e.g. TP does not divide the head count)."""
    FAILED = "failed"
    """The simulator raised, or the actor running it died too often."""
    PRUNED = "pruned"
    """Simulated on a prefix of the workload (`fidelity_requests`) and stopped there by the pruner
    (`[search]`); its metrics are the prefix's."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialInput:
    number: int
    """Optuna trial number."""
    params: Mapping[str, ParamValue]
    attempt: int = 1
    """1 on first submission; incremented each time the actor running it dies."""
    max_requests: int = 0
    """Simulate only the first this many requests of the workload (a fidelity rung); 0 for all."""
    interval_runs: int = 0
    """Perturbed runs for `<metric>_lo` / `_hi` (sweep `slo_confidence`); 0: point metrics only."""
    slo_confidence: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrialResult:
    number: int
    status: TrialStatus
    params: Mapping[str, ParamValue]
    scenario_hash: str = ""
    """Empty when the parameters did not even make a scenario (`INVALID`)."""
    sim_version: str = ""
    worst_provenance: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """`orchestrator.sweep.metrics` names; empty unless `OK`."""
    breakdown: Breakdown | None = None
    reason: str = ""
    """Why the trial is not `OK` (error message, memory shortfall, broken rule)."""
    duration_s: float = 0.0
    """Wall time of the evaluation in the actor."""
    cached_from: int | None = None
    """Trial number whose result answered this one (same scenario hash), if any."""
    artifacts: Mapping[str, bytes] = field(default_factory=dict)
    """Rendered files for the trial's MLflow run, by file name."""
    ray_node_id: str = ""
    """Ray node whose actor evaluated the trial (the answering trial's node when `cached_from` is set)."""
    fidelity_requests: int = 0
    """Requests simulated when the run covered only a prefix of the workload (a rung of a pruned
    search); 0 for the full workload."""
    rung_scores: Mapping[int, float] = field(default_factory=dict)
    """Requests of each rung this trial ran -> the score the pruner ranked it by (lower is better)."""

    def for_trial(self, number: int, params: Mapping[str, ParamValue]) -> TrialResult:
        """This result answering another trial with the same scenario, without the rendered files: they
        name this trial (the PNG's title), and the driver renders the other's."""
        source = self.cached_from if self.cached_from is not None else self.number
        return dataclasses.replace(self, number=number, params=dict(params), cached_from=source, duration_s=0.0,
                                   artifacts={})

    def to_attrs(self) -> dict[str, Any]:
        """JSON-compatible copy for an Optuna user attribute (artifacts left out)."""
        bd = self.breakdown
        return {
            "status": self.status.value, "scenario_hash": self.scenario_hash, "sim_version": self.sim_version,
            "worst_provenance": self.worst_provenance, "metrics": {k: _json_float(v) for k, v in self.metrics.items()},
            "breakdown": None if bd is None else {
                "seconds_by_kind": dict(bd.seconds_by_kind), "seconds_by_name": dict(bd.seconds_by_name),
                "host_s": bd.host_s, "launch_floor_s": bd.launch_floor_s},
            "reason": self.reason, "duration_s": self.duration_s, "cached_from": self.cached_from,
            "ray_node_id": self.ray_node_id,
            **({"fidelity_requests": self.fidelity_requests} if self.fidelity_requests else {}),
            **({"rung_scores": {str(k): _json_float(v) for k, v in self.rung_scores.items()}}
               if self.rung_scores else {}),
        }

    @classmethod
    def from_attrs(cls, number: int, params: Mapping[str, ParamValue], attrs: Mapping[str, Any]) -> TrialResult:
        bd = attrs.get("breakdown")
        return cls(
            number=number, status=TrialStatus(attrs["status"]), params=dict(params),
            scenario_hash=attrs.get("scenario_hash", ""), sim_version=attrs.get("sim_version", ""),
            worst_provenance=attrs.get("worst_provenance", ""),
            metrics={k: _from_json_float(v) for k, v in attrs.get("metrics", {}).items()},
            breakdown=None if bd is None else Breakdown(
                seconds_by_kind=dict(bd["seconds_by_kind"]), seconds_by_name=dict(bd["seconds_by_name"]),
                host_s=bd["host_s"], launch_floor_s=bd["launch_floor_s"]),
            reason=attrs.get("reason", ""), duration_s=attrs.get("duration_s", 0.0),
            cached_from=attrs.get("cached_from"), ray_node_id=attrs.get("ray_node_id", ""),
            fidelity_requests=attrs.get("fidelity_requests", 0),
            rung_scores={int(k): _from_json_float(v) for k, v in attrs.get("rung_scores", {}).items()},
        )


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


def _from_json_float(value: float | str) -> float:
    return float(value)
