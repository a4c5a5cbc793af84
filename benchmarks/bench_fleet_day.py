"""Fleet-day benchmark: `scenarios/llama3_8b-fleet-day.toml` (~1,000,000 requests, 64 replicas, diurnal day,
a burst, three traffic classes) simulated once in a fresh process; CPU seconds and peak RSS.

    python benchmarks/bench_fleet_day.py [--scenario S] [--set key=value ...]

Target (issue 23): <= 30 s CPU and <= 2 GiB on the 2-core box.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(REPO / "scenarios" / "llama3_8b-fleet-day.toml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    from sim.api import load_scenario, simulate
    from sim.serde import parse_override

    scenario = load_scenario(args.scenario, dict(parse_override(s) for s in args.set))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = simulate(scenario)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    s = result.summary
    print(json.dumps({
        "scenario": args.scenario, "set": args.set, "replicas": scenario.engine.data_parallel_size,
        "requests": s.num_requests, "completed": s.num_completed, "steps": s.num_steps,
        "cpu_s": round(cpu_s, 2), "wall_s": round(wall_s, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "duration_s": s.duration_s, "goodput_frac": s.goodput_frac if hasattr(s, "goodput_frac") else None,
        "classes": [{"name": c.name, "requests": c.num_requests, "ttft_p90_s": round(c.ttft_p90_s, 4),
                     "tpot_p90_s": round(c.tpot_p90_s, 4), "goodput_frac": round(c.goodput_frac, 4)}
                    for c in result.classes],
    }, indent=2))


if __name__ == "__main__":
    main()
