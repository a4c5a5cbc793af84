"""Simulator speed: 10,000 ShareGPT-like requests on Llama-3.1-70B, TP4, H100, near capacity.

Run: `python benchmarks/bench_simulate.py [--requests N] [--tier auto|roofline|...] [--repeat K]
[--reference]`. Prints wall and CPU time (best of K runs), requests/s, steps/s, peak RSS and the
CPU time spent building and pricing kernel parts not seen before (block pricing included); numbers
go in docs/benchmarks.md with the machine noted. BLAS runs single-threaded (one core).

ShareGPT-like lengths: input ~ uniform[102, 1946] (mean 1024), output ~ uniform[25, 487]
(mean 256), i.e. `random_range_ratio = 0.9` around 1024/256 — wide, like ShareGPT's spread.
The rate (~80% of the saturated throughput) is found first by a closed `inf`-rate run with the
same kernel tier. `--reference` runs the request-by-request path (`SimLimits(bulk_decode=False)`),
which gives the same results. `--price-cache` shares one `PriceCache` and `EfficiencyModels` between
the probe and the timed runs, as a sweep worker's trials do (same results; the timed runs then
price few or no parts and do not parse the calibration).
"""

from __future__ import annotations

import os

# One core: BLAS threads in the vectorised kernel-model calls would spin on the other core
# (more CPU time for the same wall). Set before numpy loads.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

from sim.api import load_scenario, scenario_efficiency, simulate  # noqa: E402
from sim.calibration.select import EfficiencyModels  # noqa: E402
from sim.engine.block_pricing import BlockPricer  # noqa: E402
from sim.engine.part_prices import PartPrices, PriceCache  # noqa: E402
from sim.engine.simulation import SimLimits  # noqa: E402
from sim.engine.step_parts import PartNodes  # noqa: E402

SCENARIO = "scenarios/llama3_70b-h100-tp4.toml"
BASE = {"workload.random_input_len": 1024, "workload.random_output_len": 256, "workload.random_range_ratio": 0.9}


class _PricingClock:
    """CPU seconds spent building and pricing new kernel parts of steps (the pricer's memo misses,
    block pricing included; nested calls counted once)."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self._depth = 0

    def install(self) -> None:
        for cls, name in ((PartNodes, "non_attention"), (PartPrices, "priced"), (BlockPricer, "part")):
            setattr(cls, name, self._timed(getattr(cls, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            start = time.process_time() if self._depth == 1 else 0.0
            try:
                return method(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.cpu_s += time.process_time() - start

        return timed


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--tier", default="auto", help="[perf] tier: auto, roofline, cross-generation, ...")
    parser.add_argument("--repeat", type=int, default=1, help="report the best of this many runs")
    parser.add_argument("--reference", action="store_true", help="request-by-request path (no bulk decodes)")
    parser.add_argument("--price-cache", action="store_true",
                        help="share priced step parts between the probe and the timed runs, as a sweep worker does")
    args = parser.parse_args()
    prices = PriceCache() if args.price_cache else None
    models = EfficiencyModels() if args.price_cache else None
    base = {**BASE, "perf.tier": args.tier}
    probe_scenario = load_scenario(SCENARIO, {**base, "workload.num_prompts": 2000,
                                              "workload.request_rate": float("inf")})
    probe = simulate(probe_scenario, prices=prices,
                     efficiency=None if models is None else scenario_efficiency(probe_scenario, models=models))
    capacity = probe.summary.request_throughput_per_s
    rate = 0.8 * capacity
    scenario = load_scenario(SCENARIO, {**base, "workload.num_prompts": args.requests, "workload.request_rate": rate})
    limits = SimLimits(bulk_decode=not args.reference)
    clock = _PricingClock()
    clock.install()
    best = (float("inf"), 0.0, 0.0)
    for _ in range(args.repeat):
        clock.cpu_s = 0.0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        efficiency = None if models is None else scenario_efficiency(scenario, models=models)
        result = simulate(scenario, limits=limits, prices=prices, efficiency=efficiency)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        best = min(best, (wall, cpu, clock.cpu_s))
    wall, cpu, pricing = best
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    s = result.summary
    sys.stdout.write(
        f"requests={args.requests} tier={args.tier} {'reference' if args.reference else 'bulk'}"
        f"{' price-cache' if args.price_cache else ''} "
        f"capacity={capacity:.2f} req/s rate={rate:.2f} req/s\n"
        f"wall={wall:.3f} s cpu={cpu:.3f} s (pricing new kernel parts {pricing:.3f} s)  "
        f"sim_requests_per_s={args.requests / wall:.0f}  steps={s.num_steps} "
        f"steps_per_s={s.num_steps / wall:.0f}  peak_rss={rss_mib:.0f} MiB\n"
        f"simulated: duration={s.duration_s:.1f} s ttft_p90={s.ttft_p90_s:.3f} s tpot_p90={s.tpot_p90_s * 1e3:.1f} ms "
        f"preemptions={s.num_preemptions}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
