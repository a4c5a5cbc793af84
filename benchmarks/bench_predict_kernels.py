"""Throughput of vectorised kernel prediction (`predict-kernels`), one core.

Usage: OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/bench_predict_kernels.py [N]
Prints predictions/s for each tier: the in-memory prediction (parsed columns -> latencies +
provenance) and the whole CLI (CSV in, CSV out), both by wall clock and by CPU time of this
process (the fair number on a shared box: other jobs stretch wall time, not CPU time), plus the
per-call cost of `FittedEfficiency.efficiency` (the simulator's path).
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

NUMERIC = ("m", "n", "k", "batch_size", "seq_len", "kv_len", "num_heads", "num_kv_heads", "head_dim",
           "window_size", "num_gpus", "message_bytes")


def _timed(fn: object) -> tuple[float, float]:
    assert callable(fn)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def main_bench(n: int) -> None:
    hw = load_hardware("h100_sxm")
    plan = microbench_plan(hw)
    rows = [plan[i % len(plan)] for i in range(n)]
    cols = {c: np.array([r[c] for r in rows], dtype=object) for c in ROW_COLUMNS}
    for c in NUMERIC:  # as the CLI hands them over: numbers parsed, blanks NaN
        cols[c] = np.array([float(v) if v else np.nan for v in cols[c].tolist()])
    print(f"{n} rows cycling through the h100_sxm microbenchmark plan ({len(plan)} points)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "rows.csv"
        with src.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(ROW_COLUMNS))
            w.writeheader()
            w.writerows(rows)
        for tier in ("roofline", "cross-generation", "target-measured"):
            model = None if tier == "roofline" else efficiency_model_for(hw, tier=tier, backend=None)
            assert model is None or isinstance(model, FittedEfficiency)
            predict_latency_s(cols, hw, model)
            wall, cpu = _timed(lambda m=model: predict_latency_s(cols, hw, m))  # type: ignore[misc]
            print(f"{tier:17s} in-memory: {n / wall:>10,.0f}/s wall, {n / cpu:>10,.0f}/s CPU")
            out = Path(tmp) / "pred.csv"
            args = ["predict-kernels", "--hardware", "h100_sxm", "--tier", tier, "--in", str(src), "--out", str(out)]
            wall, cpu = _timed(lambda a=args: main(a))  # type: ignore[misc]
            print(f"{tier:17s} CLI:       {n / wall:>10,.0f}/s wall, {n / cpu:>10,.0f}/s CPU")

    model = efficiency_model_for(hw, tier="target-measured")
    works = [row_to_work(r, number=i, source="bench") for i, r in enumerate(plan, start=1)]
    start = time.process_time()
    for wk in works * 5:
        model.efficiency(wk, hw)
    per_call = (time.process_time() - start) / (5 * len(works))
    print(f"single efficiency() call (target-measured): {per_call * 1e6:.1f} us CPU")


if __name__ == "__main__":
    main_bench(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000)
