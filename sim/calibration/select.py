"""Which efficiency model prices a GPU: the one entry point the simulator calls.

"auto" = target-measured where a calibration for `hw.name` ships in sim/data/calibration (or
`calibration_path` is given), else cross-generation. The cross-generation tier reads only
cross_generation.json and the target's datasheet, never the target's measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Final, Literal

from sim.calibration.artifact import CalibrationArtifact, load_artifact
from sim.errors import ConfigError
from sim.perf.efficiency import EfficiencyModel, RooflineEfficiency
from sim.perf.fitted import FittedEfficiency
from sim.specs.hardware import HardwareSpec

Tier = Literal["auto", "roofline", "cross-generation", "target-measured"]
CALIBRATION_DIR: Final = Path(__file__).resolve().parent.parent / "data" / "calibration"
CROSS_GENERATION_FILE: Final = "cross_generation.json"
DEFAULT_BACKEND: Final = "vllm"
"""Backend whose kernels the simulator prices (it models vLLM's engine)."""


def _load(path: str | Path) -> CalibrationArtifact:
    """`load_artifact`, parsed once per process per file version: a sweep worker or a validate
    worker simulates many scenarios on a few calibrations, and parsing one is ~40 ms, about a third
    of a small trial. A file rewritten in place (new mtime or size) is read again; errors name the
    path as given."""
    try:
        st = Path(path).stat()
        key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        return load_artifact(path)  # the loader reports the missing file
    art = _ARTIFACTS.get(key)
    if art is None:
        art = load_artifact(path)
        if len(_ARTIFACTS) >= _MAX_ARTIFACTS:
            _ARTIFACTS.clear()
        _ARTIFACTS[key] = art
    return art


_ARTIFACTS: dict[tuple[str, int, int], CalibrationArtifact] = {}
"""(resolved path, mtime, size) -> parsed artifact; artifacts are frozen values, safe to share."""
_MAX_ARTIFACTS: Final = 32


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
            art = _load(calibration_path)
            if art.tier != "cross-generation":
                raise ConfigError(source=calibration_path, key="tier", value=art.tier,
                                  rule="the cross-generation tier never reads target measurements")
            return art
        return _load(CALIBRATION_DIR / CROSS_GENERATION_FILE)
    path = calibration_path or shipped_calibration(hw.name)
    if tier == "auto" and path is None:
        return _load(CALIBRATION_DIR / CROSS_GENERATION_FILE)
    if path is None:
        raise ConfigError(source="efficiency_model_for", key="calibration_path", value=None,
                          rule=f"no shipped calibration for {hw.name!r}; run `kernelsight calibrate`")
    art = _load(path)
    if art.tier != "target-measured" or art.hardware != hw.name:
        raise ConfigError(source=str(path), key="hardware", value=art.hardware,
                          rule=f"must be a target-measured calibration of {hw.name!r}")
    return art


def efficiency_model_for(hw: HardwareSpec, *, tier: Tier = "auto",
                         calibration_path: str | None = None,
                         backend: str | None = DEFAULT_BACKEND,
                         gemm_backends: Mapping[str, str] | None = None) -> EfficiencyModel:
    art = load_for_tier(hw, tier, calibration_path)
    if art is None:
        return RooflineEfficiency()
    return FittedEfficiency(art.families, backend=backend, gemm_backends=gemm_backends)
