"""Sweep edge cases: the seed's range, `when` on "none" and on float values, --no-trial-plots keeping the
Parquet breakdown, the breakdown files of a cache hit (the PNG its own simulation renders, on a former
session's trial too), the pruning score under slo_confidence. No Ray, no MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FixedTrial

from orchestrator.sweep.artifacts import BREAKDOWN_PARQUET, BREAKDOWN_PNG
from orchestrator.sweep.driver import SweepDriver
from orchestrator.sweep.evaluate import TrialEvaluator
from orchestrator.sweep.fidelity import rung_score
from orchestrator.sweep.objective import constraint_values
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.results import TrialInput, TrialResult
from orchestrator.sweep.space import suggest_params
from orchestrator.sweep.spec import BoundSpec, ObjectiveSpec, SearchSpec, SweepSpec
from orchestrator.sweep.study import open_storage, open_study
from orchestrator.sweep.tracker import NullTracker
from sim.errors import ConfigError

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "llama3_8b-h100.toml"


def _sweep(tmp_path: Path, space: str, *, study: str = "", name: str = "rev") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[study]
name = "{name}"
sampler = "random"
n_trials = 2
objective = "ttft_p90_s"
{study}
[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 8 }}
[space]
{space}
""")
    return path


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_seed_outside_numpys_range_is_bad_input(tmp_path: Path, seed: int) -> None:
    path = _sweep(tmp_path, '"engine.max_num_seqs" = { choices = [16, 32] }', study=f"seed = {seed}")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.key == "study.seed"


def test_when_on_none_choice_is_accepted_and_active(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, '''
"engine.quantization" = { choices = ["none", "fp8"] }
"engine.max_num_seqs" = { choices = [16, 32], when = { "engine.quantization" = "none" } }'''))
    drawn = suggest_params(FixedTrial({"engine.quantization": None, "engine.max_num_seqs": 32}), spec.space)
    assert drawn == {"engine.quantization": None, "engine.max_num_seqs": 32}


def test_when_with_an_integer_on_a_float_parameter_is_active(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, '''
"engine.gpu_memory_utilization" = { type = "float", low = 0.5, high = 1.0, step = 0.5 }
"engine.max_num_seqs" = { choices = [16, 32], when = { "engine.gpu_memory_utilization" = 1 } }'''))
    drawn = suggest_params(FixedTrial({"engine.gpu_memory_utilization": 1.0, "engine.max_num_seqs": 32}), spec.space)
    assert drawn["engine.max_num_seqs"] == 32


def test_no_trial_plots_keeps_the_parquet_breakdown(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, '"engine.max_num_seqs" = { choices = [16, 32] }'))
    result = TrialEvaluator(spec.load_base(), render_artifacts=False).evaluate(
        TrialInput(number=0, params={"engine.max_num_seqs": 16}))
    assert BREAKDOWN_PARQUET in result.artifacts and BREAKDOWN_PNG not in result.artifacts


class _InlinePool:
    render_artifacts = True
    num_actors = 1
    num_restarts = 0
    num_resubmitted = 0

    def __init__(self, evaluator: TrialEvaluator) -> None:
        self._ev = evaluator
        self._queue: list[TrialInput] = []

    def has_room(self) -> bool:
        return len(self._queue) < 2

    def num_in_flight(self) -> int:
        return len(self._queue)

    def submit(self, trial: TrialInput) -> None:
        self._queue.append(trial)

    def wait(self, timeout_s: float | None) -> list[TrialResult]:
        return [self._ev.evaluate(self._queue.pop(0))] if self._queue else []


class _Recording(NullTracker):
    def __init__(self) -> None:
        self.logged: list[TrialResult] = []

    def log_trial(self, result: TrialResult, **kwargs: Any) -> None:
        self.logged.append(result)


def test_a_cache_hit_on_a_former_sessions_trial_logs_its_breakdown_files(tmp_path: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_sweep(_sweep(tmp_path, '"engine.max_num_seqs" = { choices = [16] }'))
    base = spec.load_base()
    evaluator = TrialEvaluator(base, render_artifacts=True)
    for n_trials, resume in ((1, False), (2, True)):
        storage, _ = open_storage(None, tmp_path / "study")
        study, _ = open_study(spec, storage, identity=spec.identity(base), resume=resume)
        tracker = _Recording()
        SweepDriver(spec, base, study, tracker, _InlinePool(evaluator), n_trials=n_trials).run()  # type: ignore[arg-type]
    (hit,) = [r for r in tracker.logged if r.number == 1]  # trial 0 is re-logged: NullTracker holds no runs
    assert hit.cached_from == 0
    assert {BREAKDOWN_PARQUET, BREAKDOWN_PNG} <= set(hit.artifacts)


@pytest.mark.parametrize("sessions", [((2, False),), ((1, False), (2, True))], ids=["same-session", "former-session"])
def test_a_cache_hits_breakdown_png_is_the_one_its_own_simulation_renders(
        tmp_path: Path, sessions: tuple[tuple[int, bool], ...]) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_sweep(_sweep(tmp_path, '"engine.max_num_seqs" = { choices = [16] }'))
    base = spec.load_base()
    evaluator = TrialEvaluator(base, render_artifacts=True)
    for n_trials, resume in sessions:
        storage, _ = open_storage(None, tmp_path / "study")
        study, _ = open_study(spec, storage, identity=spec.identity(base), resume=resume)
        tracker = _Recording()
        SweepDriver(spec, base, study, tracker, _InlinePool(evaluator), n_trials=n_trials).run()  # type: ignore[arg-type]
    (hit,) = [r for r in tracker.logged if r.number == 1]
    assert hit.cached_from == 0
    fresh = evaluator.evaluate(TrialInput(number=1, params=dict(hit.params)))
    assert hit.artifacts[BREAKDOWN_PNG] == fresh.artifacts[BREAKDOWN_PNG]
    assert hit.artifacts[BREAKDOWN_PARQUET] == fresh.artifacts[BREAKDOWN_PARQUET]


def test_pruning_score_judges_slo_at_the_intervals_pessimistic_end() -> None:
    spec = SweepSpec(source="x", name="x", sampler="random", n_trials=1, seed=0,
                     objectives=(ObjectiveSpec(metric="ttft_p90_s", direction="minimize"),),
                     slo=(BoundSpec(metric="ttft_p90_s", max_value=0.5),), base_scenario="x", space=(),
                     search=SearchSpec(pruner="successive_halving", min_fidelity_requests=5), slo_confidence=0.9)
    metrics = {"ttft_p90_s": 0.4, "ttft_p90_s_lo": 0.35, "ttft_p90_s_hi": 0.6}
    assert constraint_values(metrics, spec.slo)["ttft_p90_s"] > 0
    assert rung_score(metrics, spec) > 0
