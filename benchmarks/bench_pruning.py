"""Multi-fidelity pruning guard: the same sweep with and without `[search]` pruning.

    python benchmarks/bench_pruning.py [--trials 200] [--sweep sweeps/quickstart.toml] [--actors 2]
                                       [--pruner successive_halving] [--min-requests 20] [--factor 3]
                                       [--pruning-metric slo] [--num-prompts N]

Both runs use the random sampler with the sweep's seed, so trial N has the same parameters in both
and every pruned trial's full-length result is known from the unpruned run. Reported per mode: wall
time of the trial loop (local Ray, `--actors` actors, no MLflow), trials pruned and at which rung;
then the guard: the share of pruned trials that at full length would have met the `[slo]` bounds
(disagreement on feasibility) and would have been on the feasible Pareto front (disagreement on the
answer), and whether both runs report the same best trials (front trial numbers and values).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def run(spec: Any, base: Any, actors: int) -> Any:
    import ray

    from orchestrator.sweep.driver import SweepDriver
    from orchestrator.sweep.pool import ShardPool
    from orchestrator.sweep.study import open_storage, open_study
    from orchestrator.sweep.tracker import NullTracker

    with tempfile.TemporaryDirectory(prefix="bench-pruning-") as tmp:
        storage, _ = open_storage(None, Path(tmp))
        study, _ = open_study(spec, storage, identity=spec.identity(base), resume=False)
        pool = ShardPool(ray.put(base), num_actors=actors, render_artifacts=False, name_prefix=spec.name)
        try:
            report = SweepDriver(spec, base, study, NullTracker(), pool, n_trials=spec.n_trials).run()
        finally:
            pool.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--sweep", type=Path, default=REPO / "sweeps" / "quickstart.toml")
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--pruner", default="successive_halving")
    parser.add_argument("--min-requests", type=int, default=20)
    parser.add_argument("--factor", type=int, default=3)
    parser.add_argument("--pruning-metric", default="slo")
    parser.add_argument("--num-prompts", type=int, default=0, help="override workload.num_prompts of the base")
    args = parser.parse_args()

    import ray

    from orchestrator.sweep.objective import meets_slo
    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.results import TrialStatus
    from orchestrator.sweep.session import quiet_service_loggers
    from orchestrator.sweep.spec import SearchSpec

    quiet_service_loggers()
    spec = dataclasses.replace(load_sweep(args.sweep), sampler="random", n_trials=args.trials)
    if args.num_prompts:
        spec = dataclasses.replace(spec, base_set={**spec.base_set, "workload.num_prompts": args.num_prompts})
    base = spec.load_base()
    pruned_spec = dataclasses.replace(spec, name=spec.name + "-pruned", search=SearchSpec(
        pruner=args.pruner, min_fidelity_requests=args.min_requests, reduction_factor=args.factor,
        pruning_metric=args.pruning_metric))
    ray.init(address="local", num_cpus=args.actors, include_dashboard=False, log_to_driver=False)
    try:
        run(spec, base, args.actors)  # warm-up: actor start, imports, calibration files
        t0 = time.perf_counter()
        full = run(spec, base, args.actors)
        full_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        pruned = run(pruned_spec, base, args.actors)
        pruned_s = time.perf_counter() - t0
    finally:
        ray.shutdown()

    by_number = {r.number: r for r in full.records}
    front = set(full.best) | {n for tied in full.ties.values() for n in tied}
    stopped = [r.result for r in pruned.records if r.result is not None and r.result.status is TrialStatus.PRUNED]
    would_meet = [r.number for r in stopped
                  if (f := by_number[r.number].result) is not None and f.status is TrialStatus.OK
                  and meets_slo(f.metrics, spec.slo)]
    on_front = [r.number for r in stopped if r.number in front]
    pruned_front = set(pruned.best) | {n for tied in pruned.ties.values() for n in tied}

    def values(report: Any, numbers: set[int]) -> list[tuple[float, ...]]:
        return sorted({tuple(report.record(n).values) for n in numbers})

    out = {
        "sweep": str(args.sweep), "num_prompts": base.workload.num_prompts,
        "trials": args.trials, "actors": args.actors, "sampler": "random",
        "search": dataclasses.asdict(pruned_spec.search),
        "wall_s": {"full": round(full_s, 2), "pruned": round(pruned_s, 2)},
        "speedup": round(full_s / pruned_s, 3),
        "counts": {"full": full.counts(), "pruned": pruned.counts()},
        "pruned_at_requests": dict(sorted(Counter(r.fidelity_requests for r in stopped).items())),
        "pruned_but_would_meet_slo": {"trials": would_meet, "rate": round(len(would_meet) / max(len(stopped), 1), 4)},
        "pruned_but_on_full_front": {"trials": on_front, "rate": round(len(on_front) / max(len(stopped), 1), 4)},
        "same_best_trials": pruned_front == front and values(pruned, pruned_front) == values(full, front),
        "front_size": {"full": len(front), "pruned": len(pruned_front)},
        "cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
