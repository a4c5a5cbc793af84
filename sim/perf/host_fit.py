"""Fit `HostOverheadParams` from Vidur's measured per-step CPU overheads (csv + numpy only).

`python -m sim.perf.host_fit sim/data/measured/vidur/cpu_overheads_a100.csv.xz` (the vendored copy;
or `../shared/data/vidur/cpu_overheads_a100.csv` upstream) prints host-overhead
TOML in the layout of `sim/data/host/<backend>.toml`. Each component's median (ms) is fitted by
least squares as `a + b x batch_size` over every model and TP degree in the file. This is not
what ships: the shipped engine profiles hold host overheads fitted end to end on the dev rows by
`kernelsight validate --fit-profiles` (see their `source` and `[fit]`, and docs/validation.md);
this fit on Vidur's 2024 vLLM-v0 fork is kept for comparison.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np

from sim.measured import content_sha256, open_text, table_name

_COMPONENTS = {
    "schedule": "schedule_median",
    "prepare_inputs": "prepare_inputs_e2e_median",
    "sampler": "sampler_e2e_median",
    "process_outputs": "process_model_outputs_median",
}


def fit(path: Path) -> dict[str, tuple[float, float]]:
    with open_text(path) as f:
        rows = list(csv.DictReader(f))
    batch = np.array([float(r["batch_size"]) for r in rows])
    design = np.column_stack([np.ones_like(batch), batch])
    out: dict[str, tuple[float, float]] = {}
    for name, column in _COMPONENTS.items():
        y = np.array([float(r[column]) for r in rows]) * 1e-3
        coef, *_ = np.linalg.lstsq(design, y, rcond=None)
        out[name] = (max(float(coef[0]), 0.0), max(float(coef[1]), 0.0))
    launch = np.median([float(r["model_execution_launch_median"]) for r in rows]) * 1e-3
    out["graph_launch"] = (float(launch), 0.0)
    return out


def main(argv: list[str]) -> int:
    path = Path(argv[1])
    digest = content_sha256(path)[:16]  # of the CSV text: the same for the upstream file and its xz copy
    params = fit(path)
    lines = [f'source = "least-squares a + b x batch_size on {table_name(path)} (sha256 {digest}), '
             'Vidur vLLM-v0 fork"']
    lines.append(f"graph_launch_s = {params['graph_launch'][0]:.6g}")
    lines.append("eager_launch_s = 5e-06")
    for name in _COMPONENTS:
        a, b = params[name]
        lines.append(f"\n[{name}]\nbase_s = {a:.6g}\nper_item_s = {b:.6g}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
