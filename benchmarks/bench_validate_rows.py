"""CPU time of simulating a fixed sample of `validate` rows, with their predictions for comparing codes.

    python benchmarks/bench_validate_rows.py [--backend B] [--family F] [--disaggregated yes|no|any]
        [--suite dev|eval|any] [--source S] [--tier T] [--sample N | --groups N] [--match TEXT]
        [--json-out FILE]

Loads the measured end-to-end rows (the shipped copy of `e2e/`), keeps the simulable ones that
match the filters, takes `--sample` of them in a fixed hash order of their row ids (the same rows
on any code that reads the same data), simulates each once with `sim.validation.runner.evaluate_row`
and prints its CPU seconds (`time.process_time`), steps and predictions. `--json-out` writes them so
that two codes' runs can be compared row by row (`--compare A.json B.json`: CPU per row and
whether every prediction is bitwise the same). `--groups N` simulates instead every row of the first
N pricing groups (in a hash order of the group key), each group with one set of kernel models and
priced step parts, as a `validate` worker does (`orchestrator.validate_pool.pricing_group`; a row
that repeats another's simulation copies its results, so its CPU is ~0).
BLAS is pinned to one thread before numpy loads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from orchestrator.validate_pool import _evaluate_batch, pricing_group  # noqa: E402
from sim.api import load_engine_profile  # noqa: E402
from sim.calibration.select import EfficiencyModels  # noqa: E402
from sim.engine.part_prices import PriceCache  # noqa: E402
from sim.measured import measured_data_root  # noqa: E402
from sim.validation.load import load_rows  # noqa: E402
from sim.validation.rows import ValidationRow  # noqa: E402
from sim.validation.runner import TIERS, Tier, evaluate_row  # noqa: E402

BACKENDS = ("vllm", "sglang", "trtllm")


def _order(row_id: str) -> str:
    return hashlib.sha256(row_id.encode()).hexdigest()


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    profiles = {b: load_engine_profile(b) for b in BACKENDS}
    rows = load_rows(measured_data_root() / "e2e", profiles)
    wanted = [r for r in rows if not r.skipped
              and (args.backend == "any" or r.backend == args.backend)
              and (args.family == "any" or r.family == args.family)
              and (args.disaggregated == "any" or r.disaggregated == (args.disaggregated == "yes"))
              and (args.suite == "any" or r.suite == args.suite)
              and (args.source == "any" or r.source == args.source)
              and all(m in r.label for m in args.match)]
    wanted.sort(key=lambda r: _order(r.row_id))
    if args.groups:
        groups: dict[str, list[ValidationRow]] = {}
        for r in wanted:
            groups.setdefault(pricing_group(r, args.tier), []).append(r)
        keys = sorted(groups, key=_order)[:args.groups]
        batches = [groups[k] for k in keys]
    else:
        batches = [[r] for r in wanted[:args.sample]]
    sample = [r for b in batches for r in b]
    print(f"{len(wanted)} rows match; simulating {len(sample)} in {len(batches)} "
          f"{'pricing groups' if args.groups else 'rows'} ({args.tier})", file=sys.stderr)
    out: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as work:
        for batch in batches:
            if args.groups:
                out += _simulate_group(batch, cast(Tier, args.tier), Path(work))
                continue
            for row in batch:
                out.append(_simulate_one(row, cast(Tier, args.tier), Path(work), None, None))
    total = sum(float(str(r["cpu_s"])) for r in out)
    print(f"total {total:.2f} s CPU over {len(out)} rows")
    return out


def _simulate_group(batch: list[ValidationRow], tier: Tier, work: Path) -> list[dict[str, object]]:
    """A pricing group as a `validate` worker simulates it (`_evaluate_batch`: shared kernel models and
    part prices, a repeated simulation copied); each row's CPU is its share of the group's by wall time."""
    start = time.process_time()
    results = _evaluate_batch([(row, tier, work, None, 0) for row in batch])
    cpu_s = time.process_time() - start
    wall_s = sum(r.wall_s for r in results) or 1.0
    out: list[dict[str, object]] = []
    for row, result in zip(batch, results, strict=True):
        share = cpu_s * result.wall_s / wall_s
        copied = f" (= {result.same_simulation_as})" if result.same_simulation_as else ""
        print(f"{share:8.2f} s  {result.num_steps or 0:>9,} steps  {result.status:7}  {row.label}{copied}", flush=True)
        out.append({"row_id": row.row_id, "label": row.label, "status": result.status, "cpu_s": share,
                    "num_steps": result.num_steps,
                    "predicted": {k: repr(v) for k, v in sorted(result.predicted.items())}})
    return out


def _simulate_one(row: ValidationRow, tier: Tier, work: Path, models: EfficiencyModels | None,
                  prices: PriceCache | None) -> dict[str, object]:
    start = time.process_time()
    result = evaluate_row(row, tier, work, models=models, prices=prices)
    cpu_s = time.process_time() - start
    print(f"{cpu_s:8.2f} s  {result.num_steps or 0:>9,} steps  {result.status:7}  {row.label}", flush=True)
    return {"row_id": row.row_id, "label": row.label, "status": result.status, "cpu_s": cpu_s,
            "num_steps": result.num_steps, "predicted": {k: repr(v) for k, v in sorted(result.predicted.items())}}


def compare(a_path: Path, b_path: Path) -> None:
    a = {r["row_id"]: r for r in json.loads(a_path.read_text())}
    b = {r["row_id"]: r for r in json.loads(b_path.read_text())}
    same = 0
    ta = tb = 0.0
    for row_id in a.keys() & b.keys():
        ra, rb = a[row_id], b[row_id]
        ta += ra["cpu_s"]
        tb += rb["cpu_s"]
        identical = ra["predicted"] == rb["predicted"] and ra["num_steps"] == rb["num_steps"]
        same += identical
        print(f"{ra['cpu_s']:8.2f} s -> {rb['cpu_s']:8.2f} s  {'same' if identical else 'DIFFERENT'}  {ra['label']}")
    n = len(a.keys() & b.keys())
    print(f"{n} rows in both: {same} with identical predictions and steps; CPU {ta:.2f} s -> {tb:.2f} s "
          f"({ta / tb if tb else float('nan'):.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="sglang", choices=(*BACKENDS, "any"))
    ap.add_argument("--family", default="any", choices=("dense", "moe", "mla", "any"))
    ap.add_argument("--disaggregated", default="any", choices=("yes", "no", "any"))
    ap.add_argument("--suite", default="dev", choices=("dev", "eval", "any"))
    ap.add_argument("--tier", default="cross-generation", choices=TIERS)
    ap.add_argument("--source", default="any",
                    choices=("aiconfigurator", "trtllm_throughput", "trtllm_static", "llmservingsim", "any"))
    ap.add_argument("--sample", type=int, default=8)
    ap.add_argument("--groups", type=int, default=0,
                    help="simulate every row of the first N pricing groups, caches shared per group (as validate)")
    ap.add_argument("--match", action="append", default=[], metavar="TEXT",
                    help="only rows whose label contains TEXT (repeatable: all must match)")
    ap.add_argument("--json-out", type=Path)
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BEFORE", "AFTER"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    out = run(args)
    if args.json_out:
        args.json_out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
