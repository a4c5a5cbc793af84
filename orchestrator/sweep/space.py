"""Drawing a trial's parameters from a `[space]`: conditional keys, grid search spaces.

`suggest_params` works with any object that has Optuna's `suggest_categorical`, `suggest_int` and
`suggest_float` (a live `optuna.Trial`, or `optuna.trial.FixedTrial` in tests). Parameters are
drawn in file order, so a `when` condition always sees the value it depends on; an inactive
parameter is not drawn at all and keeps the base scenario's value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from orchestrator.sweep.spec import ParamSpec, ParamValue


class TrialLike(Protocol):
    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float: ...


def is_active(param: ParamSpec, drawn: Mapping[str, ParamValue]) -> bool:
    """All of `param`'s conditions hold for the values drawn so far."""
    for cond in param.when:
        if cond.key not in drawn:
            return False
        value = drawn[cond.key]
        if not any(value == v and type(value) is type(v) for v in cond.values):
            return False
    return True


def suggest_params(trial: TrialLike, space: Sequence[ParamSpec]) -> dict[str, ParamValue]:
    """The trial's active parameters under their dotted scenario keys."""
    drawn: dict[str, ParamValue] = {}
    for p in space:
        if not is_active(p, drawn):
            continue
        if p.kind == "categorical":
            drawn[p.key] = trial.suggest_categorical(p.key, list(p.choices))
        elif p.kind == "int":
            assert p.low is not None and p.high is not None and p.step is not None
            drawn[p.key] = trial.suggest_int(p.key, int(p.low), int(p.high), step=int(p.step), log=p.log)
        else:
            assert p.low is not None and p.high is not None
            drawn[p.key] = trial.suggest_float(p.key, float(p.low), float(p.high), step=p.step, log=p.log)
    return drawn


def grid_search_space(space: Sequence[ParamSpec]) -> dict[str, list[ParamValue]]:
    """Every parameter's grid values, as Optuna's `GridSampler` wants them."""
    return {p.key: list(p.grid_values()) for p in space}


def candidate_grid(space: Sequence[ParamSpec]) -> list[dict[str, ParamValue]]:
    """All combinations of categorical parameters, conditions applied, duplicates dropped (file order)."""
    combos: list[dict[str, ParamValue]] = [{}]
    for p in space:
        grown: list[dict[str, ParamValue]] = []
        for combo in combos:
            if is_active(p, combo):
                grown += [{**combo, p.key: v} for v in p.grid_values()]
            else:
                grown.append(combo)
        combos = grown
    unique: dict[tuple[tuple[str, Any], ...], dict[str, ParamValue]] = {}
    for combo in combos:
        unique.setdefault(tuple(sorted((k, (type(v).__name__, v)) for k, v in combo.items())), combo)
    return list(unique.values())


def probe_values(param: ParamSpec, space: Sequence[ParamSpec]) -> tuple[ParamValue, ...]:
    """Values that stand for `param` when combinations are enumerated: its choices, or a range's two
    ends and the values `when` conditions of `space` test it for (so that they can hold)."""
    if param.kind == "categorical":
        return param.choices
    assert param.low is not None and param.high is not None
    cast = int if param.kind == "int" else float
    tested = [v for p in space for c in p.when if c.key == param.key for v in c.values]
    return tuple(dict.fromkeys([cast(param.low), cast(param.high), *tested]))


def iter_combos(space: Sequence[ParamSpec], values: Callable[[ParamSpec], Sequence[ParamValue]]
                ) -> Iterator[dict[str, ParamValue]]:
    """Every combination of `values(param)` over `space` in file order, conditions applied (an inactive
    parameter is left out), one at a time: callers stop at the first combination that answers them."""

    def walk(i: int, drawn: dict[str, ParamValue]) -> Iterator[dict[str, ParamValue]]:
        if i == len(space):
            yield dict(drawn)
            return
        p = space[i]
        if not is_active(p, drawn):
            yield from walk(i + 1, drawn)
            return
        for v in values(p):
            drawn[p.key] = v
            yield from walk(i + 1, drawn)
            del drawn[p.key]

    return walk(0, {})
