"""Throughput of vectorised kernel prediction (`predict-kernels`), one core.

Usage: OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_predict_kernels.py [N]
Prints predictions/s for the in-memory prediction (parsed columns -> latencies) and for the whole
CLI (CSV in, CSV out), plus the per-call cost of `FittedEfficiency.efficiency`.
"""

from __future__ import annotations

import csv
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from orchestrator.cli import main
from sim.calibration.batch import predict_latency_s
from sim.calibration.plan import microbench_plan
from sim.calibration.rows import ROW_COLUMNS, row_to_work
from sim.calibration.select import efficiency_model_for
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware


def main_bench(n: int) -> None:
    hw = load_hardware("h100_sxm")
    plan = microbench_plan(hw)
    rows = [plan[i % len(plan)] for i in range(n)]
    cols = {c: np.array([r[c] for r in rows], dtype=object) for c in ROW_COLUMNS}
    model = efficiency_model_for(hw, tier="target-measured")
    assert isinstance(model, FittedEfficiency)
    predict_latency_s(cols, hw, model)
    start = time.perf_counter()
    predict_latency_s(cols, hw, model)
    core = time.perf_counter() - start
    print(f"in-memory: {n} rows in {core:.2f} s = {n / core:,.0f} predictions/s")

    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "rows.csv", Path(tmp) / "pred.csv"
        with src.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ROW_COLUMNS))
            w.writeheader()
            w.writerows(rows)
        start = time.perf_counter()
        main(["predict-kernels", "--hardware", "h100_sxm", "--tier", "target-measured",
              "--in", str(src), "--out", str(out)])
        cli = time.perf_counter() - start
    print(f"CLI (CSV in/out): {n} rows in {cli:.2f} s = {n / cli:,.0f} predictions/s")

    works = [row_to_work(r, number=i, source="bench") for i, r in enumerate(plan, start=1)]
    start = time.perf_counter()
    for wk in works * 20:
        model.efficiency(wk, hw)
    per_call = (time.perf_counter() - start) / (20 * len(works))
    print(f"single efficiency() call: {per_call * 1e6:.1f} us")


if __name__ == "__main__":
    main_bench(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
