"""Our own microbenchmark rows carried over to the serving frameworks' kernels before a correction is
fitted on them (`kernelsight calibrate --microbench`).

`microbench run` times bare torch kernels (cuBLAS, SDPA, ...) under CUDA graphs; the frameworks run
their own layers, with their own kernel choices and per-call costs. A correction fitted on our rows
as measured is a residual against a backend level the base model never saw (`backend = torch`), and
the pooled group it falls into moves every framework's prediction by that residual: calibrating an
H100 from our tables priced vLLM's bf16 GEMMs at ~0.8x their measured time, some at the peak
(docs/accuracy.md, "Target-measured from our own microbenchmark tables").

The bridge learns the torch-to-framework gap on a reference GPU that has both our tables and the
frameworks' measured rows at the plan's points (h100_sxm and h200_sxm ship both): for each of our
rows and each framework b the reference measured for the row's family,

    latency_b = latency_ours x P_ref(b; corrected on its framework rows) / P_ref(torch; corrected on our ref tables),

both predictions at the row's shape on the reference GPU. The correction is then fitted on these
rows, one group per framework, as on a framework's own measurements. Families whose correction has
no backend level (pointwise, collectives) and families the reference lacks keep our rows as they are.
`kernelsight accuracy microbench` scores the result beside the prediction-level bridge it reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.calibration.accuracy import TRAIN_GPUS, full_rows, plan_mask
from sim.calibration.batch import predict_latency_s
from sim.calibration.device_record import check_device_record
from sim.calibration.fit import CORRECTION_CATEGORICALS, fit_correction
from sim.calibration.tables import FAMILY_OF_KERNEL, columns_of, read_microbench_dir
from sim.errors import ConfigError
from sim.perf.fitted import FamilyParams, FittedEfficiency
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec

SHIPPED_TABLES = Path(__file__).resolve().parent.parent / "data" / "microbench"
"""Our own tables of the GPUs we measured (`<gpu>/<date>/`), the references a bridge can use."""


@dataclass(frozen=True, slots=True)
class Reference:
    hardware: HardwareSpec
    own_rows: pd.DataFrame
    """Our tables of the reference GPU."""
    framework_rows: pd.DataFrame
    """The reference's measured framework rows at the plan's points."""
    tables_sha256: str


def shipped_reference_dir(gpu: str) -> Path | None:
    """The newest shipped table set of `gpu` (None if none ships)."""
    runs = sorted(p for p in (SHIPPED_TABLES / gpu).glob("*") if p.is_dir()) if (SHIPPED_TABLES / gpu).is_dir() else []
    return runs[-1] if runs else None


def default_reference_gpu(target: str) -> str:
    """The GPU whose shipped tables bridge `target`'s: the first training GPU with shipped tables other than it."""
    for gpu in sorted(TRAIN_GPUS):
        if gpu != target and shipped_reference_dir(gpu) is not None:
            return gpu
    raise ConfigError(source="calibrate", key="--reference-hardware", value=None,
                      rule="no shipped microbenchmark tables of another GPU to bridge through")


def load_reference(data_root: Path, gpu: str, directory: Path | None = None) -> Reference:
    """The bridge's reference: our tables of `gpu` (`directory`, default the shipped ones) and its
    measured framework rows at plan points (from `data_root`: shared/data or the shipped copy)."""
    if gpu not in TRAIN_GPUS:
        raise ConfigError(source="calibrate", key="--reference-hardware", value=gpu,
                          rule=f"must be a GPU with measured framework rows: {', '.join(TRAIN_GPUS)}")
    directory = directory or shipped_reference_dir(gpu)
    if directory is None:
        raise ConfigError(source="calibrate", key="--reference-microbench", value=None,
                          rule=f"no shipped tables of {gpu}: pass our tables of it")
    hw = load_hardware(gpu)
    check_device_record(hw, directory)  # a dry run's or another GPU's tables bridge nothing
    own, _, digest = read_microbench_dir(directory, gpu)
    if not len(own):
        raise ConfigError(source=str(directory), key="--reference-microbench", value=str(directory),
                          rule="holds no microbenchmark table")
    rows = full_rows(data_root, gpu)
    at_plan, _ = plan_mask(rows, hw)
    return Reference(hardware=hw, own_rows=own, framework_rows=rows[at_plan].reset_index(drop=True),
                     tables_sha256=digest)


def bridge_rows(own: pd.DataFrame, base: Mapping[str, FamilyParams], ref: Reference) -> pd.DataFrame:
    """`own` (our rows of the target GPU) with each row of a bridgeable family replaced by one row per
    framework the reference measured for that family, its latency carried over (module docstring)."""
    families = own.kernel.map(FAMILY_OF_KERNEL)
    ref_families = ref.framework_rows.kernel.map(FAMILY_OF_KERNEL)
    ref_own_families = set(ref.own_rows.kernel.map(FAMILY_OF_KERNEL).dropna())
    bridgeable = [f for f in sorted(set(families.dropna()))
                  if CORRECTION_CATEGORICALS.get(f, ("",))[0] == "backend" and f in ref_own_families
                  and (ref_families == f).any()]
    if not bridgeable:
        return own
    framework = FittedEfficiency(fit_correction(base, ref.framework_rows, ref.hardware))
    torch = FittedEfficiency(fit_correction(base, ref.own_rows, ref.hardware))
    keep = [own[~families.isin(bridgeable).to_numpy()]]
    for family in bridgeable:
        rows = own[(families == family).to_numpy()]
        at_ref, _ = predict_latency_s(columns_of(rows), ref.hardware, torch)
        for backend in sorted(set(ref.framework_rows.backend[(ref_families == family).to_numpy()].astype(str))):
            as_b = rows.assign(backend=backend)
            in_b, _ = predict_latency_s(columns_of(as_b), ref.hardware, framework)
            keep.append(as_b.assign(latency_s=rows.latency_s.to_numpy() * in_b / at_ref))
    out = pd.concat(keep, ignore_index=True)
    bad = ~np.isfinite(out.latency_s.to_numpy(dtype=float)) | (out.latency_s.to_numpy(dtype=float) <= 0)
    kept: pd.DataFrame = out[~bad].reset_index(drop=True)
    return kept
