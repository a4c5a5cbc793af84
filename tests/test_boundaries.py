"""Architecture rules that keep sim/ importable and deterministic."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_SIM = {"ray", "optuna", "mlflow", "matplotlib", "plotly", "wandb", "seaborn", "pandas", "tqdm", "random"}


def imported_top_level_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_sim_does_not_import_orchestration_or_plotting() -> None:
    files = list((REPO / "sim").rglob("*.py"))
    assert files
    for path in files:
        if "calibration" in path.parts:
            continue  # fitting code may use pandas behind the calibrate extra; checked below
        bad = imported_top_level_modules(path) & FORBIDDEN_IN_SIM
        assert not bad, f"{path} imports {bad}"


def test_calibration_never_imports_orchestration() -> None:
    for path in (REPO / "sim" / "calibration").rglob("*.py"):
        bad = imported_top_level_modules(path) & {"ray", "optuna", "mlflow", "matplotlib", "plotly", "wandb"}
        assert not bad, f"{path} imports {bad}"


def _sim_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for path in (REPO / "sim").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def sim_import_graph() -> dict[str, set[str]]:
    """Module -> the sim modules it imports, from the source: every import statement counts,
    inside functions too (a deferred import is still a cycle, only a hidden one)."""
    modules = _sim_modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                deps |= {m for alias in node.names if (m := owner(alias.name))}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    # `from pkg import mod` imports the submodule; `from mod import name` the module.
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else owner(base)
                    if target:
                        deps.add(target)
        deps.discard(module)
        graph[module] = deps
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_import_cycle_finder_sees_a_deferred_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_sim_has_no_import_cycles() -> None:
    graph = sim_import_graph()
    assert {"sim.workload.generate", "sim.workload.traces", "sim.api"} <= graph.keys()
    assert "sim.workload.traces" in graph["sim.workload.generate"]  # the one direction
    assert import_cycles(graph) == []


@pytest.mark.parametrize("module", ["sim.workload.traces", "sim.workload.generate", "sim.workload.requests",
                                    "sim.workload.arrivals", "sim.engine.block_pricing", "sim.engine.step_parts",
                                    "sim.engine.part_prices", "sim.engine.part_book", "sim.engine.micro_batches",
                                    "sim.engine.pricer"])
def test_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


def test_engine_and_workload_modules_depend_one_way() -> None:
    """Block pricing knows no part family; the families know no pricer; traces know no generator."""
    graph = sim_import_graph()

    def inside(module: str, package: str) -> set[str]:
        return {m for m in graph[module] if m.startswith(package)}

    assert inside("sim.engine.block_pricing", "sim.engine.") == set()
    assert inside("sim.engine.step_parts", "sim.engine.") == {"sim.engine.block_pricing"}
    assert inside("sim.engine.part_prices", "sim.engine.") == {"sim.engine.block_pricing", "sim.engine.step_parts"}
    assert inside("sim.engine.micro_batches", "sim.engine.") == set()
    assert inside("sim.engine.part_book", "sim.engine.") == {"sim.engine.block_pricing", "sim.engine.step_parts",
                                                             "sim.engine.part_prices"}
    assert inside("sim.workload.requests", "sim.workload.") == set()
    assert inside("sim.workload.arrivals", "sim.workload.") == set()
    assert inside("sim.workload.traces", "sim.workload.") == {"sim.workload.requests", "sim.workload.arrivals"}
