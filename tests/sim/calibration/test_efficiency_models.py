"""`EfficiencyModels`: kernel models built once per owner, rebuilt when their inputs change."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from sim.calibration.select import CALIBRATION_DIR, EfficiencyModels, efficiency_model_for
from sim.errors import ConfigError
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware

H100 = load_hardware("h100_sxm")
A100 = load_hardware("a100_sxm")


def test_same_selection_is_built_once_and_each_input_matters() -> None:
    models = EfficiencyModels()
    first = models.get(H100, tier="auto", calibration_path=None, backend="vllm")
    assert models.get(load_hardware("h100_sxm"), tier="auto", calibration_path=None, backend="vllm") is first
    others = [models.get(A100, tier="auto", calibration_path=None, backend="vllm"),
              models.get(H100, tier="cross-generation", calibration_path=None, backend="vllm"),
              models.get(H100, tier="auto", calibration_path=None, backend="sglang"),
              models.get(H100, tier="auto", calibration_path=None, backend="vllm", gemm_backends={"fp8": "sglang"})]
    assert all(m is not first for m in others)
    assert len({id(m) for m in others}) == len(others)
    assert EfficiencyModels().get(H100, tier="auto", calibration_path=None, backend="vllm") is not first


def test_a_rewritten_calibration_file_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "h100.json"
    shutil.copy(CALIBRATION_DIR / "h100_sxm.json", path)
    models = EfficiencyModels()
    first = models.get(H100, tier="target-measured", calibration_path=str(path), backend="vllm")
    assert models.get(H100, tier="target-measured", calibration_path=str(path), backend="vllm") is first
    data = json.loads(path.read_text())
    data["families"]["gemm"]["coef"][0] += 1.0
    path.write_text(json.dumps(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    second = models.get(H100, tier="target-measured", calibration_path=str(path), backend="vllm")
    assert second is not first and isinstance(second, FittedEfficiency)


def test_a_kernel_source_the_calibration_has_no_level_for_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        efficiency_model_for(H100, tier="target-measured", backend="vllm", gemm_backends={"fp8": "tensorrt"})
    assert err.value.key == "kernel_sources.gemm.fp8" and err.value.value == "tensorrt"
    assert "sglang" in err.value.rule
