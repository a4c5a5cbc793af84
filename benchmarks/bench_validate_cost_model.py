"""How well `validate`'s start-up cost model predicts the simulation seconds of a finished run.

    python benchmarks/bench_validate_cost_model.py DIR/validate.json

Measures the cost model as `kernelsight validate` does at start (`measure_cost_model`), estimates
every row the run simulated (times its tiers), and compares with the run's own per-row wall seconds
(`RowResult.wall_s` in validate.json, written by `kernelsight validate --out DIR`): the total and
the median, 10th and 90th percentile of estimated / actual over rows that took over 50 ms. Run it
on the machine (and load) that ran the validation; the budget picks rows by these estimates, so a
total far from 1 means the default run takes proportionally more or less than its budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

from orchestrator.commands_validate import _e2e_dir, _profiles, _tiers_for
from sim.validation.budget import measure_cost_model
from sim.validation.load import load_rows
from sim.validation.runner import TIERS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("validate_json", type=Path)
    args = ap.parse_args()
    run = json.loads(args.validate_json.read_text())
    actual: dict[str, float] = defaultdict(float)
    for r in run["results"]:
        if r["status"] in ("scored", "failed"):
            actual[r["row_id"]] += float(r.get("wall_s", 0.0))
    rows = {r.row_id: r for r in load_rows(_e2e_dir(None), _profiles()) if not r.skipped}
    start = time.perf_counter()
    cost = measure_cost_model()
    probe_s = time.perf_counter() - start
    tiers = list(TIERS)
    estimate = {k: cost.estimate_s(rows[k]) * len(_tiers_for(rows[k], tiers)) for k in actual if k in rows}
    total_e, total_a = sum(estimate.values()), sum(actual[k] for k in estimate)
    ratios = sorted(estimate[k] / actual[k] for k in estimate if actual[k] > 0.05)
    print(f"cost model (measured in {probe_s:.1f} s): {cost.per_step_s * 1e6:.1f} us per step + "
          f"{cost.per_request_step_s * 1e6:.3f} us per running request per step "
          f"({cost.per_plain_request_step_s * 1e6:.3f} us for {', '.join(sorted(cost.request_by_request))})")
    print(f"{len(estimate)} rows: estimated {total_e:.0f} s, actual {total_a:.0f} s (x{total_e / total_a:.2f}); "
          f"per row estimated / actual: median {statistics.median(ratios):.2f}, "
          f"p10 {ratios[len(ratios) // 10]:.2f}, p90 {ratios[9 * len(ratios) // 10]:.2f}")


if __name__ == "__main__":
    main()
