"""The sweep loop: Optuna ask/tell on the driver, trials on the actor pool, MLflow records.

Per trial, in this order: ask and draw parameters; build the scenario and its hash (cache key;
an impossible combination is answered at once as `INVALID`); answer from the cache or submit
to the pool; when the result is back, hand it to the recorder thread, which writes the MLflow
run and then tells Optuna. Logging before telling is what makes resume exact: a trial that is
finished in Optuna is always recorded in MLflow, and a trial still RUNNING in Optuna is
evaluated again and told once. The main thread makes every decision (asking, the cache, the
pool); the recorder only writes, one trial at a time in completion order.

Resume (`SweepDriver.run` on an existing study) first reconciles the two stores:
- trials WAITING in Optuna (enqueued with `study.enqueue_trial`, never started) are left to `ask`,
  which starts them with their enqueued parameters before it samples new ones;
- trials RUNNING in Optuna (the killed driver's in-flight trials) are evaluated again with the
  parameters Optuna stored (drawing any it had not drawn yet), logged, reusing an MLflow run
  that already has their `trial_number`, and told once;
- finished trials missing from MLflow, or whose run was left half-written, are logged from the
  result stored on the Optuna trial;
- finished trials fill the result cache.
Then new trials are asked until the study holds `n_trials`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from orchestrator.sweep.cache import ResultCache
from orchestrator.sweep.evaluate import build_scenario, invalid_result
from orchestrator.sweep.fidelity import FidelityPruner, rung_score
from orchestrator.sweep.launch import launch_commands
from orchestrator.sweep.objective import constraint_values
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.recorder import Recorder
from orchestrator.sweep.report import DriverTimings, SweepReport, TrialRecord, select_best
from orchestrator.sweep.results import TrialInput, TrialResult, TrialStatus
from orchestrator.sweep.serving import scenario_overrides
from orchestrator.sweep.space import suggest_params
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.study import grid_size, stored_result, tell, trial_state
from orchestrator.sweep.tracker import LoggedRun, Tracker
from orchestrator.sweep.vllm_command import kernelsight_run_command
from sim.errors import ConfigError
from sim.specs.scenario import Scenario

logger = logging.getLogger(__name__)

ProgressFn = Callable[[TrialResult, int, int], None]
"""Called on the main thread after each recorded trial with (result, trials finished, trials wanted)."""


@dataclass(slots=True)
class _Live:
    trial: optuna.Trial
    ticket: TrialInput
    timestamp_ms: int
    scenario_hash: str = ""
    existing: LoggedRun | None = None
    result: TrialResult | None = None
    """Set when the trial is handed to the recorder."""
    full_requests: int = 0
    """Requests of the trial's whole workload (fidelity rungs cut it shorter)."""
    rung_scores: dict[int, float] | None = None
    """Requests -> pruning score of each rung run so far (`[search]` on)."""


