"""Building calibration artifacts from measurement directories (fitting time: pandas)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sim.calibration.accuracy import TRAIN_GPUS
from sim.calibration.artifact import CalibrationArtifact
from sim.calibration.fit import fit_correction, fit_cross_generation
from sim.calibration.tables import file_sha256, read_microbench_dir, read_vidur_pointwise
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
                               notes="ridge in log space with level interactions; see docs/kernel-model.md")


def calibrate_dir(hw: HardwareSpec, directory: Path, base: CalibrationArtifact) -> CalibrationArtifact:
    """Target-measured artifact: `base` plus a correction fitted on whatever tables `directory` holds."""
    rows, excluded, digest = read_microbench_dir(directory, hw.name)
    if not len(rows):
        raise ConfigError(source=str(directory), key="--microbench", value=str(directory),
                          rule="holds none of gemm.csv.gz, context_attention.csv.gz, "
                               "generation_attention.csv.gz, nccl.csv, custom_allreduce.csv")
    families = fit_correction(base.families, rows, hw)
    corrected = sorted(f for f, p in families.items() if p.correction is not None)
    notes = (f"corrected families: {', '.join(corrected)}; rows: {len(rows)}; excluded: "
             + "; ".join(f"{e.table} {e.what} ({e.num_rows})" for e in excluded))
    return CalibrationArtifact(tier="target-measured", hardware=hw.name,
                               fitted_on=(*base.fitted_on, f"{hw.name} (correction)"),
                               data_sha256={**base.data_sha256, f"microbench/{hw.name}": digest},
                               families=families, notes=notes)
