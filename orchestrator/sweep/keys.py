"""Dotted scenario keys a sweep may vary: does the path exist, what type it holds, is a value valid.

A key such as `engine.max_num_seqs` names a field of the scenario's sections as written in a
scenario TOML (`ScenarioSections`). Values are checked field by field (type, the section's own
rules, catalog names for `hardware.name` and `model.name`); rules that couple several fields
(TP dividing the head count, memory fit) depend on the combination and are left to each trial
(`tp_choices` refuses only a TP entry that every combination breaks).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from orchestrator.sweep.serving import POOL_PREFIX, POOLS, SERVING_KEY, SERVING_MODES, pool_engine_key
from sim.errors import ConfigError
from sim.serde import apply_overrides, build
from sim.specs.catalog import load_hardware, load_model
from sim.specs.disaggregation import DisaggregationSection
from sim.specs.scenario import ScenarioSections

ValueKind = Literal["bool", "int", "float", "str"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyType:
    """What one scenario field holds."""

    kind: ValueKind
    optional: bool
    """The field accepts None (written `"none"` in a sweep's choices)."""
    literals: tuple[Any, ...] = ()
    """Allowed values when the field is a `Literal`; empty otherwise."""


def key_type(dotted: str) -> KeyType | None:
    """The type of scenario field `dotted`, or None if no such field exists.

    Also the sweep's `serving` switch and each pool's engine keys
    (`disaggregation.prefill.engine.max_num_seqs` has the type of `engine.max_num_seqs`).
    """
    if dotted == SERVING_KEY:
        return KeyType(kind="str", optional=False, literals=SERVING_MODES)
    engine_key = pool_engine_key(dotted)
    if engine_key is not None:
        return key_type(engine_key)
    cls: Any = ScenarioSections
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
            return None
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return None
        tp = hints[part]
        if i < len(parts) - 1:
            cls = _optional_table(tp)
            continue
        return _leaf_type(tp)
    return None


def scenario_keys() -> list[str]:
    """Every dotted scenario key a sweep may vary (for "did you mean" hints)."""
    out: list[str] = []

    def walk(cls: Any, prefix: str) -> None:
        for name, tp in typing.get_type_hints(cls).items():
            dotted = f"{prefix}{name}"
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                walk(tp, f"{dotted}.")
            elif key_type(dotted) is not None:
                out.append(dotted)

    walk(ScenarioSections, "")
    walk(DisaggregationSection, POOL_PREFIX)
    for pool in POOLS:
        out += [f"{POOL_PREFIX}{pool}.{k}" for k in out if k.startswith("engine.")]
    return [SERVING_KEY, *dict.fromkeys(out)]


def _optional_table(tp: Any) -> Any:
    """`X` for an optional section `X | None` (`[disaggregation]`), else `tp`."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and dataclasses.is_dataclass(args[0]):
            return args[0]
    return tp


def _leaf_type(tp: Any) -> KeyType | None:
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) != 1:
            return None
        tp = args[0]
    if typing.get_origin(tp) is Literal:
        literals = typing.get_args(tp)
        kinds = {type(v) for v in literals}
        kind: ValueKind = "str" if kinds == {str} else "int"
        return KeyType(kind=kind, optional=optional, literals=literals)
    names: dict[Any, ValueKind] = {bool: "bool", int: "int", float: "float", str: "str"}
    if tp in names:
        return KeyType(kind=names[tp], optional=optional)
    return None  # tables and arrays are not sweepable


def is_kind(value: object, kind: ValueKind) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def check_value(sections: dict[str, Any], dotted: str, value: object, *, source: str, where: str) -> None:
    """Raise `ConfigError` at `where` if `value` is not valid for field `dotted` on its own."""
    if dotted == SERVING_KEY:
        if value not in SERVING_MODES:
            raise ConfigError(source=source, key=where, value=value,
                              rule=f"serving is one of {', '.join(SERVING_MODES)}")
        return
    engine_key = pool_engine_key(dotted)
    if engine_key is not None:  # a pool's engine key obeys the [engine] field's own rules
        check_value(sections, engine_key, value, source=source, where=where)
        return
    if dotted.startswith(POOL_PREFIX):  # the pools must exist for the section to build
        sections = apply_overrides(sections, {
            f"{POOL_PREFIX}{pool}.num_workers": 1 for pool in POOLS
            if not isinstance((sections.get("disaggregation") or {}).get(pool), dict)})
    try:
        build(ScenarioSections, apply_overrides(sections, {dotted: value}), source=source)
        if dotted in ("hardware.name", *(f"{POOL_PREFIX}{p}.hardware" for p in POOLS)) and isinstance(value, str):
            load_hardware(value)
        elif dotted == "model.name" and isinstance(value, str):
            load_model(value)
    except ConfigError as exc:
        raise ConfigError(source=source, key=where, value=value, rule=f"not valid for {dotted}: {exc.rule}") from None
