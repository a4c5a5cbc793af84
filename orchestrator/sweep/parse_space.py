"""`[space]` entries: each dotted scenario key with choices or an int/float range, and `when` conditions.

Checked against the scenario: the key must exist, bounds and choices must have the field's type
and pass its own rules (`keys.check_value`), `when` must refer to an earlier space key and to a
value that key can take.
"""

from __future__ import annotations

from typing import Any, Final

from orchestrator.sweep.keys import check_value, is_kind, key_type, scenario_keys
from orchestrator.sweep.spec import Condition, ParamSpec, ParamValue
from orchestrator.sweep.toml_fields import flatten, known_keys
from sim.errors import ConfigError
from sim.suggest import did_you_mean

ENTRY_KEYS: Final = ("choices", "type", "low", "high", "step", "log", "when")
PLANNER_KEYS: Final = ("engine.data_parallel_size", "workload.request_rate")
MAX_GRID_POINTS: Final = 100_000


def is_entry(value: Any) -> bool:
    """A table that describes one parameter (rather than a table of dotted sub-keys)."""
    return isinstance(value, dict) and any(k in value for k in ("choices", "type", "low", "high"))


def parse_param(key: str, entry: Any, earlier: list[ParamSpec], sections: dict[str, Any], src: str) -> ParamSpec:
    where = f'space."{key}"'
    kt = key_type(key)
    if kt is None:
        raise ConfigError(source=src, key=where, value=entry,
                          rule=f"not a scenario key; {did_you_mean(key, scenario_keys())}(a dotted path such as "
                               "engine.max_num_seqs; see docs/scenario.md)")
    if not isinstance(entry, dict):
        raise ConfigError(source=src, key=where, value=entry,
                          rule='must be a table: { choices = [...] } or { type = "int", low = ..., high = ... }')
    known_keys(entry, ENTRY_KEYS, src, where)
    when = _when(entry.get("when"), earlier, src, where)
    if "choices" in entry:
        for other in ("type", "low", "high", "step", "log"):
            if other in entry:
                raise ConfigError(source=src, key=f"{where}.{other}", value=entry[other],
                                  rule="choices and ranges do not mix")
        raw = entry["choices"]
        if not isinstance(raw, list) or not raw:
            raise ConfigError(source=src, key=f"{where}.choices", value=raw, rule="must be a non-empty array")
        choices: list[ParamValue] = []
        for i, value in enumerate(raw):
            at = f"{where}.choices[{i}]"
            val: ParamValue = None if (kt.optional and value == "none" and "none" not in kt.literals) else value
            if val is not None and not is_kind(val, kt.kind):
                raise ConfigError(source=src, key=at, value=value, rule=f"{key} holds {_KIND_WORDS[kt.kind]}")
            if any(val == c and type(val) is type(c) for c in choices):
                raise ConfigError(source=src, key=at, value=value, rule="appears twice")
            check_value(sections, key, val, source=src, where=at)
            choices.append(float(val) if kt.kind == "float" and isinstance(val, int) else val)
        return ParamSpec(key=key, kind="categorical", choices=tuple(choices), when=when)
    kind = entry.get("type")
    if kind not in ("int", "float"):
        raise ConfigError(source=src, key=f"{where}.type", value=kind,
                          rule='must be "int" or "float" (or give choices = [...])')
    if kt.kind not in ("int", "float") or kt.literals:
        raise ConfigError(source=src, key=f"{where}.type", value=kind,
                          rule=f"{key} holds {_KIND_WORDS[kt.kind]}; use choices = [...]")
    if kind == "float" and kt.kind == "int":
        raise ConfigError(source=src, key=f"{where}.type", value=kind, rule=f'{key} holds integers; use type = "int"')
    bounds: dict[str, float] = {}
    for bound in ("low", "high", "step"):
        if bound not in entry:
            if bound == "step":
                continue
            raise ConfigError(source=src, key=f"{where}.{bound}", value=None, rule="is required")
        value = entry[bound]
        if not is_kind(value, kind):
            raise ConfigError(source=src, key=f"{where}.{bound}", value=value,
                              rule=f"must be {'an integer' if kind == 'int' else 'a number'} (type = \"{kind}\")")
        bounds[bound] = value
    log = entry.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(source=src, key=f"{where}.log", value=log, rule="must be a boolean")
    low, high = bounds["low"], bounds["high"]
    if low > high:
        raise ConfigError(source=src, key=f"{where}.high", value=high, rule=f"must be >= low={low}")
    step = bounds.get("step")
    if step is not None and step <= 0:
        raise ConfigError(source=src, key=f"{where}.step", value=step, rule="must be > 0")
    if log and low <= 0:
        raise ConfigError(source=src, key=f"{where}.low", value=low, rule="must be > 0 with log = true")
    if log and step is not None and not (kind == "int" and step == 1):
        raise ConfigError(source=src, key=f"{where}.step", value=step, rule="cannot be combined with log = true")
    for bound in ("low", "high"):
        check_value(sections, key, bounds[bound], source=src, where=f"{where}.{bound}")
    if kind == "int" and step is None:
        step = 1
    return ParamSpec(key=key, kind=kind, low=low, high=high, step=step, log=log, when=when)


