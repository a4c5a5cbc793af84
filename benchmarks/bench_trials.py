"""Actor-side CPU of a sweep's trials: one `TrialEvaluator` evaluating a fixed list of trials in-process.

    python benchmarks/bench_trials.py [--sweep sweeps/quickstart.toml] [--trials 200] [--seed 0]
        [--no-render] [--fresh-prices] [--json-out FILE] [--compare BEFORE.json AFTER.json]

The trials' parameters come from Optuna's `RandomSampler` seeded with `--seed` over the sweep's
`[space]` (the same parameters on any code), without Ray, MLflow or the driver: this measures what
an actor does per trial (build the scenario, simulate, metrics, and with rendering on the kernel
breakdown's Parquet and PNG). Trials that repeat an earlier trial's scenario are skipped (the
driver answers those from its cache). `--fresh-prices` gives every trial a new price cache (what
the shared one saves, and a check that sharing changes no result). Prints CPU per trial
(`time.process_time`) and a SHA-256 of every trial's status and metrics; `--json-out` writes them
per trial so that two codes can be compared (`--compare`: CPU and whether every trial's metrics
are bitwise the same). BLAS is pinned to one thread before numpy loads.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from orchestrator.sweep.spec import ParamValue  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _params(sweep: Path, trials: int, seed: int) -> list[dict[str, ParamValue]]:
    import optuna

    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.space import suggest_params

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_sweep(sweep)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(trials):
        trial = study.ask()
        out.append(dict(suggest_params(trial, spec.space)))
        study.tell(trial, 0.0)
    return out


def run(args: argparse.Namespace) -> list[dict[str, object]]:
    from orchestrator.sweep.evaluate import TrialEvaluator, build_scenario
    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.results import TrialInput
    from sim.engine.part_prices import PriceCache
    from sim.errors import ConfigError

    spec = load_sweep(args.sweep)
    base = spec.load_base()
    evaluator = TrialEvaluator(base, render_artifacts=not args.no_render)
    seen: set[str] = set()
    out: list[dict[str, object]] = []
    total = 0.0
    for number, params in enumerate(_params(args.sweep, args.trials, args.seed)):
        try:
            scenario_hash = build_scenario(base, params).scenario_hash()
        except ConfigError:
            scenario_hash = f"invalid-{number}"
        if scenario_hash in seen:
            continue
        seen.add(scenario_hash)
        if args.fresh_prices:
            evaluator._prices = PriceCache()
        start = time.process_time()
        result = evaluator.evaluate(TrialInput(number=number, params=params))
        cpu_s = time.process_time() - start
        total += cpu_s
        out.append({"number": number, "status": result.status.value, "cpu_s": cpu_s,
                    "metrics": {k: repr(v) for k, v in sorted(result.metrics.items())}})
    digest = hashlib.sha256(json.dumps([(r["number"], r["status"], r["metrics"]) for r in out]).encode()).hexdigest()
    print(f"{len(out)} distinct trials of {args.trials}; {total:.2f} s CPU, {total / max(len(out), 1) * 1e3:.1f} ms "
          f"per trial ({'no rendering' if args.no_render else 'with Parquet + PNG'}"
          f"{', fresh prices' if args.fresh_prices else ''}); results sha256 {digest[:16]}")
    return out


def compare(a_path: Path, b_path: Path) -> None:
    a = {r["number"]: r for r in json.loads(a_path.read_text())}
    b = {r["number"]: r for r in json.loads(b_path.read_text())}
    both = sorted(a.keys() & b.keys())
    same = sum(a[n]["metrics"] == b[n]["metrics"] and a[n]["status"] == b[n]["status"] for n in both)
    ta = sum(a[n]["cpu_s"] for n in both)
    tb = sum(b[n]["cpu_s"] for n in both)
    worst = 0.0
    for n in both:
        for key, text in a[n]["metrics"].items():
            x, y = float(text), float(b[n]["metrics"].get(key, "nan"))
            if x != y and x:
                worst = max(worst, abs(y - x) / abs(x))
    print(f"{len(both)} trials in both: {same} with bitwise identical metrics (largest relative difference "
          f"{worst:.2g}); CPU {ta:.2f} s -> {tb:.2f} s ({ta / tb if tb else float('nan'):.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", type=Path, default=REPO / "sweeps" / "quickstart.toml")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-render", action="store_true", help="skip the breakdown's Parquet and PNG")
    ap.add_argument("--fresh-prices", action="store_true", help="a new price cache per trial")
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
