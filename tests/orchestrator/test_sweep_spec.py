"""Sweep files, parameter drawing, objectives, caching, storage and reports, without Ray or MLflow."""

from __future__ import annotations

import dataclasses
import math
import pickle
import textwrap
from pathlib import Path

import optuna
import pytest
from conftest import REPO

from orchestrator.cli import main
from orchestrator.sweep.cache import ResultCache
from orchestrator.sweep.evaluate import TrialEvaluator
from orchestrator.sweep.objective import constraint_values, objective_values, pareto_indices
from orchestrator.sweep.parse import load_sweep
from orchestrator.sweep.report import TrialRecord, select_best
from orchestrator.sweep.results import Breakdown, TrialInput, TrialResult, TrialStatus
from orchestrator.sweep.space import candidate_grid, suggest_params
from orchestrator.sweep.spec import BoundSpec, ObjectiveSpec
from orchestrator.sweep.study import JOURNAL_FILE, open_storage, open_study, repair_journal, sqlalchemy_url, tell
from orchestrator.sweep.vllm_command import vllm_serve_command
from sim.errors import ConfigError

SCENARIO = REPO / "scenarios" / "llama3_8b-h100.toml"

GOOD = f"""
[study]
name = "unit"
sampler = "tpe"
n_trials = 8
objectives = [{{ metric = "cost_per_million_output_tokens_usd", direction = "minimize" }},
              {{ metric = "ttft_p90_s", direction = "minimize" }}]

[slo]
tpot_p90_s = 0.05
goodput_frac = {{ min = 0.9 }}

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 12, "workload.random_input_len" = 128, "workload.random_output_len" = 8 }}

[space]
"hardware.name" = {{ choices = ["h100_sxm", "a100_sxm"] }}
"engine.max_num_seqs" = {{ type = "int", low = 8, high = 256, log = true }}
"engine.enable_chunked_prefill" = {{ choices = [true, false] }}
"engine.max_num_batched_tokens" = {{ choices = [2048, 8192], when = {{ "engine.enable_chunked_prefill" = true }} }}
"engine.quantization" = {{ choices = ["none", "fp8"] }}
"""


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_every_shipped_sweep_passes_check(capsys: pytest.CaptureFixture[str]) -> None:
    sweeps = sorted(str(p) for p in (REPO / "sweeps").glob("*.toml"))
    assert len(sweeps) >= 3
    assert main(["check", *sweeps]) == 0
    out = capsys.readouterr().out
    assert out.count("ok    ") == len(sweeps) and "capacity plan" in out


