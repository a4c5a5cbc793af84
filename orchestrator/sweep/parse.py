"""Loading sweep files: `[study]`, `[slo]`, `[base]`, `[space]`, `[sampler]`, `[capacity]` -> `SweepSpec`.

```toml
[study]
name = "quickstart"
sampler = "tpe"                 # tpe | nsga2 | grid | random
n_trials = 40
seed = 0
objectives = [{ metric = "cost_per_million_output_tokens_usd", direction = "minimize" },
              { metric = "ttft_p90_s", direction = "minimize" }]

[slo]                           # bounds on trial metrics; a number is an upper bound
ttft_p90_s = 0.5
goodput_frac = { min = 0.9 }

[base]
scenario = "../scenarios/llama3_8b-h100.toml"   # relative to this file
set = { "workload.num_prompts" = 60 }           # overrides applied before the search

[space]                         # dotted scenario keys
"hardware.name" = { choices = ["h100_sxm", "a100_sxm"] }
"engine.max_num_seqs" = { type = "int", low = 16, high = 512, log = true }
"engine.long_prefill_token_threshold" = { type = "int", low = 0, high = 4096, step = 256,
                                          when = { "engine.enable_chunked_prefill" = true } }
```

Everything is checked here, before any trial runs: unknown keys, value types, bounds against the
field they vary, `when` conditions referring to earlier space keys and to values those keys can
take, tensor-parallel sizes no trial can use (`tp_choices`). Errors are `ConfigError(file, key, value,
rule)`. No Ray, Optuna or MLflow import.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, get_args

from orchestrator.sweep.keys import is_kind
from orchestrator.sweep.metrics import is_metric_name, needs_autoscaling, unknown_metric_rule
from orchestrator.sweep.parse_search import parse_search
from orchestrator.sweep.parse_space import check_capacity_space, check_grid, is_entry, parse_param
from orchestrator.sweep.spec import BoundSpec, CapacitySpec, Direction, ObjectiveSpec, ParamSpec, SamplerName, SweepSpec
from orchestrator.sweep.toml_fields import flatten, get, known_keys, table
from orchestrator.sweep.tp_choices import check_tp_choices
from sim.errors import ConfigError
from sim.specs.catalog import read_toml_text

_SECTIONS: Final = ("study", "slo", "base", "space", "sampler", "capacity", "search")
_STUDY_KEYS: Final = ("name", "sampler", "n_trials", "seed", "objectives", "objective", "direction",
                      "slo_confidence", "interval_runs")
MAX_SLO_CONFIDENCE: Final = 0.9
"""The shipped kernel intervals are 90% central: the perturbations draw within them."""
_SAMPLER_OPTIONS: Final[dict[str, dict[str, str]]] = {
    "tpe": {"n_startup_trials": "int>=0", "n_ei_candidates": "int>=1", "multivariate": "bool"},
    "nsga2": {"population_size": "int>=2", "mutation_prob": "frac", "crossover_prob": "frac"},
    "grid": {},
    "random": {},
}
_CAPACITY_KEYS: Final = ("target_request_rate", "rate_rel_tol", "min_rate_per_replica", "max_replicas",
                         "verify_fleet")
_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and validate a sweep file, including its base scenario; raise `ConfigError` naming the key."""
    path = Path(path)
    src = str(path)
    text, data = read_toml_text(path)
    known_keys(data, _SECTIONS, src, "")
    study = table(data, "study", src, required=True)
    known_keys(study, _STUDY_KEYS, src, "study")
    name = get(study, "name", str, src, "study", required=True)
    if not _NAME_RE.match(name):
        raise ConfigError(source=src, key="study.name", value=name,
                          rule="must be letters, digits, '_', '.', '-' (it names a directory and an experiment)")
    sampler = get(study, "sampler", str, src, "study", default="tpe")
    if sampler not in get_args(SamplerName):
        raise ConfigError(source=src, key="study.sampler", value=sampler,
                          rule=f"must be one of {', '.join(get_args(SamplerName))}")
    n_trials = get(study, "n_trials", int, src, "study", default=50)
    if n_trials < 1:
        raise ConfigError(source=src, key="study.n_trials", value=n_trials, rule="must be >= 1")
    seed = get(study, "seed", int, src, "study", default=0)
    if not 0 <= seed <= 2**32 - 1:  # Optuna's samplers seed numpy's legacy RandomState: a traceback after start
        raise ConfigError(source=src, key="study.seed", value=seed, rule="must be in [0, 2**32 - 1] (it seeds "
                          "the Optuna sampler)")
    capacity = _capacity(table(data, "capacity", src), src) if "capacity" in data else None
    slo_confidence, interval_runs = _confidence(study, src)
    objectives = _objectives(study, src, required=capacity is None)
    slo = _slo(table(data, "slo", src), src)
    if capacity is not None and not slo:
        raise ConfigError(source=src, key="slo", value={}, rule="capacity planning needs at least one [slo] bound")
    base_table = table(data, "base", src, required=True)
    known_keys(base_table, ("scenario", "set"), src, "base")
    scenario_path = Path(get(base_table, "scenario", str, src, "base", required=True))
    if not scenario_path.is_absolute():
        scenario_path = path.parent / scenario_path
    base_set = flatten(table(base_table, "set", src, prefix="base"), src, "base.set", leaf=lambda v: False)
    spec_base = SweepSpec(source=src, name=name, sampler=sampler, n_trials=n_trials, seed=seed, objectives=objectives,
                          slo=slo, base_scenario=str(scenario_path.resolve()), base_set=base_set, space=(),
                          capacity=capacity, text=text)
    if not scenario_path.exists():
        raise ConfigError(source=src, key="base.scenario", value=str(scenario_path), rule="file not found")
    base = spec_base.load_base()
    if base.autoscaling is None:
        _check_no_autoscaling_metrics(objectives, slo, src)
    elif capacity is not None:
        _check_capacity_slo(slo, src)
    raw_space = flatten(table(data, "space", src), src, "space", leaf=is_entry)
    if not raw_space:
        raise ConfigError(source=src, key="space", value={}, rule="must name at least one scenario key to vary")
    space: list[ParamSpec] = []
    for key, entry in raw_space.items():
        space.append(parse_param(key, entry, space, base.sections(), src))
    check_tp_choices(space, base, src)
    if capacity is not None:
        check_capacity_space(space, src)
        if base.workload.request_rate_profile is not None:
            raise ConfigError(source=src, key="base.scenario", value=spec_base.base_scenario,
                              rule=("capacity planning probes constant request rates, but the base scenario has a "
                                    "workload.request_rate_profile; give a base with request_rate (with "
                                    "[autoscaling] the chosen fleet is simulated autoscaled), or run the profile "
                                    "with `kernelsight run` for its peak replicas and GPU-hours"))
    options = _sampler_options(table(data, "sampler", src), sampler, src)
    search = parse_search(table(data, "search", src), src, slo=slo, capacity=capacity)
    if sampler == "grid":
        check_grid(space, src)
    return SweepSpec(source=src, name=name, sampler=sampler, n_trials=n_trials, seed=seed, objectives=objectives,
                     slo=slo, base_scenario=spec_base.base_scenario, base_set=base_set, space=tuple(space),
                     sampler_options=options, capacity=capacity, search=search, text=text,
                     slo_confidence=slo_confidence, interval_runs=interval_runs)


