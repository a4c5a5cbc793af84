"""One trial, start to finish: parameters -> scenario -> simulation -> `TrialResult`.

Runs inside a Ray actor (`actors.SimShard`) and, for tests and benchmarks, in-process. Every
simulator exception becomes a result (`INFEASIBLE`, `INVALID` or `FAILED` with its message), so
only infrastructure failures (a dead actor) ever reach the driver.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Mapping
from dataclasses import replace

from orchestrator.sweep.metrics import autoscaling_metrics, interval_metrics, trial_metrics
from orchestrator.sweep.results import Breakdown, TrialInput, TrialResult, TrialStatus
from orchestrator.sweep.serving import scenario_overrides
from orchestrator.sweep.spec import ParamValue
from sim.api import __version__ as sim_version
from sim.api import simulate
from sim.calibration.select import EfficiencyModels
from sim.engine.part_prices import PriceCache
from sim.errors import ConfigError, InfeasibleScenario
from sim.metrics.summary import SimSummary
from sim.specs.scenario import Scenario
from sim.uncertainty import PerturbedModels, run_intervals


def build_scenario(base: Scenario, params: Mapping[str, ParamValue]) -> Scenario:
    """The base with the trial's parameters applied (the `serving` switch resolved,
    `orchestrator.sweep.serving`); raises `ConfigError` for a broken combination."""
    return base.with_overrides(scenario_overrides(params, base.sections()))


def invalid_result(number: int, params: Mapping[str, ParamValue], exc: ConfigError) -> TrialResult:
    return TrialResult(number=number, status=TrialStatus.INVALID, params=dict(params),
                       reason=f"{exc.key}={exc.value!r}: {exc.rule}", sim_version=sim_version)


class TrialEvaluator:
    """Evaluates trials against one base scenario; `render_artifacts` adds the breakdown files."""

    def __init__(self, base: Scenario, *, render_artifacts: bool = True) -> None:
        self._base = base
        self._render = render_artifacts
        self._models = EfficiencyModels()
        self._prices = PriceCache()
        """Priced step parts shared by this worker's trials of the same hardware, model, precision,
        parallelism and kernel model (same results as pricing each trial afresh)."""
        self._perturbed = PerturbedModels()
        self._perturbed_prices = PriceCache(max_identities=64)
        """The perturbed runs' priced parts (sweep `slo_confidence`), kept apart so that their K
        models per pricing identity do not evict the point runs' parts."""

    def _bounds(self, scenario: Scenario, point: SimSummary, trial: TrialInput) -> dict[str, float]:
        """`<metric>_lo` / `_hi` of every metric from `trial.interval_runs` perturbed runs and the shipped
        end-to-end widening, as `kernelsight run --intervals` (`metrics.interval_metrics`)."""
        iv = run_intervals(scenario, point, trial.interval_runs, prices=self._perturbed_prices,
                           models=self._perturbed, confidence=trial.slo_confidence, efficiency_models=self._models)
        return interval_metrics(point, iv)

    def evaluate(self, trial: TrialInput) -> TrialResult:
        start_s = time.perf_counter()
        params = dict(trial.params)
        try:
            scenario = build_scenario(self._base, params)
        except ConfigError as exc:
            return invalid_result(trial.number, params, exc)
        scenario_hash = scenario.scenario_hash()
        failed = TrialResult(number=trial.number, status=TrialStatus.FAILED, params=params,
                             scenario_hash=scenario_hash, sim_version=sim_version)
        try:
            cut = 0 < trial.max_requests < scenario.workload.num_prompts
            # The run (or each pool of a disaggregated trial: its own GPU and backend) selects its
            # kernel model through the worker's cache.
            result = simulate(scenario, prices=self._prices, max_requests=trial.max_requests if cut else None,
                              models=self._models)
            metrics = trial_metrics(result.summary)
            if result.autoscaling is not None:
                metrics.update(autoscaling_metrics(result.autoscaling))
            if trial.interval_runs > 0:
                metrics.update(self._bounds(scenario, result.summary, trial))
        except InfeasibleScenario as exc:
            return replace(failed, status=TrialStatus.INFEASIBLE, reason=f"{exc.key}={exc.value!r}: {exc.rule}",
                           duration_s=time.perf_counter() - start_s)
        except ConfigError as exc:
            return replace(failed, status=TrialStatus.INVALID, reason=f"{exc.key}={exc.value!r}: {exc.rule}",
                           duration_s=time.perf_counter() - start_s)
        except Exception as exc:  # a simulator bug must fail this trial, not the sweep
            tail = "".join(traceback.format_exception(exc)[-3:])
            return replace(failed, reason=f"{exc!r}\n{tail}", duration_s=time.perf_counter() - start_s)
        bd = result.breakdown
        breakdown = Breakdown(seconds_by_kind=dict(bd.seconds_by_kind), seconds_by_name=dict(bd.seconds_by_name),
                              host_s=bd.host_s, launch_floor_s=bd.launch_floor_s)
        from orchestrator.sweep.artifacts import trial_artifacts, trial_title

        # --no-trial-plots skips the PNG only: the Parquet breakdown is logged all the same (docs/sweep.md).
        artifacts = trial_artifacts(breakdown, title=trial_title(trial.number, params), plot=self._render)
        return replace(failed, status=TrialStatus.OK, worst_provenance=result.summary.worst_provenance,
                       metrics=metrics, breakdown=breakdown, artifacts=artifacts,
                       duration_s=time.perf_counter() - start_s,
                       fidelity_requests=result.summary.num_requests if cut else 0)

