"""Cost of the sweep driver's TPE ask as a study grows: `sweeps/quickstart.toml`'s sampler and space
(multivariate TPE, two objectives, constraints) in this process, journal storage, told a cheap
synthetic result per trial, with Optuna's own per-element log-CDF and with
`orchestrator/sweep/fast_truncnorm.py`'s array-wise one.

    python benchmarks/bench_tpe_ask.py [--trials 1000] [--rounds 1]

Each round runs the study once per mode (alternating, same seed, same synthetic results) and prints
CPU milliseconds per ask (ask + drawing the parameters) over all trials and over the last 200;
it fails if the two modes asked different parameters for any trial.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
HARDWARE = ("h100_sxm", "h200_sxm", "a100_sxm", "l40s", "l4")


def _synthetic(params: dict[str, Any], number: int) -> tuple[list[float], float]:
    """(cost, TTFT) and a TPOT constraint: a smooth function of the parameters with a deterministic
    wobble, so TPE has a front to refine; no simulator."""
    hw = HARDWARE.index(str(params["hardware.name"]))
    seqs = float(params["engine.max_num_seqs"])
    wobble = 1.0 + 0.05 * math.sin(number * 12.9898)
    cost = (1 + hw) * (1 + 0.3 * math.log(seqs)) * wobble
    ttft = 0.1 * (5 - hw) / math.log(seqs + 2) * wobble
    return [cost, ttft], math.cos(number * 78.233) - 0.2


def run(trials: int, *, fast: bool) -> tuple[list[float], list[dict[str, Any]]]:
    import optuna
    from optuna.samplers._tpe import _truncnorm

    from orchestrator.sweep import fast_truncnorm
    from orchestrator.sweep.parse import load_sweep
    from orchestrator.sweep.space import suggest_params
    from orchestrator.sweep.study import make_sampler, open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_sweep(REPO / "sweeps" / "quickstart.toml")
    sampler = make_sampler(spec)  # installs the array-wise log-CDF
    if not fast:
        reference = _truncnorm._log_ndtr_single
        _truncnorm._log_ndtr = lambda a: optuna_log_ndtr(reference, a)
    assert getattr(_truncnorm._log_ndtr, "kernelsight_array_wise", False) is fast
    with tempfile.TemporaryDirectory(prefix="bench-tpe-") as tmp:
        storage, _ = open_storage(None, Path(tmp))
        study = optuna.create_study(storage=storage, sampler=sampler, study_name="bench",
                                    directions=["minimize", "minimize"])
        cpu_ms: list[float] = []
        asked: list[dict[str, Any]] = []
        for number in range(trials):
            t0 = time.process_time()
            trial = study.ask()
            params = suggest_params(trial, spec.space)
            cpu_ms.append((time.process_time() - t0) * 1e3)
            asked.append(params)
            values, tpot = _synthetic(params, number)
            trial.set_constraint("tpot_p90_s", tpot)
            study.tell(trial, values)
    fast_truncnorm.install()
    return cpu_ms, asked


def optuna_log_ndtr(single: Any, a: Any) -> Any:
    """Optuna 5.0's `_truncnorm._log_ndtr`: its scalar function per element."""
    import numpy as np

    return np.frompyfunc(single, 1, 1)(a).astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    for round_ in range(args.rounds):
        out: dict[str, Any] = {"round": round_, "trials": args.trials}
        asked: dict[str, list[dict[str, Any]]] = {}
        for mode in ("optuna", "array_wise"):
            ms, asked[mode] = run(args.trials, fast=mode == "array_wise")
            tail = ms[-200:]
            out[mode] = {"ask_cpu_ms_mean": round(sum(ms) / len(ms), 1),
                         "ask_cpu_ms_last_200": round(sum(tail) / len(tail), 1)}
        same = asked["optuna"] == asked["array_wise"]
        out["same_parameters_every_trial"] = same
        print(json.dumps(out))
        if not same:
            raise SystemExit("the two modes asked different parameters")


if __name__ == "__main__":
    main()