def _check_no_autoscaling_metrics(objectives: tuple[ObjectiveSpec, ...], slo: tuple[BoundSpec, ...],
                                  src: str) -> None:
    for i, o in enumerate(objectives):
        if needs_autoscaling(o.metric):
            raise ConfigError(source=src, key=f"study.objectives[{i}].metric", value=o.metric,
                              rule="only trials of a base scenario with [autoscaling] report it; add [autoscaling] "
                                   "to the base scenario")
    for b in slo:
        if needs_autoscaling(b.metric):
            raise ConfigError(source=src, key=f"slo.{b.metric}", value=b.max_value if b.min_value is None
                              else b.min_value, rule="only trials of a base scenario with [autoscaling] report it; "
                                                     "add [autoscaling] to the base scenario")


def _check_capacity_slo(slo: tuple[BoundSpec, ...], src: str) -> None:
    """A capacity plan judges `[slo]` on its probes, one fixed replica each (the base's
    `[autoscaling]` removed): they report no autoscaling metric, so a bound on one is refused."""
    for b in slo:
        if needs_autoscaling(b.metric):
            raise ConfigError(source=src, key=f"slo.{b.metric}", value=b.max_value if b.min_value is None
                              else b.min_value,
                              rule=("capacity planning judges [slo] on one fixed replica per probe (the base's "
                                    "[autoscaling] is removed for them), which reports no autoscaling metric; bound "
                                    "the latency metrics instead (the verified autoscaled fleet's peak_replicas, "
                                    "fleet_gpu_hours and slo_attainment are in the plan's chosen row)"))


