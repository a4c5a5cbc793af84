"""Sweep throughput: trials/s with 1 and 2 actors, scaling efficiency, driver overhead per trial.

    python benchmarks/bench_sweep.py [--trials 200] [--sweep sweeps/quickstart.toml] [--full 1000]

For each actor count a fresh study runs `--trials` trials of the sweep (TPE, MLflow logging to a
local sqlite store with per-trial Parquet + PNG artifacts, journal storage) on a local Ray
runtime with 2 CPUs. Reported: wall time of the trial loop (Ray start-up and MLflow database
creation are reported separately), trials/s, scaling efficiency (trials/s with 2 actors / (2 x
trials/s with 1 actor)), and the driver's time per trial in ask (+ drawing parameters), scenario
build/hash, MLflow logging (in the child process `kernelsight sweep` logs through; its CPU is
reported apart) and tell. `--full N` then runs `kernelsight sweep` end to end for N
trials with 2 actors, start-up included (the 1,000-trial target).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_loop(sweep: Path, trials: int, actors: int) -> dict[str, float]:
    import ray

    from orchestrator.sweep.driver import SweepDriver
    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.pool import ShardPool
    from orchestrator.sweep.session import make_tracker_process, quiet_service_loggers
    from orchestrator.sweep.study import open_storage, open_study, study_uid

    quiet_service_loggers()
    spec = load_sweep(sweep)
    base = spec.load_base()
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        study_dir = Path(tmp)
        storage, _ = open_storage(None, study_dir)
        study, _ = open_study(spec, storage, identity=spec.identity(base), resume=False)
        t0 = time.perf_counter()
        tracker = make_tracker_process(None, spec, study_dir)  # as `kernelsight sweep` logs
        tracker.start_study(study_uid=study_uid(study), spec=spec, tags={}, files=[])
        mlflow_init_s = time.perf_counter() - t0
        mlflow_pid = tracker.pid
        pool = ShardPool(ray.put(base), num_actors=actors, name_prefix=f"bench-{actors}")
        pids = ray.get([ray.get_actor(n).pid.remote() for n in pool.current_actor_names()])  # actors up
        actor_cpu0 = sum(_cpu_s(pid) for pid in pids)
        driver_cpu0 = time.process_time()
        mlflow_cpu0 = _cpu_s(mlflow_pid)
        driver = SweepDriver(spec, base, study, tracker, pool, n_trials=trials)
        report = driver.run()
        driver_cpu_s = time.process_time() - driver_cpu0
        mlflow_cpu_s = _cpu_s(mlflow_pid) - mlflow_cpu0
        actor_cpu_s = sum(_cpu_s(pid) for pid in pids) - actor_cpu0
        pool.close()
        tracker.close()
    per = report.timings.per_trial_ms()
    evaluated = trials - report.num_cache_hits
    return {"actors": actors, "trials": trials, "wall_s": report.timings.wall_s,
            "trials_per_s": trials / report.timings.wall_s, "mlflow_init_s": mlflow_init_s,
            "cache_hits": report.num_cache_hits, **per,
            "driver_cpu_ms_per_trial": driver_cpu_s / trials * 1e3,
            "mlflow_process_cpu_ms_per_trial": mlflow_cpu_s / trials * 1e3,
            "actor_cpu_ms_per_evaluated_trial": actor_cpu_s / max(evaluated, 1) * 1e3,
            "actor_wall_ms_per_evaluated_trial": 1e3 * sum(
                r.result.duration_s for r in report.records if r.result and r.result.cached_from is None)
            / max(evaluated, 1),
            "load_average_1m": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sweep", type=Path, default=REPO / "sweeps" / "quickstart.toml")
    parser.add_argument("--full", type=int, default=0, help="also run `kernelsight sweep` for this many trials")
    args = parser.parse_args()
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    print(f"ray start-up: {time.perf_counter() - t0:.1f} s")
    rows = [run_loop(args.sweep, args.trials, actors) for actors in (1, 2)]
    ray.shutdown()
    for row in rows:
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    efficiency = rows[1]["trials_per_s"] / (2 * rows[0]["trials_per_s"])
    print(f"scaling efficiency 1 -> 2 actors: {efficiency:.2f}")
    # What two otherwise idle cores could do: every trial costs its driver CPU plus its actor CPU.
    cpu_ms = rows[1]["driver_cpu_ms_per_trial"] + rows[1]["actor_cpu_ms_per_evaluated_trial"]
    print(f"CPU per trial (driver + actor): {cpu_ms:.0f} ms -> at most {2000 / cpu_ms:.2f} trials/s on 2 idle cores")
    if args.full:
        with tempfile.TemporaryDirectory(prefix="bench-sweep-full-") as tmp:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "orchestrator.cli", "sweep", str(args.sweep), "--trials",
                            str(args.full), "--actors", "2", "--study-dir", tmp, "--json"], check=True,
                           stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
            print(f"kernelsight sweep, {args.full} trials, 2 actors, end to end: {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
