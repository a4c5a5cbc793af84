"""Which efficiency model prices a GPU: the one entry point the simulator calls.

"auto" = target-measured where a calibration for `hw.name` ships in sim/data/calibration (or
`calibration_path` is given), else cross-generation. The cross-generation tier reads only
cross_generation.json and the target's datasheet, never the target's measurements.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from sim.calibration.artifact import CalibrationArtifact, load_artifact
from sim.errors import ConfigError
from sim.perf.efficiency import EfficiencyModel, RooflineEfficiency
from sim.perf.fitted import FittedEfficiency
from sim.perf.profile import TABLE_SOURCE_KEYS
from sim.perf.table_kernels import TABLE_FAMILY
from sim.serde import config_hash
from sim.specs.hardware import HardwareSpec

Tier = Literal["auto", "roofline", "cross-generation", "target-measured"]
CALIBRATION_DIR: Final = Path(__file__).resolve().parent.parent / "data" / "calibration"
CROSS_GENERATION_FILE: Final = "cross_generation.json"
DEFAULT_BACKEND: Final = "vllm"
"""Backend whose kernels the simulator prices (it models vLLM's engine)."""


def shipped_calibration(hw_name: str) -> Path | None:
    path = CALIBRATION_DIR / f"{hw_name}.json"
    return path if path.is_file() else None


def load_for_tier(hw: HardwareSpec, tier: Tier, calibration_path: str | None
                  ) -> CalibrationArtifact | None:
    """The artifact a tier uses (None for roofline); validates tier against the artifact."""
    if tier == "roofline":
        return None
    if tier == "cross-generation":
        if calibration_path is not None:
            art = load_artifact(calibration_path)
            if art.tier != "cross-generation":
                raise ConfigError(source=calibration_path, key="tier", value=art.tier,
                                  rule="the cross-generation tier never reads target measurements")
            return art
        return load_artifact(CALIBRATION_DIR / CROSS_GENERATION_FILE)
    path = calibration_path or shipped_calibration(hw.name)
    if tier == "auto" and path is None:
        return load_artifact(CALIBRATION_DIR / CROSS_GENERATION_FILE)
    if path is None:
        raise ConfigError(source="efficiency_model_for", key="calibration_path", value=None,
                          rule=f"no shipped calibration for {hw.name!r}; run `kernelsight calibrate`")
    art = load_artifact(path)
    if art.tier != "target-measured" or art.hardware != hw.name:
        raise ConfigError(source=str(path), key="hardware", value=art.hardware,
                          rule=f"must be a target-measured calibration of {hw.name!r}")
    return art


def efficiency_model_for(hw: HardwareSpec, *, tier: Tier = "auto",
                         calibration_path: str | None = None,
                         backend: str | None = DEFAULT_BACKEND,
                         gemm_backends: Mapping[str, str] | None = None,
                         table_backends: Mapping[str, str] | None = None) -> EfficiencyModel:
    art = load_for_tier(hw, tier, calibration_path)
    if art is None:
        return RooflineEfficiency()
    wanted = [("gemm", f"kernel_sources.gemm.{dtype}", source) for dtype, source in (gemm_backends or {}).items()]
    keys = {table: key for key, table in TABLE_SOURCE_KEYS.items()}
    wanted += [(TABLE_FAMILY[table], f"kernel_sources.{keys.get(table, table)}", source)
               for table, source in (table_backends or {}).items()]
    for family, key, source in wanted:
        params = art.families.get(family)
        levels = dict(params.categoricals).get("backend", ()) if params is not None else ()
        if source not in levels:
            raise ConfigError(source=calibration_path or "shipped calibration", key=key, value=source,
                              rule=f"the calibration's {family} model has backend levels {', '.join(levels) or 'none'}")
    return FittedEfficiency(art.families, backend=backend, gemm_backends=gemm_backends,
                            table_backends=table_backends)


class EfficiencyModels:
    """Kernel models by what selects them (hardware, tier, calibration file version, backend, kernel
    sources), built once per instance: a sweep worker simulates many trials on a few of them, and
    parsing a calibration is ~40 ms, about a third of a small trial. Models are pure values, so one
    serves every trial that selects it; a calibration file rewritten in place is read again."""

    def __init__(self) -> None:
        self._models: dict[tuple[object, ...], EfficiencyModel] = {}

    def get(self, hw: HardwareSpec, *, tier: Tier, calibration_path: str | None, backend: str | None,
            gemm_backends: Mapping[str, str] | None = None,
            table_backends: Mapping[str, str] | None = None) -> EfficiencyModel:
        version: tuple[int, ...] = ()
        if calibration_path is not None:
            with contextlib.suppress(OSError):  # a missing file is reported by the loader
                st = Path(calibration_path).stat()
                version = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        key = (config_hash(hw), tier, calibration_path, version, backend,
               tuple(sorted((gemm_backends or {}).items())), tuple(sorted((table_backends or {}).items())))
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = efficiency_model_for(hw, tier=tier, calibration_path=calibration_path,
                                                             backend=backend, gemm_backends=gemm_backends,
                                                             table_backends=table_backends)
        return model