def _confidence(study: Mapping[str, Any], src: str) -> tuple[float | None, int]:
    """`slo_confidence` (0 < c <= 0.9, default off) and `interval_runs` (>= 1, default 8, only with it)."""
    conf: float | None = None
    if "slo_confidence" in study:
        raw = study["slo_confidence"]
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0.0 < raw <= MAX_SLO_CONFIDENCE:
            raise ConfigError(source=src, key="study.slo_confidence", value=raw,
                              rule=f"must be a number in (0, {MAX_SLO_CONFIDENCE}] (the shipped kernel intervals "
                                   "are 90% central)")
        conf = float(raw)
    runs = get(study, "interval_runs", int, src, "study", default=8)
    if "interval_runs" in study and conf is None:
        raise ConfigError(source=src, key="study.interval_runs", value=runs, rule="needs slo_confidence")
    if runs < 1:
        raise ConfigError(source=src, key="study.interval_runs", value=runs, rule="must be >= 1")
    return conf, runs


def _objectives(study: Mapping[str, Any], src: str, *, required: bool) -> tuple[ObjectiveSpec, ...]:
    if "objectives" in study and ("objective" in study or "direction" in study):
        raise ConfigError(source=src, key="study.objective", value=study.get("objective"),
                          rule="give either objectives = [...] or objective + direction, not both")
    if "objectives" in study:
        raw = get(study, "objectives", list, src, "study")
        items = []
        for i, item in enumerate(raw):
            where = f"study.objectives[{i}]"
            if not isinstance(item, dict):
                raise ConfigError(source=src, key=where, value=item, rule="must be a table {metric, direction}")
            known_keys(item, ("metric", "direction"), src, where)
            items.append((where, get(item, "metric", str, src, where, required=True),
                          get(item, "direction", str, src, where, default="minimize")))
    elif "objective" in study:
        items = [("study", get(study, "objective", str, src, "study"),
                  get(study, "direction", str, src, "study", default="minimize"))]
    elif required:
        raise ConfigError(source=src, key="study.objectives", value=None,
                          rule="is required: objectives = [{ metric = ..., direction = ... }] or objective = ...")
    else:
        return ()
    out: list[ObjectiveSpec] = []
    for where, metric, direction in items:
        key = f"{where}.metric" if where != "study" else "study.objective"
        if not is_metric_name(metric):
            raise ConfigError(source=src, key=key, value=metric, rule=unknown_metric_rule(str(metric)))
        if direction not in get_args(Direction):
            raise ConfigError(source=src, key=f"{where}.direction", value=direction,
                              rule="must be 'minimize' or 'maximize'")
        if any(o.metric == metric for o in out):
            raise ConfigError(source=src, key=key, value=metric, rule="appears twice")
        out.append(ObjectiveSpec(metric=metric, direction=direction))
    if not out and required:
        raise ConfigError(source=src, key="study.objectives", value=[], rule="must not be empty")
    return tuple(out)


