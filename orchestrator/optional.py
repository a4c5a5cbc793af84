"""Optional packages: which extra installs each, and the check a verb makes before work that needs one.

The core install has numpy only; verbs import what else they need lazily. A verb that would need a
package only at its end (`run --out` writes Parquet, `validate` draws its document's plots) checks
it before it simulates (`require`), so that a missing package never costs a finished simulation.
"""

from __future__ import annotations

import importlib.util
from typing import Final

OPTIONAL_EXTRA: Final[dict[str, str]] = {
    "pandas": "calibrate", "scipy": "calibrate", "pyarrow": "io", "ray": "orchestrate", "optuna": "orchestrate",
    "mlflow": "orchestrate", "matplotlib": "orchestrate", "plotly": "orchestrate", "tqdm": "orchestrate",
    "torch": "microbench",
}
"""Optional package -> the pyproject extra that installs it (the core install has numpy only)."""


def missing_package_error(verb: str, exc: ModuleNotFoundError) -> str | None:
    """The one-line error for a verb stopped by a missing optional package, or None when the missing
    module is not one (a bug, which keeps its traceback)."""
    package = (exc.name or "").split(".")[0]
    extra = OPTIONAL_EXTRA.get(package)
    if extra is None:
        return None
    return (f"kernelsight {verb} needs the optional package {package}: "
            f"python -m pip install -e '.[{extra}]' (or pip install 'kernelsight[{extra}]')")


def require(*packages: str) -> None:
    """Raise the `ModuleNotFoundError` the CLI reports (`missing_package_error`) for the first of
    `packages` that is not installed."""
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked (None in sys.modules) package
            found = False
        if not found:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
