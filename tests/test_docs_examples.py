"""The user-facing documentation's examples load as written: every ```toml block of README.md and
docs/*.md is valid TOML (TOML 1.0, as `tomllib` reads it: an inline table stays on one line), the
sweep files they show pass the sweep loader's checks, and docs/scenario.md names every key the
scenario loader accepts and no `[engine]` value it refuses."""

from __future__ import annotations

import dataclasses
import re
import tomllib
import typing
from pathlib import Path

import pytest

from orchestrator.sweep.parse import load_sweep
from sim.specs.engine import EngineParams
from sim.specs.scenario import ScenarioSections

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)


def _toml_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for doc in DOCS:
        for i, m in enumerate(_BLOCK.finditer(doc.read_text(encoding="utf-8"))):
            blocks.append((doc.relative_to(REPO).as_posix(), i, m.group(1)))
    return blocks


@pytest.mark.parametrize(("doc", "index", "text"), _toml_blocks(), ids=lambda v: str(v)[:40])
def test_toml_examples_parse(doc: str, index: int, text: str) -> None:
    """docs/sweep.md's example split `{ choices = [...], when = {...} }` over two lines, which
    TOML 1.0 refuses (`Invalid initial character for a key part`): a user's copy did not load."""
    tomllib.loads(text)


@pytest.mark.parametrize("doc", ["README.md", "docs/sweep.md"])
def test_sweep_examples_load(doc: str, tmp_path: Path) -> None:
    """The sweep files shown (those with a [study] and a [space]) pass `kernelsight check`'s loader,
    with their base scenario resolved from the repository's sweeps/ directory as written."""
    shown = [m.group(1) for m in _BLOCK.finditer((REPO / doc).read_text(encoding="utf-8"))]
    sweeps = [t for t in shown if "[study]" in t and "[space]" in t]
    assert sweeps, doc
    for i, text in enumerate(sweeps):
        text = text.replace('"../scenarios/', f'"{(REPO / "scenarios").as_posix()}/')
        path = tmp_path / f"sweep{i}.toml"
        path.write_text(text, encoding="utf-8")
        spec = load_sweep(path)
        spec.load_base()


def _fields(cls: type, prefix: str = "") -> list[str]:
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        names.append(prefix + f.name)
        for arg in (hints[f.name], *typing.get_args(hints[f.name])):
            for inner in (arg, *typing.get_args(arg)):
                if dataclasses.is_dataclass(inner) and isinstance(inner, type):
                    names.extend(_fields(inner, prefix + f.name + "."))
    return names


def test_scenario_doc_names_every_key() -> None:
    doc = (REPO / "docs/scenario.md").read_text(encoding="utf-8")
    missing = [key for key in _fields(ScenarioSections)
               if f"`{key.rsplit('.', 1)[-1]}`" not in doc and f"[{key.rsplit('.', 1)[-1]}]" not in doc
               and not re.search(rf"\b{re.escape(key.rsplit('.', 1)[-1])}\b", doc)]
    assert not missing, missing


def _literal_values(tp: object) -> tuple[str, ...] | None:
    for arg in (tp, *typing.get_args(tp)):
        if typing.get_origin(arg) is typing.Literal:
            return typing.get_args(arg)
        alias = getattr(arg, "__value__", None)  # a `type X = Literal[...]` alias
        if alias is not None and typing.get_origin(alias) is typing.Literal:
            return typing.get_args(alias)
    return None


def test_scenario_doc_engine_values_are_accepted() -> None:
    """Each `[engine]` key with a fixed set of values lists only values the loader accepts (the
    backticked names before the notes' first parenthesis): docs/scenario.md listed `scheduler` =
    `vllm_v1`, `static`, and the loader refuses `static`."""
    doc = (REPO / "docs/scenario.md").read_text(encoding="utf-8")
    hints = typing.get_type_hints(EngineParams)
    checked = []
    for line in doc.splitlines():
        cells = line.split("|")
        if len(cells) < 5 or not re.fullmatch(r" `[a-z_]+` ", cells[1]):
            continue
        key = cells[1].strip(" `")
        allowed = _literal_values(hints[key]) if key in hints else None
        if allowed is None:
            continue
        shown = set(re.findall(r"`([a-z0-9_]+)`", cells[3].split("(")[0]))
        assert shown and shown <= set(allowed), (key, shown - set(allowed))
        checked.append(key)
    assert {"scheduler", "router", "backend", "launch_mode", "kv_cache_dtype"} <= set(checked), checked