def _slo(table: Mapping[str, Any], src: str) -> tuple[BoundSpec, ...]:
    out = []
    for metric, value in table.items():
        where = f"slo.{metric}"
        if not is_metric_name(metric):
            raise ConfigError(source=src, key=where, value=value, rule=unknown_metric_rule(metric))
        if isinstance(value, dict):
            known_keys(value, ("max", "min"), src, where)
            lo = get(value, "min", float, src, where)
            hi = get(value, "max", float, src, where)
            if lo is None and hi is None:
                raise ConfigError(source=src, key=where, value=value, rule="give min, max or both")
            if lo is not None and hi is not None and lo > hi:
                raise ConfigError(source=src, key=where, value=value, rule="min must be <= max")
            bound = BoundSpec(metric=metric, max_value=hi, min_value=lo)
        else:
            bound = BoundSpec(metric=metric, max_value=get(table, metric, float, src, "slo"))
        for side, v in (("min", bound.min_value), ("max", bound.max_value)):
            # A NaN bound compares false both ways: Optuna refuses it as a constraint, and a NaN
            # minimum would let every trial meet it.
            if v is not None and not math.isfinite(v):
                raise ConfigError(source=src, key=f"{where}.{side}" if isinstance(value, dict) else where,
                                  value=v, rule="must be a finite number")
        out.append(bound)
    return tuple(out)


def _capacity(table: Mapping[str, Any], src: str) -> CapacitySpec:
    known_keys(table, _CAPACITY_KEYS, src, "capacity")
    rate = get(table, "target_request_rate", float, src, "capacity", required=True)
    tol = get(table, "rate_rel_tol", float, src, "capacity", default=0.05)
    min_rate = get(table, "min_rate_per_replica", float, src, "capacity", default=0.05)
    max_replicas = get(table, "max_replicas", int, src, "capacity", default=256)
    verify = get(table, "verify_fleet", bool, src, "capacity", default=True)
    for key, value, ok, rule in (("target_request_rate", rate, 0 < rate < float("inf"), "must be a finite number > 0"),
                                 ("rate_rel_tol", tol, 0 < tol < 1, "must be in (0, 1)"),
                                 ("min_rate_per_replica", min_rate, 0 < min_rate < float("inf"), "must be > 0"),
                                 ("max_replicas", max_replicas, max_replicas >= 1, "must be >= 1")):
        if not ok:
            raise ConfigError(source=src, key=f"capacity.{key}", value=value, rule=rule)
    return CapacitySpec(target_request_rate=rate, rate_rel_tol=tol, min_rate_per_replica=min_rate,
                        max_replicas=max_replicas, verify_fleet=verify)


def _sampler_options(table: Mapping[str, Any], sampler: str, src: str) -> dict[str, Any]:
    allowed = _SAMPLER_OPTIONS[sampler]
    out: dict[str, Any] = {}
    for key, value in table.items():
        where = f"sampler.{key}"
        if key not in allowed:
            known = ", ".join(allowed) or "none"
            raise ConfigError(source=src, key=where, value=value,
                              rule=f"not an option of the {sampler} sampler; known: {known}")
        rule = allowed[key]
        if rule == "bool":
            ok = isinstance(value, bool)
        elif rule == "frac":
            ok = is_kind(value, "float") and 0.0 <= value <= 1.0
        else:
            ok = is_kind(value, "int") and value >= int(rule.split(">=")[1])
        if not ok:
            words = {"bool": "a boolean", "frac": "a number in [0, 1]"}.get(rule, f"an integer {rule[3:]}")
            raise ConfigError(source=src, key=where, value=value, rule=f"must be {words}")
        out[key] = value
    return out


