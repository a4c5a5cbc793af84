"""Sweep trials with and without shared priced step parts (`PriceCache`), side by side.

Run: `python benchmarks/bench_price_cache.py [--trials N] [--seed S] [--hardware h100_sxm ...]`.
Draws N trials of `sweeps/quickstart.toml` (its base scenario: Llama-3.1-8B, 60 requests at 16
req/s with shared system prompts) with random engine parameters from the quickstart's space
(tensor parallelism, max_num_seqs, chunked prefill and token budget, prefix caching, KV-cache
dtype) on the given hardware, and simulates each twice in turn: pricing afresh, as `simulate`
does alone, and through one `PriceCache` shared by all trials, as a sweep worker's
`TrialEvaluator` does. Both use one `EfficiencyModels`, so the difference is the pricing of step
parts. Checks the two results are identical and prints CPU per trial (mean and median) for each.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from orchestrator.sweep.parse import load_sweep  # noqa: E402
from sim.api import scenario_efficiency, simulate  # noqa: E402
from sim.calibration.select import EfficiencyModels  # noqa: E402
from sim.engine.part_prices import PriceCache  # noqa: E402
from sim.errors import ConfigError, InfeasibleScenario  # noqa: E402

SWEEP = Path(__file__).resolve().parent.parent / "sweeps" / "quickstart.toml"


def _params(rng: random.Random, hardware: list[str]) -> dict[str, Any]:
    chunked = rng.choice([True, False])
    params: dict[str, Any] = {
        "hardware.name": rng.choice(hardware),
        "engine.tensor_parallel_size": rng.choice([1, 2]),
        "engine.max_num_seqs": round(8 * 32 ** rng.random()),
        "engine.enable_chunked_prefill": chunked,
        "engine.enable_prefix_caching": rng.choice([True, False]),
        "engine.kv_cache_dtype": rng.choice(["auto", "fp8"]),
    }
    if chunked:
        params["engine.max_num_batched_tokens"] = rng.choice([1024, 2048, 4096, 8192])
    return params


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hardware", nargs="+", default=["h100_sxm"])
    args = parser.parse_args()
    base = load_sweep(SWEEP).load_base()
    rng = random.Random(args.seed)
    models = EfficiencyModels()
    cache = PriceCache()
    fresh_s: list[float] = []
    shared_s: list[float] = []
    skipped = 0
    while len(fresh_s) < args.trials:
        try:
            scenario = base.with_overrides(_params(rng, args.hardware))
            efficiency = scenario_efficiency(scenario, models=models)
            t0 = time.process_time()
            fresh = simulate(scenario, efficiency=efficiency)
            t1 = time.process_time()
            shared = simulate(scenario, efficiency=efficiency, prices=cache)
            t2 = time.process_time()
        except (ConfigError, InfeasibleScenario):
            skipped += 1
            continue
        if (fresh.records, fresh.summary, fresh.breakdown) != (shared.records, shared.summary, shared.breakdown):
            sys.stderr.write(f"results differ for {scenario.scenario_hash()}\n")
            return 1
        fresh_s.append(t1 - t0)
        shared_s.append(t2 - t1)
    sys.stdout.write(
        f"trials={args.trials} (skipped {skipped} infeasible/invalid) hardware={','.join(args.hardware)} "
        f"identities={len(cache)} cache hits={cache.hits} misses={cache.misses}\n"
        f"fresh pricing:   cpu per trial mean={statistics.mean(fresh_s) * 1e3:.1f} ms "
        f"median={statistics.median(fresh_s) * 1e3:.1f} ms\n"
        f"shared (cache):  cpu per trial mean={statistics.mean(shared_s) * 1e3:.1f} ms "
        f"median={statistics.median(shared_s) * 1e3:.1f} ms\n"
        f"results identical in all {args.trials} trials\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
