"""Reading TOML tables strictly: unknown keys, wrong types and missing keys become `ConfigError`s
naming the file and the dotted key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from sim.errors import ConfigError
from sim.suggest import did_you_mean


def known_keys(table: Mapping[str, Any], known: tuple[str, ...], src: str, prefix: str) -> None:
    for key in table:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else key
            raise ConfigError(source=src, key=where, value=table[key],
                              rule=f"unknown key; {did_you_mean(str(key), known)}known keys: {', '.join(known)}")


def table(data: Mapping[str, Any], key: str, src: str, *, required: bool = False, prefix: str = "") -> dict[str, Any]:
    where = f"{prefix}.{key}" if prefix else key
    if key not in data:
        if required:
            raise ConfigError(source=src, key=where, value=None, rule="is required")
        return {}
    value = data[key]
    if not isinstance(value, dict):
        raise ConfigError(source=src, key=where, value=value, rule="must be a table")
    return value


def get(table: Mapping[str, Any], key: str, tp: type, src: str, prefix: str, *, required: bool = False,
         default: Any = None) -> Any:
    where = f"{prefix}.{key}" if prefix else key
    if key not in table:
        if required:
            raise ConfigError(source=src, key=where, value=None, rule="is required")
        return default
    value = table[key]
    ok = isinstance(value, tp) and not (tp is int and isinstance(value, bool))
    if tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(source=src, key=where, value=value, rule=f"must be a {TYPE_WORDS[tp]}")
    return float(value) if tp is float else value


TYPE_WORDS: Final[dict[type, str]] = {str: "string", int: "integer", float: "number", bool: "boolean",
                                       list: "array", dict: "table"}




def flatten(table: Mapping[str, Any], src: str, prefix: str, *, leaf: Callable[[Any], bool]) -> dict[str, Any]:
    """`{"engine": {"max_num_seqs": X}}` and `{"engine.max_num_seqs": X}` both give the dotted key."""
    out: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], path: str) -> None:
        for key, value in node.items():
            dotted = f"{path}.{key}" if path else key
            if isinstance(value, dict) and not leaf(value):
                walk(value, dotted)
            else:
                if dotted in out:
                    raise ConfigError(source=src, key=f'{prefix}."{dotted}"', value=value, rule="appears twice")
                out[dotted] = value

    walk(table, "")
    return out


