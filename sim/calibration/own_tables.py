"""Target-measured accuracy from this project's own microbenchmark tables (`kernelsight accuracy microbench`).

`microbench run` measures a GPU with torch kernels (cuBLAS, SDPA, ...); AIConfigurator measured the
same GPU through the serving frameworks' own layers. This scores the target-measured tier a user
would get from our sweep: the cross-generation base is refitted without the GPU (as in
leave-one-GPU-out), corrected on our tables only, and scored on the GPU's AIConfigurator rows
(the same shape-hash subsample as `accuracy kernels`), none of which it was fitted on. Beside it,
on the same rows: the base alone, and the leave-one-GPU-out target-measured tier (corrected on the
AIConfigurator rows at plan points, scored outside plan units, as docs/accuracy.md reports it).
Only families our tables measure are scored. The cross-generation base is also scored on our own
rows (its prediction of the kernels we timed, backend-neutral).

Our kernels are not the frameworks' layers (CUDA-graph-captured bare kernels against framework
layers with their per-call floor and their own kernel choices), so a correction fitted on our rows
alone also learns the torch-to-framework gap and carries it to every framework row. The bridge
learns that gap on a reference GPU that has both (our tables and its AIConfigurator rows at plan
points): per row of the target, bridge = P(ref; corrected on its AIConfigurator plan rows) /
P(ref; corrected on our ref tables), both evaluated on the reference GPU at the target row's
shape, and the bridged prediction is P(target; corrected on our target tables) x bridge. The
reference is never the target, and the target's AIConfigurator rows are never read for it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
import pandas as pd

from sim.calibration.accuracy import EVAL_ONLY, TRAIN_GPUS, family_scores, in_units_of, load
from sim.calibration.batch import predict_latency_s
from sim.calibration.bridge import Reference, bridge_rows
from sim.calibration.fit import fit_correction, fit_cross_generation
from sim.calibration.tables import FAMILY_OF_KERNEL, Exclusion, columns_of, read_microbench_dir
from sim.errors import ConfigError
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware

TIERS: Final = ("cross-generation", "target-measured (own tables)", "target-measured (own tables, bridged)",
                "cross-generation (outside plan units)", "target-measured (own tables, bridged, outside plan units)",
                "target-measured (leave-one-GPU-out)", "target-measured (`calibrate --microbench`: our rows bridged)",
                "target-measured (`calibrate --microbench`, outside plan units)")


def _dev_gpu(gpu: str, key: str) -> None:
    if gpu not in TRAIN_GPUS:
        rule = ("b200_sxm is evaluation-only: its rows may not choose or fit anything" if gpu in EVAL_ONLY
                else f"needs AIConfigurator tables of the GPU: one of {', '.join(TRAIN_GPUS)}")
        raise ConfigError(source="accuracy microbench", key=key, value=gpu, rule=rule)


def _own_rows(directory: Path, gpu: str, key: str) -> tuple[pd.DataFrame, list[Exclusion], str]:
    own, excluded, digest = read_microbench_dir(directory, gpu)
    if not len(own):
        raise ConfigError(source=str(directory), key=key, value=str(directory), rule="holds no microbenchmark table")
    return own.assign(family=own.kernel.map(FAMILY_OF_KERNEL)), excluded, digest


def score_own_tables(data_root: Path, directory: Path, gpu: str, reference: tuple[Path, str],
                     progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Scores per tier and family (see the module docstring) of the tables in `directory` for `gpu`,
    bridged through `reference` = (our tables of another dev GPU, that GPU)."""
    ref_dir, ref_gpu = reference
    _dev_gpu(gpu, "--hardware")
    _dev_gpu(ref_gpu, "--reference-hardware")
    if ref_gpu == gpu:
        raise ConfigError(source="accuracy microbench", key="--reference-hardware", value=ref_gpu,
                          rule="the bridge's reference must be another GPU than the target")
    say = progress or (lambda _: None)
    own, excluded, digest = _own_rows(directory, gpu, "--microbench")
    ref_own, _, ref_digest = _own_rows(ref_dir, ref_gpu, "--reference-microbench")
    families = tuple(sorted(set(own.family.dropna()) & set(ref_own.family.dropna())))
    # the bridge needs the reference's framework rows too (Vidur's pointwise rows exist for some GPUs only)
    say(f"loading {len(TRAIN_GPUS)} GPUs' tables ({', '.join(families)})")
    loaded = load(data_root, TRAIN_GPUS, families=families)
    bridgeable = set(loaded.plan_rows[ref_gpu].kernel.map(FAMILY_OF_KERNEL))
    families = tuple(f for f in families if f in bridgeable)
    hw = load_hardware(gpu)
    train = {g: df for g, df in loaded.rows.items() if g != gpu}
    say(f"fitting the cross-generation base without {gpu}")
    base = fit_cross_generation(train, {g: load_hardware(g) for g in train})
    held = loaded.rows[gpu]
    cols = columns_of(held)
    everything = np.ones(len(held), dtype=bool)
    in_unit = in_units_of(held, loaded.plan_rows[gpu])  # units of the full table's plan points
    say("correcting on our tables and on the AIConfigurator plan points")
    cross, _ = predict_latency_s(cols, hw, FittedEfficiency(base))
    ours, _ = predict_latency_s(cols, hw, FittedEfficiency(fit_correction(base, own, hw)))
    logo, _ = predict_latency_s(cols, hw, FittedEfficiency(fit_correction(base, loaded.plan_rows[gpu], hw)))
    ref_hw = load_hardware(ref_gpu)
    say(f"bridging torch to the frameworks on {ref_gpu}")
    ref_framework, _ = predict_latency_s(cols, ref_hw, FittedEfficiency(
        fit_correction(base, loaded.plan_rows[ref_gpu], ref_hw)))
    ref_torch, _ = predict_latency_s(cols, ref_hw, FittedEfficiency(fit_correction(base, ref_own, ref_hw)))
    bridged = ours * ref_framework / ref_torch
    say("calibrating on our rows bridged to the frameworks (`calibrate --microbench`)")
    bridge = Reference(hardware=ref_hw, own_rows=ref_own, framework_rows=loaded.plan_rows[ref_gpu],
                       tables_sha256=ref_digest)
    calibrated, _ = predict_latency_s(cols, hw, FittedEfficiency(fit_correction(base, bridge_rows(own, base, bridge),
                                                                               hw)))
    tiers = {
        TIERS[0]: family_scores(held, cross, everything),
        TIERS[1]: family_scores(held, ours, everything),
        TIERS[2]: family_scores(held, bridged, everything),
        TIERS[3]: family_scores(held, cross, ~in_unit),
        TIERS[4]: family_scores(held, bridged, ~in_unit),
        TIERS[5]: family_scores(held, logo, ~in_unit),
        TIERS[6]: family_scores(held, calibrated, everything),
        TIERS[7]: family_scores(held, calibrated, ~in_unit),
    }
    own_pred, _ = predict_latency_s(columns_of(own), hw, FittedEfficiency(base))
    return {"gpu": gpu, "directory": str(directory), "tables_sha256": digest, "families": list(families),
            "reference": {"gpu": ref_gpu, "directory": str(ref_dir), "tables_sha256": ref_digest},
            "own_rows": {f: int((own.family == f).sum()) for f in families},
            "excluded": [{"table": e.table, "what": e.what, "rows": e.num_rows} for e in excluded],
            "calibration_rows_leave_one_gpu_out": len(loaded.plan_rows[gpu]),
            "tiers": tiers, "base_on_own_rows": family_scores(own, own_pred, np.ones(len(own), dtype=bool))}


