"""Where speculative decoding helps and where it hurts: TPOT and output throughput with and without
it against the client concurrency (the batch-size crossover of docs/speculative.md).

    python benchmarks/bench_speculative.py [--concurrency 1 4 16 64 256 1024] [--prompts-per-slot 4]

Closed-loop `vllm bench serve` runs (`request_rate = inf`, `max_concurrency = C`, C x
`--prompts-per-slot` prompts, at least 32) of two shipped setups, each with the method's default
acceptance rates (docs/speculative.md):

- Llama-3.1-8B on one H100 SXM, EAGLE-3 with k = 3, random 512 -> 256 tokens, and 128 -> 256 tokens
  (short contexts: the verification's GEMMs turn compute-bound at smaller batches);
- DeepSeek-R1 on eight H200 SXM (TP8, FP8 KV cache), MTP with k = 1, random 1024 -> 256 tokens.

Prints, per concurrency, mean TPOT and output throughput with and without speculation, their ratios,
mean ITL / mean TPOT (about the tokens a
verification emits: one streamed chunk per step), and the CPU time of each simulation (with
speculation every step is planned request by request: bulk decodes are off). `--bulk-cost` also times
the plain run with bulk decodes off, the price of the request-by-request path alone.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sim.api import SimResult, load_scenario, simulate  # noqa: E402
from sim.engine.simulation import SimLimits  # noqa: E402

SETUPS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("Llama-3.1-8B H100 EAGLE-3 k=3", "scenarios/llama3_8b-h100.toml", {
        "engine.speculative_config": {"method": "eagle3", "num_speculative_tokens": 3,
                                      "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
        "workload.random_input_len": 512, "workload.random_output_len": 256}),
    ("Llama-3.1-8B H100 EAGLE-3 k=3, 128 -> 256 tokens", "scenarios/llama3_8b-h100.toml", {
        "engine.speculative_config": {"method": "eagle3", "num_speculative_tokens": 3,
                                      "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
        "workload.random_input_len": 128, "workload.random_output_len": 256}),
    ("DeepSeek-R1 8xH200 TP8 MTP k=1", "scenarios/deepseek_r1-h200-tp8.toml", {
        "engine.speculative_config": {"method": "mtp", "num_speculative_tokens": 1},
        "workload.random_input_len": 1024, "workload.random_output_len": 256}),
)


def _run(path: str, overrides: dict[str, Any], limits: SimLimits | None = None) -> tuple[SimResult, float]:
    sc = load_scenario(path, overrides)
    start = time.process_time()
    result = simulate(sc, limits=limits)
    return result, time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64, 256, 1024])
    ap.add_argument("--prompts-per-slot", type=int, default=4)
    ap.add_argument("--bulk-cost", action="store_true")
    args = ap.parse_args()
    for title, path, spec in SETUPS:
        print(f"\n{title} ({path})")
        print("| concurrency | TPOT off (ms) | TPOT on (ms) | TPOT on/off | tok/s off | tok/s on | tok/s on/off "
              "| ITL/TPOT | CPU off (s) | CPU on (s) |" + (" CPU off, no bulk (s) |" if args.bulk_cost else ""))
        print("|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.bulk_cost else ""))
        for c in args.concurrency:
            base = {"workload.request_rate": float("inf"), "workload.max_concurrency": c,
                    "workload.num_prompts": max(32, c * args.prompts_per_slot), "workload.random_range_ratio": 0.0,
                    **{k: v for k, v in spec.items() if k.startswith("workload.")}}
            off, cpu_off = _run(path, base)
            on, cpu_on = _run(path, {**base, "engine.speculative_config": spec["engine.speculative_config"]})
            so, sn = off.summary, on.summary
            # A streamed chunk per step: mean ITL / mean TPOT is about the tokens each verification emits.
            tokens = sn.itl_mean_s / sn.tpot_mean_s
            row = (f"| {c} | {so.tpot_mean_s * 1e3:.2f} | {sn.tpot_mean_s * 1e3:.2f} "
                   f"| {sn.tpot_mean_s / so.tpot_mean_s:.2f} "
                   f"| {so.output_throughput_tokens_per_s:,.0f} | {sn.output_throughput_tokens_per_s:,.0f} "
                   f"| {sn.output_throughput_tokens_per_s / so.output_throughput_tokens_per_s:.2f} | {tokens:.2f} "
                   f"| {cpu_off:.2f} | {cpu_on:.2f} |")
            if args.bulk_cost:
                _, cpu_ref = _run(path, base, SimLimits(bulk_decode=False))
                row += f" {cpu_ref:.2f} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
