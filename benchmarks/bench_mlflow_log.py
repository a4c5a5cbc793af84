"""MLflow cost of logging one sweep trial: `MlflowTracker.log_trial` in this process, into a fresh
local sqlite store, for runs shaped like a quickstart trial (7 parameters, 45 metrics, a 20-kernel
breakdown, a 15 kB PNG and a 5 kB Parquet file).

    python benchmarks/bench_mlflow_log.py [--runs 60]

Prints CPU and wall milliseconds per run (after 5 warm-up runs). `kernelsight sweep` runs the same
calls in its MLflow child process (`orchestrator/sweep/tracker_process.py`).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()

    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.results import Breakdown, TrialResult, TrialStatus
    from orchestrator.sweep.session import quiet_service_loggers
    from orchestrator.sweep.tracking import MlflowTracker

    quiet_service_loggers()
    spec = load_sweep(REPO / "sweeps" / "quickstart.toml")
    breakdown = Breakdown(seconds_by_kind={"gemm": 2.0}, seconds_by_name={f"kernel_{i}": 0.1 for i in range(20)},
                          host_s=1.0, launch_floor_s=0.0)
    metrics = {f"metric_{i}": float(i) for i in range(45)}

    def result(number: int) -> TrialResult:
        return TrialResult(number=number, status=TrialStatus.OK, params={f"param_{i}": i for i in range(7)},
                           scenario_hash="h", metrics=metrics, breakdown=breakdown, duration_s=0.3,
                           artifacts={"kernel_breakdown.png": b"x" * 15000, "kernel_breakdown.parquet": b"y" * 5000})

    with tempfile.TemporaryDirectory(prefix="bench-mlflow-") as tmp:
        store = Path(tmp)
        tracker = MlflowTracker(f"sqlite:///{store / 'mlflow.db'}", "bench", artifact_location=(store / "art").as_uri())
        tracker.start_study(study_uid="bench", spec=spec, tags={}, files=[])
        for n in range(5):
            tracker.log_trial(result(n), tags={"optuna_state": "COMPLETE"}, timestamp_ms=1_700_000_000_000)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for n in range(5, 5 + args.runs):
            tracker.log_trial(result(n), tags={"optuna_state": "COMPLETE"}, timestamp_ms=1_700_000_000_000)
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    print(json.dumps({"runs": args.runs, "cpu_ms_per_run": round(cpu_s / args.runs * 1e3, 1),
                      "wall_ms_per_run": round(wall_s / args.runs * 1e3, 1)}))


if __name__ == "__main__":
    main()
