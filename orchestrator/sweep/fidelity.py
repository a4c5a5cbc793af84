"""Multi-fidelity search (`[search]`): fidelity rungs and Optuna's pruner deciding at each. (*)

Fidelity is the number of requests simulated: rung k runs the first `min_fidelity_requests x
reduction_factor^k` requests of the trial's workload (rungs up to 1 / reduction_factor of it; a
genuine prefix of the full run's requests, `sim.api.simulate(max_requests=...)`), the last rung the
full workload. After each rung below the
full one the driver reports the trial's score at `step = requests` and asks the pruner whether to
stop; a stopped trial is told PRUNED with its last rung's metrics. Each rung simulates its prefix
from the start (no checkpoint), so a trial that survives every rung costs up to 1 / (1 - 1 /
reduction_factor) of a full run (1.5x at 3, 1.11x at 10): pruning saves time only when the rungs
stop most trials early.

The pruner is Optuna's `SuccessiveHalvingPruner` or `HyperbandPruner`. Optuna's `Trial.report` works
for single-objective studies only, and a sweep usually has several objectives, so the pruner runs on
a companion in-memory single-objective study (one companion trial per sweep trial, minimising the
score): the score is a scalar for every sweep, and the sweep study itself is told exactly what it
would be told without pruning, plus PRUNED trials. The companion is rebuilt empty on `--resume`:
trials then compete with the rungs run in this session.

Score (lower is better): with `pruning_metric = "slo"`, the sum of the relative `[slo]` violations
((value - bound) / |bound|, counted when positive), so every trial meeting the bounds at the rung ties
for best and is never pruned; with a metric, its value (negated when an objective maximises it), and
+inf when the rung misses an `[slo]` bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.pruners import BasePruner, HyperbandPruner, SuccessiveHalvingPruner
from optuna.trial import TrialState

from orchestrator.sweep.objective import relative_violations
from orchestrator.sweep.spec import SLO_PRUNING_METRIC, SearchSpec, SweepSpec


def rung_requests(search: SearchSpec, full_requests: int) -> tuple[int, ...]:
    """Requests of each rung, ascending, the last one `full_requests`."""
    rungs: list[int] = []
    r = search.min_fidelity_requests
    # A rung runs from the first request again, so one just short of the full workload would cost
    # nearly a full run: rung r is kept only if the full workload is at least factor x r.
    while r * search.reduction_factor <= full_requests:
        rungs.append(r)
        r *= search.reduction_factor
    return (*rungs, full_requests)


def rung_score(metrics: Mapping[str, float], spec: SweepSpec) -> float:
    """What the pruner ranks at a rung; lower is better (module docstring)."""
    # With slo_confidence a bound is judged at the interval's pessimistic end, as Optuna's constraint is.
    violation = sum(v for v in relative_violations(metrics, spec.slo).values() if v > 0)
    metric = spec.search.pruning_metric
    if metric == SLO_PRUNING_METRIC:
        return violation
    if violation > 0:
        return math.inf
    value = metrics[metric]
    if math.isnan(value):
        return math.inf
    maximise = any(o.metric == metric and o.direction == "maximize" for o in spec.objectives)
    return -value if maximise else value


@dataclass(frozen=True, slots=True, kw_only=True)
class RungDecision:
    next_requests: int
    """Requests of the next rung; 0 when the trial is pruned."""
    score: float

    @property
    def pruned(self) -> bool:
        return self.next_requests == 0


class FidelityPruner:
    """The driver's pruning state: one companion Optuna trial per sweep trial on its rungs."""

    def __init__(self, spec: SweepSpec, *, max_requests: int) -> None:
        self._spec = spec
        # A fixed name and companion numbers equal to the sweep's trial numbers: Hyperband puts a trial
        # in the bracket crc32(f"{study_name}_{number}") picks, so its pruning follows the seed alone
        # (an unnamed study is named by a fresh UUID, and companions asked in rung-completion order
        # are numbered by timing).
        self._study = optuna.create_study(study_name=f"{spec.name}-fidelity", direction="minimize",
                                          pruner=make_pruner(spec.search, max_requests),
                                          sampler=optuna.samplers.RandomSampler(seed=spec.seed))
        self._trials: dict[int, optuna.Trial] = {}
        """Companions of trials judged on a rung and not finished."""
        self._asked: dict[int, optuna.Trial] = {}
        """Companions asked ahead (numbers below a judged trial's) and not judged yet."""

    def _companion(self, number: int) -> optuna.Trial:
        """Sweep trial `number`'s companion, companion trial `number` (asked up to it on first use)."""
        trial = self._trials.get(number)
        if trial is not None:
            return trial
        while len(self._study.trials) <= number:
            asked = self._study.ask()
            self._asked[asked.number] = asked
        trial = self._trials[number] = self._asked.pop(number)
        return trial

    def first_requests(self, full_requests: int) -> int:
        """Requests of the first rung of a trial whose workload has `full_requests` (that, if no smaller rung)."""
        return rung_requests(self._spec.search, full_requests)[0]

    def judge(self, number: int, metrics: Mapping[str, float], requests: int, full_requests: int) -> RungDecision:
        """After a rung below the full workload: the next rung's requests, or 0 to prune."""
        trial = self._companion(number)
        score = rung_score(metrics, self._spec)
        trial.report(score if math.isfinite(score) else 1e300, step=requests)
        if trial.should_prune():
            self._study.tell(trial, state=TrialState.PRUNED)
            del self._trials[number]
            return RungDecision(next_requests=0, score=score)
        rungs = rung_requests(self._spec.search, full_requests)
        return RungDecision(next_requests=next(r for r in rungs if r > requests), score=score)

    def finish(self, number: int, metrics: Mapping[str, float] | None, full_requests: int) -> None:
        """The trial ran its full workload (metrics) or ended otherwise (None); its companion completes."""
        trial = self._trials.pop(number, None)
        if trial is None:
            return
        if metrics is None:
            self._study.tell(trial, state=TrialState.FAIL)
            return
        score = rung_score(metrics, self._spec)
        value = score if math.isfinite(score) else 1e300
        trial.report(value, step=full_requests)
        self._study.tell(trial, value)


def make_pruner(search: SearchSpec, max_requests: int) -> BasePruner:
    if search.pruner == "hyperband":
        return HyperbandPruner(min_resource=search.min_fidelity_requests,
                               max_resource=max(max_requests, search.min_fidelity_requests),
                               reduction_factor=search.reduction_factor)
    return SuccessiveHalvingPruner(min_resource=search.min_fidelity_requests,
                                   reduction_factor=search.reduction_factor, min_early_stopping_rate=0)
