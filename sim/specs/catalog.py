"""The shipped hardware and model catalogs under `sim/data/`, plus user files by path.

`load_hardware("h100_sxm")` reads `sim/data/hardware/h100_sxm.toml`; a name ending in `.toml`
is read as a path. `load_model("meta-llama/Llama-3.1-70B")` resolves an id or alias through
`sim/data/models/index.toml`; a name ending in `.json` is read as a `config.json` path, and a
directory holding a `config.json` (a downloaded checkpoint) is read like Hugging Face tools read it:
a local directory wins over a Hub id of the same spelling.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeVar

from sim.errors import ConfigError, decode_error, file_error
from sim.serde import build
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec, WeightQuantization, model_from_hf_config
from sim.suggest import did_you_mean

T = TypeVar("T")

_PARSED: dict[tuple[str, str, int, int], Any] = {}
_MAX_PARSED: Final = 512


def _parsed(kind: str, path: Path, parse: Callable[[], T]) -> T:
    """`parse()` of a catalog file, once per file version: keyed by what is parsed, the path and the
    file's modification time and size, so an edited file is read again. A sweep builds a scenario per
    trial and `validate` one per row; re-reading and re-checking the same hardware and model files
    each time was most of that cost. The specs are frozen, so sharing them is safe; errors are raised
    afresh on every call (nothing is stored for a file that fails)."""
    try:
        stat = path.stat()
    except OSError:
        return parse()  # raises the file error naming the path
    key = (kind, str(path.absolute()), stat.st_mtime_ns, stat.st_size)
    if key not in _PARSED:
        if len(_PARSED) >= _MAX_PARSED:
            _PARSED.clear()
        _PARSED[key] = parse()
    value: T = _PARSED[key]
    return value


def _data_dir() -> Path:
    return Path(str(resources.files("sim") / "data"))


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; unreadable, non-UTF-8 or malformed files raise `ConfigError` naming it."""
    return read_toml_text(path)[1]


def read_toml_text(path: Path) -> tuple[str, dict[str, Any]]:
    """(text, table) of a TOML file: the one place TOML files are read.

    The bytes are decoded as UTF-8 (TOML's only encoding); an OS error (missing file, directory,
    permission), a non-UTF-8 file (binary, Latin-1, UTF-16) or a syntax error is a `ConfigError`.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise file_error(exc, path=path) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise decode_error(exc, path=path, what="TOML") from None
    try:
        return text, tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError) as exc:
        raise ConfigError(source=str(path), key="<file>", value=str(path), rule=f"invalid TOML: {exc}") from None


def list_hardware() -> list[str]:
    return sorted(p.stem for p in (_data_dir() / "hardware").glob("*.toml"))


def load_hardware(name: str) -> HardwareSpec:
    if name.endswith(".toml"):
        path = Path(name)
    else:
        path = _data_dir() / "hardware" / f"{name}.toml"
        if not path.exists():
            raise ConfigError(source="", key="hardware.name", value=name,
                              rule=f"unknown hardware; {did_you_mean(name, list_hardware())}"
                              f"known: {', '.join(list_hardware())}")
    spec = _parsed("hardware", path, lambda: build(HardwareSpec, read_toml(path), source=str(path)))
    if not name.endswith(".toml") and spec.name != name:
        raise ConfigError(source=str(path), key="name", value=spec.name, rule=f"must equal the file stem {name!r}")
    return spec


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    id: str
    aliases: tuple[str, ...] = ()
    config: str
    quantization: WeightQuantization | None = None


def _index_path() -> Path:
    return _data_dir() / "models" / "index.toml"


def _model_index() -> dict[str, ModelEntry]:
    """Model id or alias -> entry (a copy: callers may keep it)."""
    path = _index_path()
    return dict(_parsed("model-index", path, lambda: _read_model_index(path)))


def _read_model_index(path: Path) -> dict[str, ModelEntry]:
    table = read_toml(path)
    index: dict[str, ModelEntry] = {}
    for i, raw in enumerate(table.get("model", [])):
        entry = build(ModelEntry, raw, source=str(path), prefix=f"model[{i}]")
        for key in (entry.id, *entry.aliases):
            index[key] = entry
    return index


def list_models() -> list[str]:
    """Canonical ids of the shipped model configs."""
    return sorted({e.id for e in _model_index().values()})


def model_aliases() -> dict[str, list[str]]:
    return {e.id: list(e.aliases) for e in _model_index().values()}


def renamed_repos() -> dict[str, str]:
    """Old Hub repo id -> current repo id, for repos renamed on the Hub (index.toml `[renamed]`)."""
    renamed = read_toml(_index_path()).get("renamed", {})
    return {str(k): str(v) for k, v in renamed.items()}


def model_directory(name: str) -> Path | None:
    """`name` as a local checkpoint directory (one holding a `config.json`), else None."""
    path = Path(name)
    return path if not name.endswith(".json") and (path / "config.json").is_file() else None


def serve_model_id(name: str) -> str:
    """What `vllm serve` takes for the model a scenario names: the directory of a `config.json`
    path, a checkpoint directory as given, else the id or alias as written, with the old name of a
    renamed Hub repo replaced by the current one."""
    if name.endswith(".json"):
        return str(Path(name).parent)
    if model_directory(name) is not None:
        return name
    return renamed_repos().get(name, name)


def load_model(name: str) -> ModelSpec:
    directory = model_directory(name)
    if name.endswith(".json") or directory is not None:
        path = Path(name) if directory is None else directory / "config.json"
        return _parsed(f"model:{name}", path,
                       lambda: model_from_hf_config(read_json_object(path), name=name, source=str(path)))
    index = _model_index()
    entry = index.get(name)
    if entry is None:
        raise ConfigError(source="", key="model.name", value=name,
                          rule=f"unknown model id; {did_you_mean(name, index)}give a config.json path, a "
                          f"directory holding one, or one of {', '.join(sorted(index))}")
    path = _data_dir() / "models" / entry.config
    spec = _parsed(f"model:{entry.id}", path,
                   lambda: model_from_hf_config(read_json_object(path), name=entry.id, source=str(path)))
    if entry.quantization is not None:
        spec = dataclasses.replace(spec, weight_quantization=entry.quantization)
    return spec


def read_json_object(path: Path, what: str = "JSON") -> dict[str, Any]:
    """A JSON file that must hold an object; unreadable, non-UTF-8 or invalid files are ConfigErrors
    naming the file."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise file_error(exc, path=path) from None
    except UnicodeDecodeError as exc:
        raise decode_error(exc, path=path, what=what) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ConfigError(source=str(path), key="<file>", value=str(path), rule=f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(source=str(path), key="<root>", value=type(data).__name__, rule="must be a JSON object")
    return data
