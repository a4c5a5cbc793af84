"""Multi-fidelity pruning (`[search]`): parsing, rungs, and a pruned sweep on a real local Ray runtime."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import optuna
import pytest
import ray
from conftest import REPO

from orchestrator.sweep.driver import SweepDriver
from orchestrator.sweep.fidelity import FidelityPruner, rung_requests, rung_score
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.report import report_files
from orchestrator.sweep.results import TrialResult, TrialStatus
from orchestrator.sweep.spec import SearchSpec
from orchestrator.sweep.study import open_storage, open_study
from orchestrator.sweep.tracker import NullTracker
from sim.errors import ConfigError

SCENARIO = REPO / "scenarios" / "llama3_8b-h100.toml"


def _sweep(tmp_path: Path, search: str, *, name: str = "prune", n_trials: int = 6) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f"""
[study]
name = "{name}"
sampler = "grid"
n_trials = {n_trials}
objectives = [{{ metric = "cost_per_million_output_tokens_usd", direction = "minimize" }}]

[slo]
ttft_p90_s = 0.3

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 27, "workload.request_rate" = 30.0, "workload.random_input_len" = 1024, "workload.random_output_len" = 16 }}

[space]
"hardware.name" = {{ choices = ["h100_sxm", "l4", "a100_sxm"] }}
"engine.max_num_seqs" = {{ choices = [4, 64] }}

{search}
""")
    return path


ON = '[search]\npruner = "successive_halving"\nmin_fidelity_requests = 3\nreduction_factor = 3\n'


def test_rungs_grow_by_the_reduction_factor_up_to_the_full_workload() -> None:
    search = SearchSpec(pruner="successive_halving", min_fidelity_requests=3, reduction_factor=3)
    assert rung_requests(search, 27) == (3, 9, 27)
    assert rung_requests(search, 20) == (3, 20)  # 9 is over 20 / 3: nearly a full run
    assert rung_requests(search, 26) == (3, 26)
    assert rung_requests(search, 2) == (2,)
    assert rung_requests(search, 8) == (8,)


def test_search_section_is_off_by_default_and_checked(tmp_path: Path) -> None:
    assert not load_sweep(_sweep(tmp_path, "")).search.enabled
    spec = load_sweep(_sweep(tmp_path, ON))
    assert spec.search == SearchSpec(pruner="successive_halving", min_fidelity_requests=3, reduction_factor=3)
    assert spec.identity(spec.load_base()) != load_sweep(_sweep(tmp_path, "")).identity(spec.load_base())
    bad = {
        '[search]\npruner = "asha"\n': "search.pruner",
        '[search]\npruner = "hyperband"\n': "search.min_fidelity_requests",
        '[search]\npruner = "hyperband"\nmin_fidelity_requests = 0\n': "search.min_fidelity_requests",
        '[search]\npruner = "hyperband"\nmin_fidelity_requests = 5\nreduction_factor = 1\n': "search.reduction_factor",
        '[search]\npruner = "hyperband"\nmin_fidelity_requests = 5\npruning_metric = "ttft"\n': "search.pruning_metric",
        '[search]\nmin_fidelity_requests = 5\n': "search.min_fidelity_requests",
        '[search]\npruner = "hyperband"\nmin_fidelity_requests = 5\nrungs = 3\n': "search.rungs",
    }
    for text, key in bad.items():
        with pytest.raises(ConfigError) as info:
            load_sweep(_sweep(tmp_path, text))
        assert info.value.key == key, text
        assert str(tmp_path) in info.value.source


def test_rung_score_ranks_slo_violation_then_the_metric(tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, ON))
    assert rung_score({"ttft_p90_s": 0.2}, spec) == 0.0
    assert rung_score({"ttft_p90_s": 0.6}, spec) == pytest.approx(1.0)  # (0.6 - 0.3) / 0.3
    by_cost = load_sweep(_sweep(tmp_path, ON + 'pruning_metric = "cost_per_million_output_tokens_usd"\n'))
    assert rung_score({"ttft_p90_s": 0.2, "cost_per_million_output_tokens_usd": 4.0}, by_cost) == 4.0
    assert math.isinf(rung_score({"ttft_p90_s": 0.6, "cost_per_million_output_tokens_usd": 4.0}, by_cost))


def test_hyperband_prunes_by_the_seed_alone(tmp_path: Path) -> None:
    """Hyperband puts each trial in a bracket by a hash of the study name and trial number: the
    companion study has a fixed name and the sweep's trial numbers (whatever order trials reach their
    first rung in), so the same rung results give the same decisions in every run (before 2026-12-02
    the companion was named by a fresh UUID: three runs of one sweep pruned {3, 4, 5, 6},
    {2, 3, 4, 5, 6, 9}, {1, 5, 6})."""
    spec = load_sweep(_sweep(tmp_path, '[search]\npruner = "hyperband"\nmin_fidelity_requests = 3\n'
                                       'reduction_factor = 3\n', n_trials=12))
    ttft = {n: 0.05 * (1 + (7 * n) % 12) for n in range(12)}  # rung results, an arbitrary order
    order = [5, 0, 11, 3, 1, 2, 4, 6, 7, 8, 9, 10]

    def decisions() -> dict[int, bool]:
        pruner = FidelityPruner(spec, max_requests=27)
        out = {n: pruner.judge(n, {"ttft_p90_s": ttft[n]}, 3, 27).pruned for n in order}
        assert [t.number for t in pruner._study.trials] == list(range(12))
        assert pruner._study.study_name == "prune-fidelity"
        return out

    first = decisions()
    assert all(decisions() == first for _ in range(3))
    assert any(first.values()) and not all(first.values())


@pytest.mark.ray
def test_a_pruned_sweep_marks_pruned_trials_and_their_fidelity(ray_address: str, tmp_path: Path) -> None:
    spec = load_sweep(_sweep(tmp_path, ON))
    base = spec.load_base()
    storage, _ = open_storage(None, tmp_path / "study")
    study, _ = open_study(spec, storage, identity=spec.identity(base), resume=False)
    pool = ShardPool(ray.put(base), num_actors=1, render_artifacts=False, name_prefix="test-prune")
    try:
        report = SweepDriver(spec, base, study, NullTracker(), pool, n_trials=spec.n_trials).run()
    finally:
        pool.close()
    results: list[TrialResult] = [r.result for r in report.records if r.result is not None]
    pruned = [r for r in results if r.status is TrialStatus.PRUNED]
    full = [r for r in results if r.status is TrialStatus.OK]
    assert pruned, "the l4 trials miss ttft_p90_s at the first rung and are pruned"
    for r in pruned:
        assert r.fidelity_requests in (3, 9) and "pruned after" in r.reason
        assert r.rung_scores[r.fidelity_requests] > 0  # pruned for an SLO violation at that rung
        assert study.trials[r.number].state is optuna.trial.TrialState.PRUNED
    for r in full:
        assert r.fidelity_requests == 0
        assert set(r.rung_scores) <= {3, 9, 27} and (not r.rung_scores or 27 in r.rung_scores)
    assert {p["number"] for p in report.to_json()["pruned"]} == {r.number for r in pruned}
    rows = list(csv.DictReader(io.StringIO(report_files(report)["trials.csv"].decode())))
    marked = {int(row["trial"]): row["pruned_at_requests"] for row in rows if row.get("pruned_at_requests")}
    assert marked == {r.number: str(r.fidelity_requests) for r in pruned}
