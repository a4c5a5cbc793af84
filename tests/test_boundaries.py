"""Architecture rules that keep sim/ importable and deterministic."""

from __future__ import annotations

import ast
from pathlib import Path

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