def render_own_tables(result: dict[str, Any], command: str, wall_s: float) -> str:
    """The docs/accuracy.md section for one GPU's own tables."""
    gpu, ref = result["gpu"], result["reference"]["gpu"]
    fams = [f for f in result["families"] if result["tiers"][TIERS[0]].get(f)]
    lines = [f"## Target-measured from our own microbenchmark tables ({gpu})", "",
             f"Regenerate with `{command}` ({wall_s:.0f} s on the 2-core box). Tables: "
             f"`{result['directory']}` (rows per family: "
             + ", ".join(f"{f} {n}" for f, n in result["own_rows"].items()) + "), measured with "
             "`kernelsight microbench run` (torch kernels: cuBLAS, SDPA; see docs/microbench.md). The "
             f"cross-generation base is refitted without {gpu}; 'own tables' corrects it on our rows only; "
             f"'bridged' multiplies that by the torch-to-framework gap learned on {ref} (our tables there "
             f"against its AIConfigurator rows at plan points; `sim/calibration/own_tables.py`). Every score "
             f"is on {gpu}'s AIConfigurator rows (the kernel section's shape-hash subsample), none of which "
             "any of these fits read. 'leave-one-GPU-out' is the kernel section's target-measured tier "
             f"(corrected on {gpu}'s AIConfigurator rows at plan points, "
             f"{result['calibration_rows_leave_one_gpu_out']} rows), on the rows outside plan units.", "",
             "| tier | " + " | ".join(f"{f} ({result['tiers'][TIERS[0]][f]['rows']} rows)" for f in fams)
             + " | mean |", "|---|" + "---:|" * (len(fams) + 1)]
    for tier in TIERS:
        t = result["tiers"][tier]
        mean = np.mean([t[f]["median_ape"] for f in fams if f in t] or [np.nan])
        lines.append(f"| {tier} | " + " | ".join(_cell(t.get(f)) for f in fams) + f" | {100 * mean:.1f}% |")
    lines.append("| cross-generation base on our own rows | "
                 + " | ".join(_cell(result["base_on_own_rows"].get(f)) for f in fams) + " | |")
    lines += ["", "Cells: median APE (median predicted / measured)."]
    return "\n".join(lines) + "\n"


def _cell(score: dict[str, float] | None) -> str:
    if not score:
        return "-"
    return f"{100 * score['median_ape']:.1f}% ({score['median_ratio']:.2f})"

