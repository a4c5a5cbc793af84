"""A leave-one-GPU-out accuracy run kept on disk: its scores and its residuals.

`kernelsight accuracy kernels --save-run DIR` writes the run (`run_logo`'s result, minus the
residual arrays, as `result.json`; the residuals, log(measured / predicted) per GPU, tier and family,
as `residuals.npz`), and `--from-run DIR` renders the report and the interval table from it
without refitting: the run is ~50 minutes on two cores, the report and the intervals are seconds,
so a change to how intervals are formed or reported is measured on the same residuals.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, cast

import numpy as np

from sim.calibration.intervals import Residuals
from sim.errors import ConfigError

RESULT_FILE: Final = "result.json"
RESIDUALS_FILE: Final = "residuals.npz"
_SEP: Final = "|"


def save_logo_run(result: dict[str, Any], residuals: Residuals, directory: Path) -> None:
    """Write `result` (JSON-serialisable, no residuals) and `residuals` under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {_SEP.join((gpu, tier, fam)): np.asarray(r, dtype=np.float32)
              for gpu, tiers in residuals.items() for tier, fams in tiers.items() for fam, r in fams.items()}
    # numpy's stub types **arrays as its own keyword options; the keys here are gpu|tier|family.
    savez = cast(Callable[..., None], np.savez_compressed)
    savez(directory / RESIDUALS_FILE, **arrays)
    (directory / RESULT_FILE).write_text(json.dumps(result, indent=1) + "\n")


def load_logo_run(directory: Path) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, np.ndarray]]]]:
    """(result, residuals) of a run written by `save_logo_run`."""
    result_path, residuals_path = directory / RESULT_FILE, directory / RESIDUALS_FILE
    for path in (result_path, residuals_path):
        if not path.is_file():
            raise ConfigError(source=str(directory), key=path.name, value=None,
                              rule="a saved accuracy run holds result.json and residuals.npz "
                                   "(kernelsight accuracy kernels --save-run DIR)")
    try:
        result = json.loads(result_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(source=str(result_path), key="<root>", value=None, rule=f"must be JSON ({exc})") from None
    if not isinstance(result, dict) or not isinstance(result.get("gpus"), list):
        raise ConfigError(source=str(result_path), key="gpus", value=type(result).__name__,
                          rule="must be an object with a list 'gpus' (run_logo's result)")
    residuals: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    with np.load(residuals_path, allow_pickle=False) as npz:
        for key in npz.files:
            parts = key.split(_SEP)
            if len(parts) != 3:
                raise ConfigError(source=str(residuals_path), key=key, value=None, rule="keys must be gpu|tier|family")
            gpu, tier, fam = parts
            residuals.setdefault(gpu, {}).setdefault(tier, {})[fam] = npz[key]
    return result, residuals
