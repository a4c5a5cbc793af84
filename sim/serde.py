"""Strict conversion between plain data (TOML, JSON, CLI overrides) and frozen dataclasses.

Loading rejects unknown keys, wrong types and values a dataclass's own checks refuse, and every
error names the file, the dotted key, the value and the rule (`ConfigError`). Dataclasses report
their own broken rules by raising `FieldError` from `__post_init__`; `build` adds the path.

`config_hash` is SHA-256 over canonical JSON (sorted keys, enums as values, floats by `repr`),
so equal configurations hash equally in every process.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import hashlib
import json
import math
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, TypeVar

from sim.errors import ConfigError
from sim.suggest import did_you_mean

T = TypeVar("T")


def read_only(mapping: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    """A read-only view of `mapping` (how `build` holds a spec's tables)."""
    return types.MappingProxyType(mapping)


def _reduce_mapping_proxy(proxy: types.MappingProxyType[Any, Any]) -> tuple[Any, tuple[dict[Any, Any]]]:
    return read_only, (dict(proxy),)


# The specs hold their tables as read-only `MappingProxyType`s (`build`), which pickle cannot copy by
# default: worker processes (validate's pool, `--fit-profiles`' candidate profiles) receive specs.
copyreg.pickle(types.MappingProxyType, _reduce_mapping_proxy)


class FieldError(ValueError):
    """Raised by a dataclass's `__post_init__`: `key` is relative to the dataclass."""

    def __init__(self, key: str, value: object, rule: str) -> None:
        self.key = key
        self.value = value
        self.rule = rule
        super().__init__(f"{key}={value!r}: {rule}")


def require(ok: bool, key: str, value: object, rule: str) -> None:
    """Raise `FieldError` unless `ok`; the one validation helper every spec uses."""
    if not ok:
        raise FieldError(key, value, rule)


def build(cls: type[T], data: Mapping[str, Any], *, source: str = "", prefix: str = "") -> T:
    """Construct dataclass `cls` from `data`, strictly.

    `source` names the file (for messages); `prefix` is the dotted path of `data` inside it.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(source=source, key=prefix or "<root>", value=data, rule="must be a table")
    hints, fields = _schema(cls)  # type: ignore[arg-type]  # a class is hashable
    for key in data:
        if key not in fields:
            raise ConfigError(
                source=source,
                key=_join(prefix, key),
                value=data[key],
                rule=f"unknown key; {did_you_mean(str(key), fields)}known keys: {', '.join(sorted(fields))}",
            )
    kwargs: dict[str, Any] = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], source, _join(prefix, name))
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(source=source, key=_join(prefix, name), value=None, rule="is required")
    try:
        return cls(**kwargs)
    except FieldError as exc:
        raise ConfigError(
            source=source, key=_join(prefix, exc.key), value=exc.value, rule=exc.rule
        ) from None


@functools.cache
def _schema(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field[Any]]]:
    """A dataclass's resolved field types and its fields, once per class: resolving the string
    annotations (`from __future__ import annotations`) is most of what building a spec costs."""
    return typing.get_type_hints(cls), {f.name: f for f in dataclasses.fields(cls)}


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _convert(tp: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def fail(rule: str) -> ConfigError:
        return ConfigError(source=source, key=key, value=value, rule=rule)

    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            # One alternative: its own error, with the dotted key of a nested table's bad entry.
            return _convert(non_none[0], value, source, key)
        errors: list[str] = []
        for arg in non_none:
            try:
                return _convert(arg, value, source, key)
            except ConfigError as exc:
                errors.append(exc.rule)
        raise fail(" or ".join(errors))
    if origin is typing.Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise fail(f"must be one of {', '.join(repr(a) for a in args)}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise fail("must be an array")
        item_tp = args[0]
        return tuple(_convert(item_tp, v, source, f"{key}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise fail("must be a table")
        val_tp = args[1] if args else Any
        return types.MappingProxyType(
            {str(k): _convert(val_tp, v, source, _join(key, str(k))) for k, v in value.items()}
        )
    if tp is Any:
        return value
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            raise fail(f"must be one of {', '.join(repr(m.value) for m in tp)}") from None
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, source=source, prefix=key)
    if tp is bool:
        if not isinstance(value, bool):
            raise fail("must be a boolean (true or false)")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("must be an integer")
        return value
    if tp is float:
        if isinstance(value, str) and value in ("inf", "+inf", "-inf"):
            # JSON has no infinity; to_jsonable writes it as a string.
            return math.inf if value != "-inf" else -math.inf
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail("must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail("must be a string")
        return value
    raise TypeError(f"serde cannot convert to {tp!r} (key {key})")


def to_jsonable(obj: Any) -> Any:
    """Plain JSON-compatible data: dataclasses to dicts, enums to values, inf to strings."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    raise TypeError(f"cannot make {type(obj).__name__} JSON-compatible; refusing to under-hash it")


def json_text(obj: Any, *, indent: int | None = 2) -> str:
    """Strict JSON (RFC 8259) of `obj` for files and `--json` output: NaN and inf as strings, as
    `to_jsonable` writes them, never the bare `NaN` / `Infinity` that `jq` and most parsers refuse."""
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False)


def config_hash(obj: Any, *extra: str) -> str:
    """SHA-256 of the canonical JSON of `obj` plus any extra identity strings."""
    canonical = json.dumps(_canonical_floats(to_jsonable(obj)), sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode())
    for item in extra:
        digest.update(b"\0" + item.encode())
    return digest.hexdigest()


def _canonical_floats(obj: Any) -> Any:
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, dict):
        return {k: _canonical_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_canonical_floats(v) for v in obj]
    return obj


def parse_override(text: str) -> tuple[str, Any]:
    """`section.key=value` with the value read as a TOML literal, else as a bare string.

    `none` or `null` clears an optional key.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(source="--set", key=text, value=text, rule="must be KEY=VALUE")
    raw = raw.strip()
    if raw.lower() in {"none", "null"}:
        return key, None
    try:
        return key, tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return key, raw


def apply_overrides(
    data: Mapping[str, Any], overrides: Mapping[str, Any], *, source: str = "--set"
) -> dict[str, Any]:
    """A deep copy of `data` with each dotted key set; a missing section is created.

    Key validity is checked when the result is built, so unknown keys still get a clear error.
    """
    result: dict[str, Any] = _deep_copy(data)
    for dotted, value in overrides.items():
        parts = dotted.split(".")
        node = result
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
                node[part] = child
            elif not isinstance(child, dict):
                raise ConfigError(
                    source=source,
                    key=".".join(parts[: i + 1]),
                    value=child,
                    rule=f"is not a table, so {dotted} cannot be set",
                )
            node = child
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return result


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def check_unique_columns(header: Sequence[str], source: str) -> None:
    """A CSV header naming a column twice: readers would keep one copy's values without a word."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise ConfigError(source=source, key=name, value=name, rule="column appears twice in the header")
        seen.add(name)