class SweepDriver:
    def __init__(self, spec: SweepSpec, base: Scenario, study: optuna.Study, tracker: Tracker,
                 pool: ShardPool | None, *, n_trials: int, progress: ProgressFn | None = None,
                 storage_desc: str = "") -> None:
        """`pool` may be None when `needs_actors(study, ...)` is False (a finished study being reported)."""
        self.spec = spec
        self.base = base
        self.study = study
        self.tracker = tracker
        self.pool = pool
        self.n_trials = wanted_trials(spec, n_trials)
        self.progress = progress
        self.storage_desc = storage_desc
        self.cache = ResultCache()
        self._live: dict[int, _Live] = {}
        self._redo: list[tuple[FrozenTrial, LoggedRun | None]] = []
        self._t = {"ask": 0.0, "build": 0.0, "log": 0.0, "tell": 0.0}
        self._finished_here = 0
        self._num_finished = 0
        self._num_reconciled = 0
        self._num_trials = sum(t.state is not TrialState.WAITING for t in study.get_trials(deepcopy=False))
        """Trials in the study that have started, every state but WAITING; grows with each ask (which
        starts an enqueued WAITING trial before it creates a new one)."""
        self._recorder: Recorder | None = None
        self._pruner = (FidelityPruner(spec, max_requests=base.workload.num_prompts)
                        if spec.search.enabled else None)

    # -- public -------------------------------------------------------------------------------

    def run(self) -> SweepReport:
        start_s = time.perf_counter()
        self._reconcile()
        if self._has_more() and self.pool is None:
            raise RuntimeError("the study has trials to run but the driver got no actor pool")
        if self.pool is not None:
            recorder = self._recorder = Recorder()
            try:
                self._loop(self.pool)
            except BaseException:
                recorder.close(drain=False)
                raise
            recorder.close()
            self._collect(0)
        wall_s = time.perf_counter() - start_s
        return self._report(wall_s)

    def _loop(self, pool: ShardPool) -> None:
        # Up to two trials per actor (pool.has_room), plus room for trials waiting to be recorded.
        max_live = pool.num_actors * 3
        while True:
            self._collect(0)
            while len(self._live) < max_live and pool.has_room() and self._has_more():
                self._start_next()
            if not self._live:
                return
            if pool.num_in_flight():
                for result in pool.wait(timeout_s=0.5):
                    self._on_pool_result(result)
            else:
                self._collect(0.5)

    def _collect(self, timeout_s: float) -> None:
        """Retire the trials the recorder has written; re-raise its error."""
        assert self._recorder is not None
        numbers = self._recorder.done(timeout_s)
        self._recorder.check()
        for number in numbers:
            live = self._live.pop(number)
            assert live.result is not None
            self._finished_here += 1
            self._num_finished += 1
            if self.progress is not None:
                self.progress(live.result, self._num_finished, self.n_trials)

    # -- reconcile ----------------------------------------------------------------------------

    def _reconcile(self) -> None:
        trials = self.study.get_trials(deepcopy=False)
        if not trials:
            return
        logged = self.tracker.logged_trials()
        for ft in trials:
            if ft.state is TrialState.WAITING:
                continue  # enqueued (`study.enqueue_trial`), never started: the next ask() takes it
            if ft.state is TrialState.RUNNING:
                self._redo.append((ft, logged.get(ft.number)))
                continue
            stored = stored_result(ft)
            if stored is None:
                logger.warning("trial %d has no kernelsight result (not made by this tool?); left as is", ft.number)
                continue
            self.cache.put(stored)
            self._num_finished += 1
            run = logged.get(ft.number)
            if run is None or not run.is_done():
                self._relog(ft, stored, run)
        if self._redo:
            logger.info("resuming: %d trial(s) were in flight when the last driver stopped; running them again",
                        len(self._redo))

    def _relog(self, ft: FrozenTrial, stored: TrialResult, run: LoggedRun | None) -> None:
        """Write the MLflow run of a trial Optuna finished but MLflow lacks (or holds half-written)."""
        stored = self._with_artifacts(stored)
        t0 = time.perf_counter()
        self.tracker.log_trial(stored, tags=self._state_tags(ft.state, stored), timestamp_ms=_ms(ft),
                               existing=run)
        self._t["log"] += time.perf_counter() - t0
        self._num_reconciled += 1

    def _with_artifacts(self, result: TrialResult) -> TrialResult:
        """`result` with its breakdown files rendered for it when it has none: it came back from the
        Optuna store, which keeps the breakdown but not the rendered files (a resumed study's late
        record), or it is a cache hit, whose files were the answering trial's (`TrialResult.for_trial`).
        The title is the one the trial's own simulation renders."""
        if result.status is not TrialStatus.OK or result.breakdown is None or result.artifacts:
            return result
        from orchestrator.sweep.artifacts import trial_artifacts, trial_title

        plot = getattr(self.pool, "render_artifacts", True)
        title = trial_title(result.number, result.params)
        return replace(result, artifacts=trial_artifacts(result.breakdown, title=title, plot=plot))

    # -- starting trials ----------------------------------------------------------------------

    def _has_more(self) -> bool:
        return bool(self._redo) or self._num_trials < self.n_trials

    def _start_next(self) -> None:
        t0 = time.perf_counter()
        existing: LoggedRun | None = None
        if self._redo:
            ft, existing = self._redo.pop(0)
            # A live Trial on the stored trial: suggest_* returns the values drawn before the
            # driver stopped and draws only the ones it had not reached.
            trial = optuna.Trial(self.study, ft._trial_id)
            self._num_reconciled += 1
        else:
            trial = self.study.ask()
            self._num_trials += 1
        params = suggest_params(trial, self.spec.space)
        ticket = TrialInput(number=trial.number, params=params, interval_runs=self.spec.trial_interval_runs(),
                            slo_confidence=self.spec.slo_confidence)
        live = _Live(trial=trial, ticket=ticket, timestamp_ms=_ms(trial), existing=existing)
        self._live[trial.number] = live
        t1 = time.perf_counter()
        self._t["ask"] += t1 - t0
        try:
            scenario = build_scenario(self.base, params)
            scenario_hash = scenario.scenario_hash()
            live.full_requests = scenario.workload.num_prompts
        except ConfigError as exc:
            self._t["build"] += time.perf_counter() - t1
            self._finish(invalid_result(trial.number, params, exc))
            return
        self._t["build"] += time.perf_counter() - t1
        live.scenario_hash = scenario_hash
        self._dispatch(ticket, scenario_hash)

    def _dispatch(self, ticket: TrialInput, scenario_hash: str) -> None:
        cached = self.cache.hit(scenario_hash, ticket)
        if cached is not None:
            self._finish(self._with_artifacts(cached))
        elif self.cache.claim(scenario_hash, ticket):
            assert self.pool is not None
            live = self._live[ticket.number]
            if self._pruner is not None:
                first = self._pruner.first_requests(live.full_requests)
                ticket = replace(ticket, max_requests=first if first < live.full_requests else 0)
            self.pool.submit(ticket)

    # -- finishing trials ---------------------------------------------------------------------

    def _on_pool_result(self, result: TrialResult) -> None:
        live = self._live.get(result.number)
        if live is None:
            logger.warning("result for trial %d that is not running; ignored", result.number)
            return
        if self._pruner is not None:
            judged = self._judge_rung(live, result)
            if judged is None:
                return  # promoted: the next rung is running
            result = judged
        waiters = self.cache.settle(live.scenario_hash, result)
        self._finish(result)
        for ticket in waiters:
            self._dispatch(ticket, live.scenario_hash)

    def _judge_rung(self, live: _Live, result: TrialResult) -> TrialResult | None:
        """A rung's result: None when the trial goes on to the next rung (submitted here), else the
        trial's final result (PRUNED at this rung, or its full run / failure with its rung scores)."""
        assert self._pruner is not None and self.pool is not None
        scores = live.rung_scores = live.rung_scores or {}
        if result.status is TrialStatus.OK and result.fidelity_requests:
            decision = self._pruner.judge(result.number, result.metrics, result.fidelity_requests,
                                          live.full_requests)
            scores[result.fidelity_requests] = decision.score
            if not decision.pruned:
                nxt = decision.next_requests
                self.pool.submit(replace(live.ticket, max_requests=nxt if nxt < live.full_requests else 0))
                return None
            return replace(result, status=TrialStatus.PRUNED, rung_scores=dict(scores),
                           reason=f"pruned after {result.fidelity_requests} of {live.full_requests} requests "
                                  f"({self.spec.search.pruner}, score {decision.score:.4g})")
        self._pruner.finish(result.number, result.metrics if result.status is TrialStatus.OK else None,
                            live.full_requests)
        if result.status is TrialStatus.OK and result.metrics:
            scores[live.full_requests] = rung_score(result.metrics, self.spec)
        return replace(result, rung_scores=dict(scores)) if len(scores) > 1 else result

    def _finish(self, result: TrialResult) -> None:
        """Hand a finished trial to the recorder: MLflow run first, then tell."""
        live = self._live[result.number]
        live.result = result
        assert self._recorder is not None
        self._recorder.submit(result.number, lambda: self._record(live, result))

    def _record(self, live: _Live, result: TrialResult) -> None:
        """Runs on the recorder thread."""
        state = trial_state(result, self.spec)
        t0 = time.perf_counter()
        self.tracker.log_trial(result, tags=self._state_tags(state, result), timestamp_ms=live.timestamp_ms,
                               existing=live.existing)
        t1 = time.perf_counter()
        tell(self.study, live.trial, result, self.spec)
        self._t["log"] += t1 - t0
        self._t["tell"] += time.perf_counter() - t1

    def _state_tags(self, state: TrialState, result: TrialResult) -> dict[str, str]:
        feasible = result.status is TrialStatus.OK and all(
            v <= 0 for v in constraint_values(result.metrics, self.spec.slo).values())
        pruned = {"pruned_at_requests": str(result.fidelity_requests)} if result.status is TrialStatus.PRUNED else {}
        return {"optuna_state": state.name, "feasible": str(feasible).lower(), **pruned,
                **run_identity_tags(self.base, result.params)}

    # -- report -------------------------------------------------------------------------------

    def _report(self, wall_s: float) -> SweepReport:
        records = tuple(
            TrialRecord(number=ft.number, state=ft.state.name,
                        values=tuple(ft.values) if ft.values is not None else None, result=stored_result(ft))
            for ft in self.study.get_trials(deepcopy=False))
        selection = select_best(records, self.spec)
        commands: dict[int, dict[str, str]] = {}
        for number in (*selection.best, *selection.closest):
            rec = next(r for r in records if r.number == number)
            if rec.result is None:
                continue
            params = dict(rec.result.params)
            overrides = {**self.spec.base_set, **scenario_overrides(params, self.base.sections())}
            cmds = {"kernelsight_run": kernelsight_run_command(self.spec.base_scenario, overrides)}
            with contextlib.suppress(ConfigError):
                scenario = build_scenario(self.base, params)
                cmds.update(launch_commands(scenario))
            commands[number] = cmds
        timings = DriverTimings(ask_s=self._t["ask"], build_s=self._t["build"], log_s=self._t["log"],
                                tell_s=self._t["tell"], num_trials=self._finished_here, wall_s=wall_s)
        return SweepReport(spec=self.spec, records=records, best=selection.best, closest=selection.closest,
                           ties=selection.ties,
                           num_cache_hits=self.cache.num_hits,
                           num_actor_restarts=self.pool.num_restarts if self.pool else 0,
                           num_resubmitted=self.pool.num_resubmitted if self.pool else 0,
                           num_reconciled=self._num_reconciled,
                           timings=timings, storage=self.storage_desc, tracking=self.tracker.describe(),
                           commands=commands)


