"""Simulator speed: 10,000 ShareGPT-like requests on Llama-3.1-70B, TP4, H100, near capacity.

Run: `python benchmarks/bench_simulate.py [--requests N]`. Prints wall time, requests/s,
steps/s and peak RSS; numbers go in docs/benchmarks.md with the machine noted.

ShareGPT-like lengths: input ~ uniform[102, 1946] (mean 1024), output ~ uniform[25, 487]
(mean 256), i.e. `random_range_ratio = 0.9` around 1024/256 — wide, like ShareGPT's spread.
The rate (~80% of the saturated throughput) is found first by a closed `inf`-rate run.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from sim.api import load_scenario, simulate

SCENARIO = "scenarios/llama3_70b-h100-tp4.toml"
BASE = {"workload.random_input_len": 1024, "workload.random_output_len": 256, "workload.random_range_ratio": 0.9}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    probe = simulate(load_scenario(SCENARIO, {**BASE, "workload.num_prompts": 2000,
                                              "workload.request_rate": float("inf")}))
    capacity = probe.summary.request_throughput_per_s
    rate = 0.8 * capacity
    scenario = load_scenario(SCENARIO, {**BASE, "workload.num_prompts": args.requests, "workload.request_rate": rate})
    start = time.perf_counter()
    result = simulate(scenario)
    wall = time.perf_counter() - start
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = result.summary
    sys.stdout.write(
        f"requests={args.requests} capacity={capacity:.2f} req/s rate={rate:.2f} req/s\n"
        f"wall={wall:.3f} s  sim_requests_per_s={args.requests / wall:.0f}  steps={s.num_steps} "
        f"steps_per_s={s.num_steps / wall:.0f}  peak_rss={rss_mib:.0f} MiB\n"
        f"simulated: duration={s.duration_s:.1f} s ttft_p90={s.ttft_p90_s:.3f} s tpot_p90={s.tpot_p90_s * 1e3:.1f} ms "
        f"preemptions={s.num_preemptions}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
