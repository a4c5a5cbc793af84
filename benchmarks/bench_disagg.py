"""CPU time of a 10,000-request disaggregated DeepSeek-R1 run on one core (issue 20's target: <= 5 s).

    python benchmarks/bench_disagg.py [--requests N] [--rate R] [--repeat K]

Runs scenarios/deepseek_r1-h200-disagg-4p8d.toml (4 prefill workers TP8, 8 decode workers attention
DP8 + EP8, 96 H200s, 1k/1k traffic); best CPU time (`time.process_time`) of `--repeat` runs of one
`simulate` call (calibration load, workload generation, both pools' pricing and the summary
included). BLAS is pinned to one thread before numpy loads.
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sim.api import load_scenario, simulate  # noqa: E402

SCENARIO = "scenarios/deepseek_r1-h200-disagg-4p8d.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    best = float("inf")
    for _ in range(args.repeat):
        sc = load_scenario(SCENARIO, {"workload.num_prompts": args.requests, "workload.request_rate": args.rate})
        start = time.process_time()
        result = simulate(sc)
        best = min(best, time.process_time() - start)
    s = result.summary
    print(f"{SCENARIO}: {args.requests} requests at {args.rate} req/s: CPU {best:.2f} s; "
          f"TTFT p90 {s.ttft_p90_s:.3f} s, TPOT p90 {s.tpot_p90_s * 1e3:.1f} ms, {s.num_steps} steps, "
          f"completed {s.num_completed}")


if __name__ == "__main__":
    main()
