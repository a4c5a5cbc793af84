"""Sweep specifications as values: objectives, `[slo]` bounds, `[space]` parameters, capacity targets.

`orchestrator.sweep.parse.load_sweep` builds a `SweepSpec` from a sweep TOML file (format in
docs/sweep.md) and validates everything before any trial runs. No Ray, Optuna or MLflow import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from sim.errors import ConfigError
from sim.serde import config_hash
from sim.specs.scenario import Scenario, load_scenario_file

SamplerName = Literal["tpe", "nsga2", "grid", "random"]
Direction = Literal["minimize", "maximize"]
ParamKind = Literal["categorical", "int", "float"]
ParamValue = bool | int | float | str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectiveSpec:
    metric: str
    """A name from `orchestrator.sweep.metrics.METRIC_NAMES`."""
    direction: Direction


@dataclass(frozen=True, slots=True, kw_only=True)
class BoundSpec:
    """One `[slo]` bound on a trial metric; a trial meets it when `violation(value) <= 0`."""

    metric: str
    max_value: float | None = None
    min_value: float | None = None

    def violation(self, value: float) -> float:
        """How far `value` is outside the bound (0 or less inside); NaN counts as infinitely far."""
        if value != value:  # NaN
            return float("inf")
        over = value - self.max_value if self.max_value is not None else float("-inf")
        under = self.min_value - value if self.min_value is not None else float("-inf")
        return max(over, under)


@dataclass(frozen=True, slots=True, kw_only=True)
class Condition:
    """`when = { key = value }`: active only if the earlier parameter `key` took one of `values`."""

    key: str
    values: tuple[ParamValue, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamSpec:
    """One `[space]` entry: a dotted scenario key and the values a trial may give it."""

    key: str
    kind: ParamKind
    choices: tuple[ParamValue, ...] = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    when: tuple[Condition, ...] = ()

    def admits(self, value: ParamValue) -> bool:
        """Whether a trial could give this parameter `value`."""
        if self.kind == "categorical":
            return any(value == c and type(value) is type(c) for c in self.choices)
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False
        assert self.low is not None and self.high is not None
        return self.low <= value <= self.high and (self.kind == "float" or isinstance(value, int))

    def grid_values(self) -> tuple[ParamValue, ...]:
        """All values of this parameter for the grid sampler."""
        if self.kind == "categorical":
            return self.choices
        assert self.low is not None and self.high is not None and self.step is not None
        count = round((self.high - self.low) / self.step) + 1
        if self.kind == "int":
            return tuple(int(self.low) + i * int(self.step) for i in range(count))
        return tuple(self.low + i * self.step for i in range(count))


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacitySpec:
    """`[capacity]`: find the cheapest fleet that serves `target_request_rate` within `[slo]`."""

    target_request_rate: float
    """Requests per second the whole fleet must serve."""
    rate_rel_tol: float = 0.05
    """Bisection stops when the bracket on one replica's capacity is narrower than this fraction."""
    min_rate_per_replica: float = 0.05
    """Lowest per-replica rate tried; a configuration that misses the SLOs here is rejected."""
    max_replicas: int = 256
    verify_fleet: bool = True
    """Simulate the chosen fleet at the target rate to confirm the per-replica answer."""


PrunerName = Literal["none", "successive_halving", "hyperband"]
SLO_PRUNING_METRIC = "slo"
"""`search.pruning_metric` value that ranks trials by their relative `[slo]` violation at a rung."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpec:
    """`[search]`: multi-fidelity search. A trial runs first on a prefix of the workload (the first
    `min_fidelity_requests` requests), then on `reduction_factor` times more, up to the full workload,
    and Optuna's pruner stops the ones that rank poorly at a rung. Off (`pruner = "none"`) by default."""

    pruner: PrunerName = "none"
    min_fidelity_requests: int = 0
    """Requests of the first rung; 0 with the pruner off."""
    reduction_factor: int = 3
    pruning_metric: str = SLO_PRUNING_METRIC
    """What a rung ranks: `slo` (relative `[slo]` violation; trials meeting every bound tie for best) or a
    trial metric, read in its objective's direction (minimised if it is no objective); a trial that misses
    an `[slo]` bound at the rung ranks last."""

    @property
    def enabled(self) -> bool:
        return self.pruner != "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSpec:
    source: str
    """The sweep file."""
    name: str
    sampler: SamplerName
    n_trials: int
    seed: int
    objectives: tuple[ObjectiveSpec, ...]
    slo: tuple[BoundSpec, ...]
    base_scenario: str
    """Absolute path of the base scenario TOML."""
    base_set: Mapping[str, Any] = field(default_factory=dict)
    space: tuple[ParamSpec, ...]
    sampler_options: Mapping[str, Any] = field(default_factory=dict)
    capacity: CapacitySpec | None = None
    search: SearchSpec = field(default_factory=SearchSpec)
    text: str = ""
    """The sweep file's text, logged with the study."""
    slo_confidence: float | None = None
    """`[study] slo_confidence`: each trial gets intervals at this level and meets an `[slo]` bound only
    at the interval's pessimistic end (None: point metrics)."""
    interval_runs: int = 8
    """`[study] interval_runs`: perturbed simulations per trial when `slo_confidence` is set."""

    def trial_interval_runs(self) -> int:
        """Perturbed runs each trial makes (0 unless `slo_confidence` is set)."""
        return self.interval_runs if self.slo_confidence is not None else 0

    def load_base(self) -> Scenario:
        """The base scenario with `[base] set` applied (not checked for memory fit)."""
        try:
            return load_scenario_file(self.base_scenario, self.base_set)
        except ConfigError as exc:
            if exc.key in self.base_set:
                raise ConfigError(source=self.source, key=f'base.set."{exc.key}"', value=exc.value,
                                  rule=exc.rule) from None
            raise

    def identity(self, base: Scenario) -> str:
        """Hash of what the trials' results depend on: everything but `n_trials` and the file text, plus
        the simulator version (a new release may price the same scenario differently)."""
        from sim import api

        return config_hash({
            "sim_version": api.__version__,
            "name": self.name, "sampler": self.sampler, "seed": self.seed, "objectives": self.objectives,
            "slo": self.slo, "space": self.space, "sampler_options": dict(self.sampler_options),
            "capacity": self.capacity, "base": base.scenario_hash(),
            # only when on, so the identity of every study made before [search] existed is unchanged
            **({"search": self.search} if self.search.enabled else {}),
            # only when set, so that the identity of a sweep without intervals is unchanged
            **({"slo_confidence": self.slo_confidence, "interval_runs": self.interval_runs}
               if self.slo_confidence is not None else {}),
        })

    def param(self, key: str) -> ParamSpec:
        return next(p for p in self.space if p.key == key)
