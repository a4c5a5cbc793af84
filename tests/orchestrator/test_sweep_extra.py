"""More sweep behaviour on a real local Ray runtime (2 CPUs), real Optuna journals and MLflow sqlite stores.

Covers what `test_sweep_ray.py` leaves out: an NSGA-II sweep end to end, the TPE sampler's
`constant_liar`, unordered completion around one slow trial, the plain-text report of
`kernelsight sweep`, and capacity planning over tensor parallelism. One Ray runtime and one
MLflow database serve the whole module (each study is its own experiment in it).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import time
from collections.abc import Sequence
from pathlib import Path

import optuna
import pytest
import ray
from mlflow import MlflowClient
from optuna.samplers import NSGAIISampler, TPESampler
from optuna.trial import FrozenTrial
from test_sweep_ray import SCENARIO, SMALL, journal_study, sweep_file

from orchestrator.cli import main
from orchestrator.sweep.driver import SweepDriver
from orchestrator.sweep.evaluate import build_scenario
from orchestrator.sweep.metrics import trial_metrics
from orchestrator.sweep.objective import meets_slo
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.pool import ShardPool
from orchestrator.sweep.results import TrialResult
from orchestrator.sweep.space import suggest_params
from orchestrator.sweep.spec import SweepSpec
from orchestrator.sweep.study import make_sampler, open_storage, open_study
from orchestrator.sweep.tracker import NullTracker
from sim.api import simulate
from sim.errors import ConfigError
from sim.specs.scenario import Scenario

pytestmark = pytest.mark.ray

OBJECTIVES = ("cost_per_million_output_tokens_usd", "ttft_p90_s")
"""The two objectives (both minimised) that `sweep_file` writes."""
HARDWARE_SPACE = ('"hardware.name" = { choices = ["h100_sxm", "a100_sxm", "l40s"] }\n'
                  '"engine.max_num_seqs" = { type = "int", low = 8, high = 256, log = true }\n')


def feasible_front(trials: Sequence[FrozenTrial]) -> dict[tuple[float, ...], list[int]]:
    """Objective vectors of the non-dominated feasible COMPLETE trials (all objectives minimised), each with
    its trial numbers in order; computed from the Optuna journal alone."""
    ran = [t for t in trials if t.state.name == "COMPLETE" and t.values is not None
           and t.constraints and all(v <= 0 for v in t.constraints.values())]
    points = {tuple(t.values) for t in ran}

    def dominated(p: tuple[float, ...]) -> bool:
        return any(all(a <= b for a, b in zip(q, p, strict=True)) and q != p for q in points)

    return {p: sorted(t.number for t in ran if tuple(t.values) == p) for p in points if not dominated(p)}


# -- 1. NSGA-II end to end ------------------------------------------------------------------------


def test_nsga2_sweep_completes_with_a_pareto_front(ray_runtime: None, tracking_uri: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """10 NSGA-II trials with populations of 4: later generations are bred, and the reported best
    trials are exactly the feasible Pareto front of the stored study."""
    path = sweep_file(tmp_path, name="nsga2-front", sampler="nsga2", n_trials=10, space=HARDWARE_SPACE,
                      base_set=SMALL, extra="[sampler]\npopulation_size = 4\n")
    study_dir = tmp_path / "study"
    assert main(["sweep", str(path), "--tracking-uri", tracking_uri, "--study-dir", str(study_dir),
                 "--no-trial-plots", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampler"] == "nsga2" and out["n_trials"] == 10 and sum(out["counts"].values()) == 10
    assert [o["metric"] for o in out["objectives"]] == list(OBJECTIVES)

    study = journal_study(study_dir, "nsga2-front")
    assert study is not None
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(10))
    assert all(t.state.is_finished() for t in trials)
    generations = [t.system_attrs.get(NSGAIISampler._get_generation_key()) for t in trials]
    assert None not in generations and max(g for g in generations if g is not None) >= 1, generations

    front = feasible_front(trials)
    assert front, "no feasible trial: the sweep has nothing to rank"
    best = out["best"]
    # One row per distinct point of the front, the lowest-numbered trial first, the others as ties.
    assert {tuple(b["values"][m] for m in OBJECTIVES) for b in best} == set(front)
    for b in best:
        numbers = front[tuple(b["values"][m] for m in OBJECTIVES)]
        assert b["number"] == numbers[0] and b["same_values_trials"] == numbers[1:]
        assert all(v <= 0 for v in b["slo_violation"].values())
        assert b["vllm_serve"].startswith("vllm serve ") and "kernelsight run" in b["kernelsight_run"]
        assert b["sglang_launch"].startswith("python -m sglang.launch_server ")
    costs = [b["values"][OBJECTIVES[0]] for b in best]
    assert costs == sorted(costs)
    # Along a two-objective front, the second objective falls as the first rises.
    ttfts = [b["values"][OBJECTIVES[1]] for b in best]
    assert ttfts == sorted(ttfts, reverse=True)

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("nsga2-front")
    assert exp is not None
    parent = client.search_runs([exp.experiment_id], filter_string="tags.role = 'parent'")
    assert len(parent) == 1 and parent[0].data.params["study.sampler"] == "nsga2"
    csv_path = client.download_artifacts(parent[0].info.run_id, "pareto_front.csv", str(tmp_path))
    with Path(csv_path).open(newline="") as f:
        csv_trials = sorted(int(row["trial"]) for row in csv.DictReader(f))
    assert csv_trials == sorted(n for numbers in front.values() for n in numbers)
    png = client.download_artifacts(parent[0].info.run_id, "pareto_front.png", str(tmp_path))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- 2. TPE with constant_liar --------------------------------------------------------------------


@pytest.mark.parametrize("conditional", [False, True])
def test_tpe_sampler_is_built_with_constant_liar(tmp_path: Path, conditional: bool) -> None:
    """`constant_liar=True` is set explicitly (Optuna's default has changed across versions); the
    sampler is multivariate, grouped when the space has `when` conditions, and is the study's sampler."""
    space = ('"engine.enable_chunked_prefill" = { choices = [true, false] }\n'
             '"engine.max_num_batched_tokens" = { choices = [2048, 8192]'
             + (', when = { "engine.enable_chunked_prefill" = true } }\n' if conditional else ' }\n'))
    spec = load_sweep(sweep_file(tmp_path, name="tpe-liar", sampler="tpe", n_trials=4, space=space, base_set=SMALL))
    sampler = make_sampler(spec)
    assert isinstance(sampler, TPESampler)
    assert sampler._constant_liar is True
    assert sampler._multivariate is True and sampler._group is conditional

    # The study the driver asks from holds that sampler.
    storage, _ = open_storage(None, tmp_path / "study")
    study, existed = open_study(spec, storage, identity=spec.identity(spec.load_base()), resume=False)
    assert not existed and isinstance(study.sampler, TPESampler) and study.sampler._constant_liar is True


def test_tpe_constant_liar_cannot_be_turned_off_from_the_sweep_file(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, name="tpe-no-liar", sampler="tpe", n_trials=4, base_set=SMALL,
                      space='"engine.max_num_seqs" = { type = "int", low = 8, high = 256 }\n',
                      extra="[sampler]\nconstant_liar = false\n")
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.key == "sampler.constant_liar"


# -- 3. unordered completion ----------------------------------------------------------------------


def _first_grid_index(tmp_path: Path, size: int) -> int:
    """Which of `size` grid choices the sweep's (seeded) grid sampler gives trial 0, found by asking a
    throwaway in-memory study with the same sampler."""
    markers = list(range(101, 101 + size))
    spec = load_sweep(sweep_file(tmp_path, name="grid-order", sampler="grid", n_trials=size, base_set=SMALL,
                                 space=f'"workload.num_prompts" = {{ choices = {markers} }}\n'))
    study = optuna.create_study(sampler=make_sampler(spec), directions=["minimize", "minimize"])
    drawn = suggest_params(study.ask(), spec.space)["workload.num_prompts"]
    assert isinstance(drawn, int)
    return markers.index(drawn)


def test_a_slow_trial_does_not_hold_back_the_others(ray_runtime: None, tmp_path: Path) -> None:
    """Trial 0 simulates 100,000 requests, trials 1-6 a handful each. With 2 actors the fast trials
    go through the free actor, asked, run and recorded while trial 0 is still running: at most the
    one trial queued behind it on its own actor (pool depth 2) waits for it."""
    slow, fast = 100_000, list(range(8, 14))
    choices: list[int] = list(fast)
    choices.insert(_first_grid_index(tmp_path, len(fast) + 1), slow)  # trial 0 draws the slow one
    path = sweep_file(tmp_path, name="unordered", sampler="grid", n_trials=len(choices),
                      space=f'"workload.num_prompts" = {{ choices = {choices} }}\n',
                      base_set='"workload.request_rate" = 30.0, "workload.random_input_len" = 1024, '
                               '"workload.random_output_len" = 128')
    spec = load_sweep(path)
    base = spec.load_base()
    storage, _ = open_storage(None, tmp_path / "study")
    study, _ = open_study(spec, storage, identity=spec.identity(base), resume=False)

    finished: list[tuple[int, float, TrialResult]] = []

    def record(result: TrialResult, done: int, total: int) -> None:
        finished.append((result.number, time.monotonic(), result))

    pool = ShardPool(ray.put(base), num_actors=2, render_artifacts=False, name_prefix="test-unordered")
    try:
        # Both actors up before the clock starts, so the fast trials do not wait on an actor's start-up.
        ray.get([ray.get_actor(name).pid.remote() for name in pool.current_actor_names()])
        report = SweepDriver(spec, base, study, NullTracker(), pool, n_trials=spec.n_trials, progress=record).run()
    finally:
        pool.close()

    assert [r.state for r in report.records] == ["COMPLETE"] * len(choices)
    by_number = {number: result for number, _, result in finished}
    assert sorted(by_number) == list(range(len(choices)))
    assert int(by_number[0].metrics["num_completed"]) == slow, "trial 0 is not the slow trial"
    assert sorted(int(r.metrics["num_completed"]) for n, r in by_number.items() if n) == fast
    # The precondition of the order check: trial 0 outlasts the fast trials run one after another
    # (an actor's first trial pays its start-up pricing, so a ratio to the slowest fast trial is no
    # bound on a loaded box).
    slow_s = by_number[0].duration_s
    fast_s = sum(r.duration_s for n, r in by_number.items() if n)
    assert slow_s > fast_s, f"trial 0 was not slow enough to tell ({slow_s:.2f} s vs {fast_s:.2f} s in all)"

    order = [number for number, _, _ in finished]
    before_slow = order[:order.index(0)]
    assert len(before_slow) >= len(fast) - 1, order
    # Among them are trials asked only after trial 0 started (the first fill is 4 trials, 2 per
    # actor): the driver kept asking and dispatching while trial 0 ran.
    assert max(before_slow) >= 4, order


# -- 4. plain-text report -------------------------------------------------------------------------


def test_plain_text_report_lists_the_pareto_front(ray_runtime: None, tracking_uri: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json: a head line, the Pareto front as a table (one row per distinct objective
    vector, its ties counted), the first trial's `vllm serve` line and how to open the results.
    A grid of 3 GPU types x 2 batch sizes: the cheap and the fast GPU are both on the front."""
    space = ('"hardware.name" = { choices = ["h100_sxm", "a100_sxm", "l40s"] }\n'
             '"engine.max_num_seqs" = { choices = [16, 64] }\n')
    path = sweep_file(tmp_path, name="text-report", sampler="grid", n_trials=6, space=space, base_set=SMALL)
    study_dir = tmp_path / "study"
    assert main(["sweep", str(path), "--tracking-uri", tracking_uri, "--study-dir", str(study_dir),
                 "--no-trial-plots"]) == 0
    text = capsys.readouterr().out
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    study = journal_study(study_dir, "text-report")
    assert study is not None
    trials = study.get_trials(deepcopy=False)
    front = feasible_front(trials)
    assert len(front) >= 2, front  # more than one row to list

    lines = text.splitlines()
    assert lines[0].startswith("study text-report: 6 trials (") and "answered from cache" in lines[0]
    title = lines.index("Pareto front:")
    header, rule = lines[title + 1].split(), lines[title + 2]
    assert header == ["trial", *OBJECTIVES, "tpot_p90_s", "name", "max_num_seqs", "ties"]
    assert set(rule) == {"-", " "}
    rows = [line.split() for line in lines[title + 3:title + 3 + len(front)]]
    assert lines[title + 3 + len(front)] == ""  # the table ends with the front
    by_number = {t.number: t for t in trials}
    points = sorted(front, key=lambda p: p[0])  # ordered by the first objective
    assert [int(row[0]) for row in rows] == [front[p][0] for p in points]
    for row, p in zip(rows, points, strict=True):
        trial = by_number[int(row[0])]
        assert [float(v) for v in row[1:3]] == pytest.approx(list(p), rel=1e-3)
        assert row[4] == trial.params["hardware.name"] and int(row[5]) == trial.params["engine.max_num_seqs"]
        ties = len(front[p]) - 1
        assert row[6:] == ([f"+{ties}"] if ties else [])
    first = front[points[0]][0]
    serve = lines.index(f"trial {first} as a vLLM server:")
    assert lines[serve + 1].strip().startswith("vllm serve ")
    assert f"results: mlflow ui --backend-store-uri {tracking_uri}" in text


# -- 5. capacity planning over tensor parallelism ---------------------------------------------------


def test_capacity_plan_over_tensor_parallel_sizes(ray_runtime: None, tracking_uri: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """TP 1, 2, 3 and 4 on one GPU type, with a p90 TPOT bound that one A100 cannot meet even at
    light load: TP 1 is `slo_unreachable`, TP 3 does not divide Llama-3.1-8B's heads (`invalid`), TP 2
    and 4 each get their own capacity, and the fleet is priced per GPU (replicas x TP), so the plan
    picks TP 2: the cheapest replica that meets the SLOs, not the cheapest GPU count per replica."""
    target = 2.0
    path = tmp_path / "cap-tp.toml"
    path.write_text(f"""
[study]
name = "cap-tp"
[capacity]
target_request_rate = {target}
rate_rel_tol = 0.1
[slo]
ttft_p90_s = 0.5
tpot_p90_s = 0.0105
[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 40, "workload.random_input_len" = 512, "workload.random_output_len" = 32 }}
[space]
"hardware.name" = {{ choices = ["a100_sxm"] }}
"engine.tensor_parallel_size" = {{ choices = [1, 2, 3, 4] }}
""")
    assert main(["sweep", str(path), "--tracking-uri", tracking_uri, "--study-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["candidates"]
    assert [r["engine.tensor_parallel_size"] for r in rows] == [1, 2, 3, 4]
    tp1, tp2, tp3, tp4 = rows
    assert tp1["status"] == "slo_unreachable", tp1
    assert tp3["status"] == "invalid" and "tensor_parallel_size" in tp3["reason"], tp3
    assert tp2["status"] == tp4["status"] == "ok", rows
    for r in (tp2, tp4):
        assert r["num_gpus"] == r["replicas"] * r["engine.tensor_parallel_size"]
        assert r["replicas"] == max(1, math.ceil(target / r["capacity_rate_per_replica"] - 1e-9))
        assert r["tpot_p90_s"] <= 0.0105 and r["ttft_p90_s"] <= 0.5
    # One price per GPU-hour, whatever the TP.
    assert tp2["cost_per_hour_usd"] / tp2["num_gpus"] == pytest.approx(tp4["cost_per_hour_usd"] / tp4["num_gpus"])
    # Each TP has its own capacity: four GPUs per replica serve more than two.
    assert tp4["capacity_rate_per_replica"] > tp2["capacity_rate_per_replica"]
    assert out["chosen"] == tp2 and tp2["cost_per_hour_usd"] < tp4["cost_per_hour_usd"]
    assert "--tensor-parallel-size 2" in out["vllm_serve"]
    assert out["verified_fleet_metrics"]["tpot_p90_s"] <= 0.0105

    # The statuses and capacities hold when re-simulated at each TP.
    spec = load_sweep(path)
    assert spec.capacity is not None
    base = spec.load_base()

    def metrics_at(tp: int, rate: float) -> dict[str, float]:
        scenario = build_scenario(base, {"hardware.name": "a100_sxm", "engine.tensor_parallel_size": tp,
                                         "workload.request_rate": rate})
        return trial_metrics(simulate(scenario).summary)

    assert not meets_slo(metrics_at(1, spec.capacity.min_rate_per_replica), spec.slo)
    for r in (tp2, tp4):
        assert meets_slo(metrics_at(r["engine.tensor_parallel_size"], r["capacity_rate_per_replica"]), spec.slo)

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name("cap-tp")
    assert exp is not None
    candidates = client.search_runs([exp.experiment_id], filter_string="tags.role = 'candidate'")
    assert {r.data.params["engine.tensor_parallel_size"]: r.data.tags["status"] for r in candidates} == {
        "1": "slo_unreachable", "2": "ok", "3": "invalid", "4": "ok"}
    chosen = [r for r in candidates if r.data.tags["chosen"] == "true"]
    assert len(chosen) == 1 and chosen[0].data.params["engine.tensor_parallel_size"] == "2"


# -- enqueued trials ------------------------------------------------------------------------------


def _seqs_study(tmp_path: Path, name: str, n_trials: int) -> tuple[SweepSpec, Scenario, optuna.Study]:
    """A random-sampler study over max_num_seqs with the SMALL workload, in a journal under tmp_path."""
    path = sweep_file(tmp_path, name=name, sampler="random", n_trials=n_trials,
                      space='"engine.max_num_seqs" = { type = "int", low = 8, high = 256, log = true }\n',
                      base_set=SMALL)
    spec = load_sweep(path)
    base = spec.load_base()
    storage, _ = open_storage(None, tmp_path / "study")
    study, _ = open_study(spec, storage, identity=spec.identity(base), resume=False)
    return spec, base, study


def test_enqueued_trials_run_first_with_their_parameters(ray_runtime: None, tmp_path: Path) -> None:
    """Trials queued with Optuna's `study.enqueue_trial` (WAITING, never started) are run by the
    next asks with the enqueued parameters and count toward n_trials once each."""
    spec, base, study = _seqs_study(tmp_path, "enqueued", 4)
    study.enqueue_trial({"engine.max_num_seqs": 17})
    study.enqueue_trial({"engine.max_num_seqs": 33})
    pool = ShardPool(ray.put(base), num_actors=2, render_artifacts=False, name_prefix="test-enqueued")
    try:
        report = SweepDriver(spec, base, study, NullTracker(), pool, n_trials=spec.n_trials).run()
    finally:
        pool.close()
    trials = study.get_trials(deepcopy=False)
    assert [t.number for t in trials] == [0, 1, 2, 3]
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert [t.params["engine.max_num_seqs"] for t in trials[:2]] == [17, 33]
    assert sorted(r.number for r in report.records) == [0, 1, 2, 3]


def test_enqueued_trials_beyond_n_trials_need_no_actors_and_are_reported(
        ray_runtime: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Resuming a finished study that also holds enqueued trials past n_trials starts no pool and
    says why those trials stay waiting; enqueued trials within n_trials still need actors."""
    from orchestrator.sweep.driver import needs_actors

    spec, base, study = _seqs_study(tmp_path, "leftover", 2)
    study.enqueue_trial({"engine.max_num_seqs": 17})
    assert needs_actors(study, spec, 2)
    pool = ShardPool(ray.put(base), num_actors=1, render_artifacts=False, name_prefix="test-leftover")
    try:
        SweepDriver(spec, base, study, NullTracker(), pool, n_trials=2).run()
    finally:
        pool.close()
    assert [t.state.name for t in study.get_trials(deepcopy=False)] == ["COMPLETE", "COMPLETE"]
    study.enqueue_trial({"engine.max_num_seqs": 33})
    with caplog.at_level(logging.WARNING, logger="orchestrator.sweep.driver"):
        assert not needs_actors(study, spec, 2)
    assert "1 enqueued trial(s) left waiting" in caplog.text
    assert needs_actors(study, spec, 3)
