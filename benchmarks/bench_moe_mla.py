"""CPU time of a 10,000-request DeepSeek-R1 run on one core (issue 19's speed target: <= 2 s).

    python benchmarks/bench_moe_mla.py [--requests N] [--rate R] [--repeat K] [--scenario PATH ...]

Runs the two shipped DeepSeek-R1 layouts on 8x H200 (TP8; attention DP8 + EP8) at a request rate
the DP8+EP8 layout sustains (or the `--scenario` files given, e.g. the Qwen3.5 hybrid), best CPU
time (`time.process_time`) of `--repeat` runs of one
`simulate` call (calibration load, workload generation and summary included). BLAS is pinned to one
thread before numpy loads. Runs in one process share its MoE routing memo (a later run finds the
routing draws kept); `--repeat 1` in fresh processes gives cold numbers.
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sim.api import load_scenario, simulate  # noqa: E402

SCENARIOS = ("scenarios/deepseek_r1-h200-tp8.toml", "scenarios/deepseek_r1-h200-dp8ep8.toml")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--scenario", action="append", help="scenario file (repeatable; default: the two DeepSeek-R1 ones)")
    args = ap.parse_args()
    for path in args.scenario or SCENARIOS:
        best = float("inf")
        for _ in range(args.repeat):
            sc = load_scenario(path, {"workload.num_prompts": args.requests, "workload.request_rate": args.rate})
            start = time.process_time()
            result = simulate(sc)
            best = min(best, time.process_time() - start)
        s = result.summary
        print(f"{path}: {args.requests} requests at {args.rate} req/s: CPU {best:.2f} s; "
              f"TTFT p90 {s.ttft_p90_s:.3f} s, TPOT p90 {s.tpot_p90_s * 1e3:.1f} ms, "
              f"completed {s.num_completed}, worst provenance {s.worst_provenance}")


if __name__ == "__main__":
    main()