IDENTITY_KEYS: dict[str, str] = {"model": "model.name", "hardware": "hardware.name", "backend": "engine.backend"}
"""MLflow tag -> scenario key: what every run records about the system it simulated."""


def run_identity_tags(base: Scenario, params: Mapping[str, Any]) -> dict[str, str]:
    """Model, hardware and backend of a trial: its parameter where swept, else the base scenario's value
    as written (no scenario is built, so a trial whose combination is invalid is tagged too)."""
    sections = base.sections()
    out: dict[str, str] = {}
    for tag, key in IDENTITY_KEYS.items():
        section, field = key.split(".")
        value = params.get(key, sections.get(section, {}).get(field))
        if value is None and key == "engine.backend":
            value = base.engine.backend
        if value is not None:
            out[tag] = str(value)
    return out


def study_identity_tags(base: Scenario, spec: SweepSpec) -> dict[str, str]:
    """`run_identity_tags` for the parent run: a swept key lists its choices, comma-separated."""
    out = run_identity_tags(base, {})
    for p in spec.space:
        tag = next((t for t, k in IDENTITY_KEYS.items() if k == p.key), None)
        if tag is not None:
            out[tag] = ",".join(str(c) for c in p.choices) if p.choices else "swept"
    return out


def wanted_trials(spec: SweepSpec, n_trials: int) -> int:
    """Trials the study should hold: `n_trials`, or the grid's size if smaller."""
    return min(n_trials, grid_size(spec)) if spec.sampler == "grid" else n_trials


def needs_actors(study: optuna.Study, spec: SweepSpec, n_trials: int) -> bool:
    """Whether any trial is left to evaluate (new, enqueued within n_trials, or in flight when a driver
    stopped)."""
    trials = study.get_trials(deepcopy=False)
    started = [t for t in trials if t.state is not TrialState.WAITING]
    waiting = len(trials) - len(started)
    wanted = wanted_trials(spec, n_trials)
    if waiting and len(started) >= wanted:
        logger.warning("%d enqueued trial(s) left waiting: the study already holds %d started trials "
                       "(n_trials = %d); raise --trials to run them", waiting, len(started), wanted)
    return len(started) < wanted or any(t.state is TrialState.RUNNING for t in trials)


def _ms(trial: Any) -> int:
    start = trial.datetime_start
    return int(start.timestamp() * 1000) if start is not None else int(time.time() * 1000)
