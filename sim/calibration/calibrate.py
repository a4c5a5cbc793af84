"""Building calibration artifacts from measurement directories (fitting time: pandas)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd

from sim.calibration.accuracy import TRAIN_GPUS, full_rows, plan_mask
from sim.calibration.artifact import CalibrationArtifact
from sim.calibration.bridge import Reference, bridge_rows
from sim.calibration.device_record import check_device_record
from sim.calibration.fit import LEARNER, fit_correction, fit_cross_generation
from sim.calibration.tables import TABLE_FILES, Exclusion, file_sha256, read_microbench_dir, read_vidur_pointwise
from sim.errors import ConfigError
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec


def cross_generation_artifact(data_root: Path, gpus: tuple[str, ...] = TRAIN_GPUS) -> CalibrationArtifact:
    """The cross-generation model fitted on `gpus` (never b200_sxm) from shared/data."""
    if "b200_sxm" in gpus:
        raise ConfigError(source="cross_generation_artifact", key="gpus", value=gpus,
                          rule="b200_sxm is evaluation-only")
    vidur_path = data_root / "vidur" / "compute_mlp_ops.csv.gz"
    vidur = read_vidur_pointwise(vidur_path)
    rows: dict[str, pd.DataFrame] = {}
    sha: dict[str, str] = {"vidur/compute_mlp_ops.csv.gz": file_sha256([vidur_path])}
    for gpu in gpus:
        df, _, digest = read_microbench_dir(data_root / "aiconfigurator" / gpu, gpu)
        rows[gpu] = pd.concat([df, vidur[vidur.gpu == gpu].drop(columns="gpu")], ignore_index=True)
        sha[f"aiconfigurator/{gpu}"] = digest
    families = fit_cross_generation(rows, {g: load_hardware(g) for g in gpus})
    return CalibrationArtifact(tier="cross-generation", hardware=None, fitted_on=tuple(gpus),
                               data_sha256=sha, families=families,
                               notes="learners per family: " + ", ".join(f"{f} {LEARNER[f]}" for f in sorted(families))
                               + "; see docs/kernel-model.md")


def calibrate_dir(hw: HardwareSpec, directory: Path, base: CalibrationArtifact, *,
                  allow_dry_run: bool = False, reference: Reference | None = None) -> CalibrationArtifact:
    """Target-measured artifact: `base` plus a correction fitted on whatever tables `directory` holds
    (refused if its `device.json` names a dry run or another GPU: `check_device_record`), their rows
    bridged to the serving frameworks through `reference` (`sim.calibration.bridge`; None fits on
    them as measured: a torch residual that moves every framework's prediction)."""
    check_device_record(hw, directory, allow_dry_run=allow_dry_run)
    rows, excluded, digest = read_microbench_dir(directory, hw.name)
    if not len(rows):
        raise ConfigError(source=str(directory), key="--microbench", value=str(directory),
                          rule="holds none of " + ", ".join(TABLE_FILES))
    digests = {f"microbench/{hw.name}": digest}
    bridge = "none (rows as measured)"
    if reference is not None:
        if reference.hardware.name == hw.name:
            raise ConfigError(source="calibrate", key="--reference-hardware", value=hw.name,
                              rule="the bridge's reference must be another GPU than the target")
        measured = len(rows)
        rows = bridge_rows(rows, base.families, reference)
        digests[f"microbench/{reference.hardware.name} (bridge reference)"] = reference.tables_sha256
        bridge = (f"through {reference.hardware.name} (our tables there against its framework rows at plan points; "
                  f"{measured} rows measured -> {len(rows)} fitted)")
    art = calibrate_rows(hw, rows, base, excluded=excluded, digests=digests)
    return replace(art, notes=f"{art.notes}; bridge: {bridge}")


def calibrate_rows(hw: HardwareSpec, rows: pd.DataFrame, base: CalibrationArtifact, *,
                   excluded: list[Exclusion], digests: dict[str, str]) -> CalibrationArtifact:
    if base.tier != "cross-generation":
        raise ConfigError(source="calibrate", key="--base", value=base.tier, rule="must be a cross-generation model")
    families = fit_correction(base.families, rows, hw)
    corrected = sorted(f for f, p in families.items() if p.correction is not None)
    notes = (f"corrected families: {', '.join(corrected)}; rows: {len(rows)}; excluded: "
             + "; ".join(f"{e.table} {e.what} ({e.num_rows})" for e in excluded))
    return CalibrationArtifact(tier="target-measured", hardware=hw.name,
                               fitted_on=(*base.fitted_on, f"{hw.name} (correction)"),
                               data_sha256={**base.data_sha256, **digests},
                               families=families, notes=notes)


def shipped_calibration_artifact(data_root: Path, gpu: str, base: CalibrationArtifact) -> CalibrationArtifact:
    """The shipped target-measured calibration of a training GPU: `base` corrected on the rows of
    shared/data at `kernelsight microbench plan` points (what a sweep of that GPU would measure)."""
    if gpu not in TRAIN_GPUS:
        raise ConfigError(source="shipped_calibration_artifact", key="gpu", value=gpu,
                          rule=f"must be one of {', '.join(TRAIN_GPUS)} (b200_sxm is evaluation-only)")
    hw = load_hardware(gpu)
    rows = full_rows(data_root, gpu)
    at_plan, _ = plan_mask(rows, hw)
    _, excluded, digest = read_microbench_dir(data_root / "aiconfigurator" / gpu, gpu)
    vidur = data_root / "vidur" / "compute_mlp_ops.csv.gz"
    return calibrate_rows(hw, rows[at_plan].reset_index(drop=True), base, excluded=excluded,
                          digests={f"aiconfigurator/{gpu} (plan points)": digest,
                                   "vidur/compute_mlp_ops.csv.gz": file_sha256([vidur])})
