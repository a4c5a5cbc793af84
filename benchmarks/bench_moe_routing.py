"""CPU time of rank 0's MoE routing draws: one key at a time against `moe_rank0_loads` in batches.

    python benchmarks/bench_moe_routing.py [--batch N]

Keys: the distinct (tokens, experts, top-k, EP, distribution) of the five dev GPUs' `moe` tables
(what fitting and `accuracy kernels` draw), and DeepSeek-R1's token counts 1..8,192 at EP 1 and EP 8
(what a TP8 / DP8 + EP8 run's chunks draw). Each set is drawn with a cleared memo, one key at a
time and then as its callers draw it: the table keys in one call (`table_kernels.moe_batch`), the
token counts `--batch` keys per call (128: a block pricer's chunk); the values must be equal.
"""

from __future__ import annotations

import argparse
import os
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from sim.calibration.tables import read_microbench_dir  # noqa: E402
from sim.graph import moe_routing  # noqa: E402
from sim.measured.files import measured_data_root  # noqa: E402

DEV_GPUS = ("a100_sxm", "l40s", "h100_sxm", "h200_sxm", "rtx_pro_6000_server")


def _table_keys() -> list[moe_routing.LoadKey]:
    keys: set[moe_routing.LoadKey] = set()
    for gpu in DEV_GPUS:
        df, _, _ = read_microbench_dir(measured_data_root() / "aiconfigurator" / gpu, gpu)
        moe = df[df.kernel == "moe"]
        for t, e, k, ep, d in zip(moe.num_tokens, moe.num_experts, moe.topk, moe.moe_ep_size,
                                  moe.distribution, strict=True):
            d = "balanced" if d in ("", "uniform", "power_law_0") or d.endswith("_eplb") else d
            keys.add((max(int(t), 1), int(e), int(k), max(int(ep), 1), d))
    return sorted(keys)


def _time(keys: list[moe_routing.LoadKey], batch: int) -> tuple[float, list[tuple[float, float, float]]]:
    moe_routing._LOADS.clear()
    start = time.process_time()
    if batch <= 1:
        out = [moe_routing.moe_rank0_load(*key) for key in keys]
    else:
        out = [load for i in range(0, len(keys), batch) for load in moe_routing.moe_rank0_loads(keys[i:i + batch])]
    return time.process_time() - start, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args()
    table = _table_keys()
    sets = {"dev GPUs' moe tables": (table, len(table))}
    for ep in (1, 8):
        tokens = [(t, 256, 8, ep, "power_law_1.01") for t in range(1, 8193)]
        sets[f"DeepSeek-R1 1..8192 tokens, EP {ep}"] = (tokens, args.batch)
    for name, (keys, batch) in sets.items():
        one_s, one = _time(keys, 1)
        many_s, many = _time(keys, batch)
        assert one == many, name
        print(f"{name}: {len(keys)} keys, one at a time {one_s:.2f} s ({one_s / len(keys) * 1e6:.0f} us a key), "
              f"{batch} a call {many_s:.2f} s ({many_s / len(keys) * 1e6:.0f} us a key); values equal")


if __name__ == "__main__":
    main()