_KIND_WORDS: Final[dict[str, str]] = {"bool": "booleans", "int": "integers", "float": "numbers", "str": "strings"}


def _when(raw: Any, earlier: list[ParamSpec], src: str, where: str) -> tuple[Condition, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(source=src, key=f"{where}.when", value=raw, rule='must be a table { "other.key" = value }')
    conditions = []
    by_key = {p.key: p for p in earlier}
    for key, value in flatten(raw, src, f"{where}.when", leaf=lambda v: False).items():
        at = f'{where}.when."{key}"'
        param = by_key.get(key)
        if param is None:
            raise ConfigError(source=src, key=at, value=value,
                              rule="refers to a key that is not in [space] above this entry")
        raw_values = tuple(value) if isinstance(value, list) else (value,)
        values = tuple(_as_drawn(param, v) for v in raw_values)
        for raw_v, v in zip(raw_values, values, strict=True):
            if not param.admits(v):
                raise ConfigError(source=src, key=at, value=raw_v, rule=f"is not a value {key} can take in this sweep")
        conditions.append(Condition(key=key, values=values))
    return tuple(conditions)


def _as_drawn(param: ParamSpec, value: Any) -> Any:
    """A `when` value as the parameter draws it: `"none"` is None where the choices hold None (an unset
    optional key), and an integer is a float for a float parameter (`1` matches a drawn `1.0`)."""
    if value == "none" and param.kind == "categorical" and None in param.choices and "none" not in param.choices:
        return None
    float_param = param.kind == "float" or (param.kind == "categorical" and param.choices
                                            and all(isinstance(c, float) or c is None for c in param.choices))
    if float_param and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def check_capacity_space(space: list[ParamSpec], src: str) -> None:
    for p in space:
        if p.key in PLANNER_KEYS:
            raise ConfigError(source=src, key=f'space."{p.key}"', value=p.key,
                              rule="capacity planning sets this key itself; remove it from [space]")
        if p.kind != "categorical":
            raise ConfigError(source=src, key=f'space."{p.key}"', value=p.kind,
                              rule="capacity planning enumerates candidates: use choices = [...]")


def check_grid(space: list[ParamSpec], src: str) -> None:
    size = 1
    for p in space:
        if p.kind == "float" and p.step is None:
            raise ConfigError(source=src, key=f'space."{p.key}".step', value=None,
                              rule="the grid sampler needs a step for float ranges")
        if p.log and p.kind == "int":
            raise ConfigError(source=src, key=f'space."{p.key}".log', value=True,
                              rule="the grid sampler walks ranges by step; drop log = true or use choices")
        size *= len(p.grid_values())
    if size > MAX_GRID_POINTS:
        raise ConfigError(source=src, key="space", value=size,
                          rule=f"the grid has {size} points, over {MAX_GRID_POINTS}; use tpe or random")