def test_good_sweep_loads_with_types_conditions_and_none(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    assert [p.key for p in spec.space][:2] == ["hardware.name", "engine.max_num_seqs"]
    seqs = spec.param("engine.max_num_seqs")
    assert (seqs.kind, seqs.low, seqs.high, seqs.step, seqs.log) == ("int", 8, 256, 1, True)
    batched = spec.param("engine.max_num_batched_tokens")
    assert batched.when[0].key == "engine.enable_chunked_prefill" and batched.when[0].values == (True,)
    assert spec.param("engine.quantization").choices == (None, "fp8")
    assert spec.slo == (BoundSpec(metric="tpot_p90_s", max_value=0.05), BoundSpec(metric="goodput_frac", min_value=0.9))
    assert dict(spec.base_set)["workload.num_prompts"] == 12


BAD_CASES = [
    ("[studyy]\nname = 'x'\n", "studyy", "unknown key"),
    ("", 'space."engine.max_num_seqs".lowx', "unknown key"),
    ("", 'space."engine.max_num_seq"', "not a scenario key"),
    ("", 'space."engine.max_num_seqs".low', "must be an integer"),
    ("", 'space."engine.tensor_parallel_size".choices[1]', "holds integers"),
    ("", 'space."engine.max_num_batched_tokens".when."engine.enable_chunked_prefil"', "not in [space] above"),
    ("", 'space."engine.kv_cache_dtype".choices[1]', "must be one of"),
    ("", 'space."hardware.name".choices[1]', "unknown hardware"),
    ("", 'space."engine.block_size".choices[1]', "vLLM's choices"),
    ("", "study.objectives[0].metric", "unknown metric"),
    ("", "slo.ttft_p91_s", "unknown metric"),
    ("", 'space."engine.max_num_seqs".type', 'holds integers; use type = "int"'),
    ("", "study.seed", "must be in [0, 2**32 - 1]"),  # Optuna's samplers raised ValueError at start
]
EDITS = {
    'space."engine.max_num_seqs".lowx': ('low = 8, high', 'lowx = 8, low = 8, high'),
    'space."engine.max_num_seq"': ('"engine.max_num_seqs"', '"engine.max_num_seq"'),
    'space."engine.max_num_seqs".low': ('low = 8,', 'low = 8.5,'),
    'space."engine.tensor_parallel_size".choices[1]': (
        '"engine.quantization"', '"engine.tensor_parallel_size" = { choices = [1, "2"] }\n"engine.quantization"'),
    'space."engine.max_num_batched_tokens".when."engine.enable_chunked_prefil"': (
        '"engine.enable_chunked_prefill" = true }', '"engine.enable_chunked_prefil" = true }'),
    'space."engine.kv_cache_dtype".choices[1]': (
        '"engine.quantization"', '"engine.kv_cache_dtype" = { choices = ["auto", "fp4"] }\n"engine.quantization"'),
    'space."hardware.name".choices[1]': ('"a100_sxm"', '"a100_sxmm"'),
    'space."engine.block_size".choices[1]': (
        '"engine.quantization"', '"engine.block_size" = { choices = [16, 48] }\n"engine.quantization"'),
    "study.objectives[0].metric": ('metric = "cost_per_million_output_tokens_usd"', 'metric = "cost_usd"'),
    "slo.ttft_p91_s": ("tpot_p90_s = 0.05", "tpot_p90_s = 0.05\nttft_p91_s = 1.0"),
    "study.seed": ('n_trials = 8', 'n_trials = 8\nseed = -3'),
    'space."engine.max_num_seqs".type': ('"engine.max_num_seqs" = { type = "int"', '"engine.max_num_seqs" = { type = "float"'),
}


@pytest.mark.parametrize(("prefix", "key", "rule"), BAD_CASES, ids=[c[1] for c in BAD_CASES])
def test_bad_sweep_exits_2_naming_the_key(prefix: str, key: str, rule: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    text = prefix + GOOD
    if key in EDITS:
        old, new = EDITS[key]
        assert old in text
        text = text.replace(old, new, 1)
    path = write(tmp_path, text)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err and rule in err and str(path) in err
    assert main(["sweep", str(path), "--study-dir", str(tmp_path / "study")]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "study").exists()


TP_SWEEP = f"""
[study]
name = "tp"
sampler = "random"
n_trials = 4
objective = "ttft_p90_s"

[base]
scenario = "{SCENARIO}"
set = {{ "workload.num_prompts" = 8 }}

[space]
"""


@pytest.mark.parametrize(("space", "key", "rules"), [
    ('"engine.tensor_parallel_size" = { choices = [3, 5] }\n"engine.max_num_seqs" = { type = "int", low = 8, high = 64 }',
     'space."engine.tensor_parallel_size".choices', ["3: must divide the model's num_attention_heads=32",
                                                    "5: must divide the model's num_attention_heads=32"]),
    # 64 divides Llama-3.1-70B's 64 heads, not the 32 of either model here
    ('"model.name" = { choices = ["meta-llama/Llama-3.1-8B", "mistralai/Mistral-7B-v0.1"] }\n'
     '"engine.tensor_parallel_size" = { choices = [64] }', 'space."engine.tensor_parallel_size".choices',
     ["64: must divide the model's num_attention_heads=32"]),
    ('"engine.tensor_parallel_size" = { type = "int", low = 3, high = 3 }', 'space."engine.tensor_parallel_size"',
     ["3: must divide"]),
    ('"serving" = { choices = ["aggregated", "disaggregated"] }\n'
     '"disaggregation.decode.engine.tensor_parallel_size" = { choices = [6], when = { serving = "disaggregated" } }',
     'space."disaggregation.decode.engine.tensor_parallel_size".choices', ["6: must divide", "in the decode pool"]),
])
def test_tp_values_no_trial_can_use_are_refused_on_check(space: str, key: str, rules: list[str], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, TP_SWEEP + space + "\n")
    with pytest.raises(ConfigError) as exc:
        load_sweep(path)
    assert exc.value.key == key and exc.value.source == str(path)
    assert all(rule in exc.value.rule for rule in rules), exc.value.rule
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert key in err and str(path) in err and rules[0] in err


@pytest.mark.parametrize("space", [
    # 3 fails, 2 works: the sweep can run
    '"engine.tensor_parallel_size" = { choices = [3, 2] }',
    # 64 fails for the 8B model but works for the 70B one
    '"model.name" = { choices = ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-70B"] }\n'
    '"engine.tensor_parallel_size" = { choices = [64] }',
    # the 70B model is drawn only where TP is 64: the combination works
    '"engine.tensor_parallel_size" = { choices = [64] }\n'
    '"model.name" = { choices = ["meta-llama/Llama-3.1-70B"], when = { "engine.tensor_parallel_size" = 64 } }',
    # TP 16 spans two 8-GPU H100 nodes, which a trial simulates
    '"engine.tensor_parallel_size" = { choices = [16] }',
])
def test_tp_values_some_trial_can_use_are_accepted(space: str, tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, TP_SWEEP + space + "\n"))
    assert any(p.key == "engine.tensor_parallel_size" for p in spec.space)


def test_when_on_a_later_key_is_rejected(tmp_path: Path) -> None:
    text = GOOD.replace('"engine.enable_chunked_prefill" = { choices = [true, false] }\n', "")
    text += '"engine.enable_chunked_prefill" = { choices = [true, false] }\n'
    with pytest.raises(ConfigError, match="above this entry"):
        load_sweep(write(tmp_path, text))


def test_capacity_needs_choices_and_owns_rate_and_replicas(tmp_path: Path) -> None:
    text = GOOD.replace("[slo]", "[capacity]\ntarget_request_rate = 10.0\n\n[slo]")
    with pytest.raises(ConfigError, match="use choices") as exc:
        load_sweep(write(tmp_path, text))
    assert exc.value.key == 'space."engine.max_num_seqs"'
    text = text.replace('"engine.max_num_seqs" = { type = "int", low = 8, high = 256, log = true }',
                        '"workload.request_rate" = { choices = [1.0, 2.0] }')
    with pytest.raises(ConfigError, match="sets this key itself"):
        load_sweep(write(tmp_path, text))


def test_grid_sampler_needs_steps_on_float_ranges(tmp_path: Path) -> None:
    text = GOOD.replace('sampler = "tpe"', 'sampler = "grid"').replace(
        '"engine.max_num_seqs" = { type = "int", low = 8, high = 256, log = true }',
        '"engine.gpu_memory_utilization" = { type = "float", low = 0.8, high = 0.9 }')
    with pytest.raises(ConfigError, match="needs a step"):
        load_sweep(write(tmp_path, text))
    spec = load_sweep(write(tmp_path, text.replace("high = 0.9 }", "high = 0.9, step = 0.05 }")))
    assert spec.param("engine.gpu_memory_utilization").grid_values() == pytest.approx((0.8, 0.85, 0.9))


def test_inactive_parameter_is_not_drawn(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    fixed = {"hardware.name": "a100_sxm", "engine.max_num_seqs": 64, "engine.enable_chunked_prefill": False,
             "engine.max_num_batched_tokens": 2048, "engine.quantization": None}
    params = suggest_params(optuna.trial.FixedTrial(fixed), spec.space)
    assert params == {k: v for k, v in fixed.items() if k != "engine.max_num_batched_tokens"}
    fixed["engine.enable_chunked_prefill"] = True
    assert suggest_params(optuna.trial.FixedTrial(fixed), spec.space)["engine.max_num_batched_tokens"] == 2048


def test_candidate_grid_applies_conditions_and_drops_duplicates(tmp_path: Path) -> None:
    text = GOOD.replace('"engine.max_num_seqs" = { type = "int", low = 8, high = 256, log = true }\n', "")
    spec = load_sweep(write(tmp_path, text))
    # hardware 2 x (chunked: 2 batched sizes + unchunked: 1) x quantization 2 = 12
    grid = candidate_grid(spec.space)
    assert len(grid) == 12
    assert sum("engine.max_num_batched_tokens" not in g for g in grid) == 4


def test_slo_violations_objectives_and_pareto_by_hand() -> None:
    metrics = {"ttft_p90_s": 0.7, "goodput_frac": 0.85, "tpot_p90_s": math.nan, "cost": 2.0}
    bounds = (BoundSpec(metric="ttft_p90_s", max_value=0.5), BoundSpec(metric="goodput_frac", min_value=0.9),
              BoundSpec(metric="tpot_p90_s", max_value=0.05))
    assert constraint_values(metrics, bounds) == pytest.approx({"ttft_p90_s": 0.2, "goodput_frac": 0.05,
                                                                "tpot_p90_s": math.inf})
    objectives = (ObjectiveSpec(metric="cost", direction="minimize"),
                  ObjectiveSpec(metric="ttft_p90_s", direction="maximize"))
    assert objective_values(metrics, objectives) == [2.0, 0.7]
    assert objective_values(metrics, (ObjectiveSpec(metric="tpot_p90_s", direction="minimize"),)) is None
    points = [(1.0, 1.0), (2.0, 3.0), (2.0, 0.5), (0.5, 0.2), (1.0, 1.0)]
    assert pareto_indices(points, objectives) == [0, 1, 3, 4]


def _record(number: int, values: tuple[float, ...], ttft: float, state: str = "COMPLETE") -> TrialRecord:
    result = TrialResult(number=number, status=TrialStatus.OK, params={"x": number},
                         metrics={"cost": values[0], "ttft_p90_s": ttft})
    return TrialRecord(number=number, state=state, values=values, result=result)


def test_best_trials_collapse_ties_and_fall_back_to_closest_misses(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    spec = dataclasses.replace(spec, objectives=(ObjectiveSpec(metric="cost", direction="minimize"),),
                               slo=(BoundSpec(metric="ttft_p90_s", max_value=1.0),))
    records = [_record(0, (3.0,), 0.5), _record(1, (1.0,), 2.0), _record(2, (2.0,), 0.9), _record(3, (2.0,), 0.4),
               _record(4, (0.5,), 0.1, state="PRUNED")]
    sel = select_best(records, spec)
    assert sel.best == (2, 0) and sel.ties == {2: (3,)} and sel.closest == ()
    misses = [_record(0, (3.0,), 1.5), _record(1, (1.0,), 3.0)]
    sel = select_best(misses, spec)
    assert sel.best == () and sel.closest == (0, 1)


def test_trial_result_round_trips_through_optuna_attrs_and_pickle() -> None:
    bd = Breakdown(seconds_by_kind={"gemm": 2.0}, seconds_by_name={"qkv_proj": 2.0}, host_s=1.0, launch_floor_s=1.0)
    res = TrialResult(number=3, status=TrialStatus.OK, params={"engine.quantization": None, "a": True},
                      scenario_hash="h", metrics={"x": math.inf, "y": math.nan, "z": 1.5}, breakdown=bd,
                      artifacts={"f": b"1"}, ray_node_id="n1")
    back = TrialResult.from_attrs(3, res.params, res.to_attrs())
    assert back.ray_node_id == "n1"
    assert back.metrics["x"] == math.inf and math.isnan(back.metrics["y"]) and back.metrics["z"] == 1.5
    assert back.breakdown == bd and back.artifacts == {}
    assert bd.share_by_kind() == {"gemm": 0.5, "host": 0.25, "launch_floor": 0.25}
    again = pickle.loads(pickle.dumps(res))
    assert again.to_attrs() == res.to_attrs() and again.artifacts == res.artifacts  # NaN != NaN, so via attrs
    copy = res.for_trial(7, {"a": False})
    assert (copy.number, copy.cached_from, copy.params) == (7, 3, {"a": False})


def test_cache_runs_a_scenario_once_and_hands_waiters_back() -> None:
    cache = ResultCache()
    first, second = TrialInput(number=0, params={"a": 1}), TrialInput(number=1, params={"a": 1})
    assert cache.claim("h", first) and not cache.claim("h", second)
    failed = TrialResult(number=0, status=TrialStatus.FAILED, params={"a": 1}, scenario_hash="h")
    assert cache.settle("h", failed) == [second] and cache.hit("h", second) is None
    assert cache.claim("h", second)
    ok = TrialResult(number=1, status=TrialStatus.OK, params={"a": 1}, scenario_hash="h", metrics={"m": 1.0})
    assert cache.settle("h", ok) == []
    hit = cache.hit("h", TrialInput(number=5, params={"a": 1}))
    assert hit is not None and hit.number == 5 and hit.cached_from == 1 and cache.num_hits == 1


def test_evaluator_classifies_ok_infeasible_invalid_and_failed(tmp_path: Path) -> None:
    good = tmp_path / "trace.csv"
    good.write_text("input_tokens,output_tokens\n" + "64,4\n" * 12)
    broken = tmp_path / "broken.csv"
    broken.mkdir()  # opening a directory raises IsADirectoryError inside the simulator
    spec = load_sweep(write(tmp_path, GOOD.replace('"workload.num_prompts" = 12,',
                                                   '"workload.num_prompts" = 12, "workload.dataset_name" = "custom", '
                                                   f'"workload.dataset_path" = "{good}",')))
    ev = TrialEvaluator(spec.load_base(), render_artifacts=True)
    ok = ev.evaluate(TrialInput(number=0, params={}))
    assert ok.status is TrialStatus.OK and ok.metrics["num_completed"] == 12 and ok.scenario_hash
    assert set(ok.artifacts) == {"kernel_breakdown.parquet", "kernel_breakdown.png"}
    infeasible = ev.evaluate(TrialInput(number=1, params={"engine.gpu_memory_utilization": 0.15}))
    assert infeasible.status is TrialStatus.INFEASIBLE and "gpu_memory_utilization" in infeasible.reason
    invalid = ev.evaluate(TrialInput(number=2, params={"engine.tensor_parallel_size": 3}))
    assert invalid.status is TrialStatus.INVALID and "num_attention_heads" in invalid.reason
    failed = ev.evaluate(TrialInput(number=3, params={"workload.dataset_path": str(broken)}))
    assert failed.status is TrialStatus.FAILED and "IsADirectoryError" in failed.reason


def test_tell_records_state_constraints_and_result_once(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    storage, _ = open_storage(None, tmp_path / "study")
    study, existed = open_study(spec, storage, identity="id", resume=False)
    assert not existed
    metrics = {"cost_per_million_output_tokens_usd": 1.0, "ttft_p90_s": 0.2, "tpot_p90_s": 0.06, "goodput_frac": 1.0}
    ok = study.ask()
    assert tell(study, ok, TrialResult(number=0, status=TrialStatus.OK, params={}, metrics=metrics), spec).name \
        == "COMPLETE"
    assert tell(study, ok, TrialResult(number=0, status=TrialStatus.OK, params={}, metrics=metrics), spec).name \
        == "COMPLETE"  # a second tell is a no-op
    infeasible = study.ask()
    tell(study, infeasible, TrialResult(number=1, status=TrialStatus.INFEASIBLE, params={}, reason="too big"), spec)
    failed = study.ask()
    tell(study, failed, TrialResult(number=2, status=TrialStatus.FAILED, params={}, reason="boom"), spec)
    t0, t1, t2 = study.get_trials()
    assert t0.values == [1.0, 0.2] and t0.constraints == pytest.approx(
        {"tpot_p90_s": 0.01 / 0.05, "goodput_frac": -0.1 / 0.9, "config_runs": 0.0})
    assert t1.state.name == "PRUNED" and t1.constraints == {"config_runs": math.inf}
    assert t2.state.name == "FAIL" and t2.user_attrs["kernelsight"]["reason"] == "boom"
    assert study.best_trials == []  # the only complete trial misses the TPOT bound


def _optuna_violation(trial: optuna.trial.FrozenTrial) -> float:
    """How TPE (`_get_infeasible_trial_score`) and NSGA-II (`_constrained_dominates`) rank infeasible
    trials: the sum of the positive constraint values, lower first."""
    return sum(v for v in trial.constraints.values() if v > 0)


def test_a_configuration_that_cannot_run_ranks_below_every_runnable_miss(tmp_path: Path) -> None:
    """Before, an out-of-memory or invalid configuration was told `config_runs = 1` and the [slo] misses
    their raw differences: a runnable trial at TTFT p90 = 20 s against a 2 s bound (violation 18) ranked
    below a configuration that cannot run at all, so TPE's good group filled with unrunnable ones."""
    text = GOOD.replace("tpot_p90_s = 0.05\n", "tpot_p90_s = 0.05\nttft_p90_s = 2.0\n")
    spec = load_sweep(write(tmp_path, text))
    study, _ = open_study(spec, open_storage(None, tmp_path / "study")[0], identity="id", resume=False)
    metrics = {"cost_per_million_output_tokens_usd": 1.0, "ttft_p90_s": 20.0, "tpot_p90_s": 0.04,
               "goodput_frac": 0.95}
    tell(study, study.ask(), TrialResult(number=0, status=TrialStatus.OK, params={}, metrics=metrics), spec)
    tell(study, study.ask(), TrialResult(number=1, status=TrialStatus.INFEASIBLE, params={}, reason="OOM"), spec)
    tell(study, study.ask(), TrialResult(number=2, status=TrialStatus.INVALID, params={}, reason="TP"), spec)
    ran, oom, invalid = study.get_trials()
    assert ran.constraints["ttft_p90_s"] == pytest.approx(9.0)  # (20 - 2) / 2
    assert _optuna_violation(ran) < _optuna_violation(oom) == _optuna_violation(invalid)
    from optuna.samplers._tpe.sampler import _get_infeasible_trial_score

    assert sorted([oom, ran], key=_get_infeasible_trial_score)[0].number == 0


def test_closest_misses_weigh_bounds_in_their_own_units(tmp_path: Path) -> None:
    """A 1% miss of a 1000 tokens/s floor is closer than a TTFT 10x over its 1 s bound (before: raw
    differences summed, 10 against 9, the other way round)."""
    text = GOOD.replace("tpot_p90_s = 0.05\ngoodput_frac = { min = 0.9 }\n",
                        "ttft_p90_s = 1.0\noutput_throughput_tokens_per_s = { min = 1000.0 }\n")
    spec = load_sweep(write(tmp_path, text))
    slow = {"cost_per_million_output_tokens_usd": 1.0, "ttft_p90_s": 10.0, "output_throughput_tokens_per_s": 2000.0}
    short = {"cost_per_million_output_tokens_usd": 1.0, "ttft_p90_s": 0.5, "output_throughput_tokens_per_s": 990.0}
    records = [TrialRecord(number=i, state="COMPLETE", values=(1.0, m["ttft_p90_s"]),
                           result=TrialResult(number=i, status=TrialStatus.OK, params={}, metrics=m))
               for i, m in enumerate((slow, short))]
    selection = select_best(records, spec)
    assert selection.best == () and selection.closest == (1, 0)


def test_existing_study_needs_resume_and_the_same_sweep(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    storage, _ = open_storage(f"sqlite:///{tmp_path / 'optuna.db'}", tmp_path)
    open_study(spec, storage, identity="a", resume=False)
    with pytest.raises(ConfigError, match="--resume"):
        open_study(spec, storage, identity="a", resume=False)
    assert open_study(spec, storage, identity="a", resume=True)[1]
    with pytest.raises(ConfigError, match="changed since this study started"):
        open_study(spec, storage, identity="b", resume=True)


def test_identity_ignores_n_trials_but_not_the_space(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    base = spec.load_base()
    more = load_sweep(write(tmp_path, GOOD.replace("n_trials = 8", "n_trials = 80"), "b.toml"))
    other = load_sweep(write(tmp_path, GOOD.replace("high = 256", "high = 512"), "c.toml"))
    assert spec.identity(base) == more.identity(base) != other.identity(base)


def test_identity_changes_with_the_simulator_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A study started by another kernelsight release is not resumed: its stored results were priced
    by that release."""
    from sim import api

    spec = load_sweep(write(tmp_path, GOOD))
    base = spec.load_base()
    now = spec.identity(base)
    monkeypatch.setattr(api, "__version__", "0.0.1")
    assert spec.identity(base) != now


def test_journal_repair_drops_a_torn_last_record(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    storage, _ = open_storage(None, tmp_path / "s")
    study, _ = open_study(spec, storage, identity="x", resume=False)
    study.ask()
    path = tmp_path / "s" / JOURNAL_FILE
    intact = path.read_bytes()
    path.write_bytes(intact + b'{"op_code": 5, "worker_id": "w", "trial_')
    repair_journal(path)
    assert path.read_bytes() == intact
    storage, _ = open_storage(None, tmp_path / "s")
    assert len(open_study(spec, storage, identity="x", resume=True)[0].trials) == 1


def test_vllm_serve_line_carries_only_non_default_settings(tmp_path: Path) -> None:
    spec = load_sweep(write(tmp_path, GOOD))
    scenario = spec.load_base().with_overrides({"engine.tensor_parallel_size": 2, "engine.max_num_seqs": 64,
                                                "engine.enable_prefix_caching": False,
                                                "engine.kv_cache_dtype": "fp8", "engine.data_parallel_size": 3})
    assert vllm_serve_command(scenario) == (
        "vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --data-parallel-size 3 "
        "--max-model-len 8192 --max-num-seqs 64 --no-enable-prefix-caching --kv-cache-dtype fp8")


def test_bare_postgresql_url_uses_the_installed_driver() -> None:
    from importlib.util import find_spec

    url = "postgresql://ks:pw@127.0.0.1:5432/optuna"
    expected = url if find_spec("psycopg") is not None or find_spec("psycopg2") is None else \
        "postgresql+psycopg2://ks:pw@127.0.0.1:5432/optuna"
    assert sqlalchemy_url(url) == expected
    assert sqlalchemy_url("postgresql+psycopg2://h/db") == "postgresql+psycopg2://h/db"
    assert sqlalchemy_url("sqlite:///x.db") == "sqlite:///x.db"


AUTOSCALED_BASE = """
seed = 0
[hardware]
name = "h100_sxm"
[model]
name = "meta-llama/Llama-3.1-8B"
[engine]
data_parallel_size = 4
[workload]
num_prompts = 40
request_rate = 8.0
random_input_len = 128
random_output_len = 8
[autoscaling]
min_replicas = 1
target_ongoing_requests = 8
interval_s = 1.0
startup_delay_s = 1.0
"""

AUTOSCALING_OBJECTIVE = """
[study]
name = "autoscaled"
n_trials = 2
objectives = [{{ metric = "gpu_hours", direction = "minimize" }}]

[slo]
slo_attainment = {{ min = 0.5 }}

[base]
scenario = "{base}"

[space]
"engine.max_num_seqs" = {{ choices = [16, 64] }}
"""


def test_autoscaling_metrics_are_objectives_only_with_an_autoscaled_base(tmp_path: Path) -> None:
    base = tmp_path / "autoscaled.toml"
    base.write_text(AUTOSCALED_BASE)
    spec = load_sweep(write(tmp_path, AUTOSCALING_OBJECTIVE.format(base=base)))
    assert spec.objectives[0].metric == "gpu_hours" and spec.slo[0].metric == "slo_attainment"
    result = TrialEvaluator(spec.load_base()).evaluate(TrialInput(number=0, params={"engine.max_num_seqs": 16}))
    assert result.status is TrialStatus.OK and result.metrics["gpu_hours"] > 0
    assert 0.0 <= result.metrics["slo_attainment"] <= 1.0
    assert list(objective_values(result.metrics, spec.objectives)) == [result.metrics["gpu_hours"]]
    assert len(constraint_values(result.metrics, spec.slo)) == 1
    with pytest.raises(ConfigError) as err:
        load_sweep(write(tmp_path, AUTOSCALING_OBJECTIVE.format(base=SCENARIO), name="plain.toml"))
    assert err.value.key == "study.objectives[0].metric" and "[autoscaling]" in err.value.rule
    with pytest.raises(ConfigError) as err:
        load_sweep(write(tmp_path, AUTOSCALING_OBJECTIVE.format(base=SCENARIO).replace(
            'metric = "gpu_hours"', 'metric = "ttft_p90_s"'), name="slo.toml"))
    assert err.value.key == "slo.slo_attainment"
