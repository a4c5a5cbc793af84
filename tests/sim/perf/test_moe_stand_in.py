"""The fused MoE node of a format its backend never measured is priced by the backend's stand-in kernel."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import scenario_dict

from sim.api import step_graph
from sim.calibration.select import efficiency_model_for
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelWork
from sim.perf.fitted import FittedEfficiency
from sim.perf.roofline import roofline
from sim.perf.table_kernels import MOE_DTYPES, MOE_STAND_IN, table_batch, work_columns
from sim.provenance import Provenance
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec
from sim.specs.scenario import scenario_from_dict


def _gpt_oss_moe(backend: str) -> tuple[KernelWork, FittedEfficiency]:
    sc = scenario_from_dict(scenario_dict(hardware={"name": "h200_sxm"}, model={"name": "openai/gpt-oss-120b"},
                                          engine={"backend": backend, "max_model_len": 4096}), source="t.toml")
    work = next(n.work for n in step_graph(sc, BatchShape(decode_context_tokens=(1000,) * 16)).nodes
                if n.work.name == "moe_experts")
    model = efficiency_model_for(sc.hardware, tier="cross-generation", backend=backend)
    assert isinstance(model, FittedEfficiency)
    return work, model


def _table_prediction_s(model: FittedEfficiency, work: KernelWork, backend: str, moe_dtype: str) -> float:
    """The MoE family's predicted latency of the measured-table row (`backend`, `moe_dtype`) at the node's key."""
    rows = work_columns([work])
    rows["backend"] = np.array([backend], dtype=object)
    rows["moe_dtype"] = np.array([moe_dtype], dtype=object)
    hw = _hw()
    tb = table_batch("moe", rows, np.arange(1), hw)
    y, _, _ = model.predict_log_slowdown("moe", tb.prims, tb.cats, hw, rowwise=True)
    return float(tb.roofline_s[0] * np.exp(y[0]))


def _hw() -> HardwareSpec:
    return load_hardware("h200_sxm")


@pytest.mark.parametrize(("backend", "priced_as", "provenance"), [
    ("trtllm", "w4a16_mxfp4", Provenance.TRANSFERRED),  # TensorRT-LLM measured its own W4A16 MXFP4 MoE
    ("vllm", "int4_wo", Provenance.EXTRAPOLATED),  # vLLM measured none: its W4A16 (Marlin) int4 MoE stands in
])
def test_gpt_oss_experts_on_hopper_are_priced_by_the_backends_w4a16_moe(backend: str, priced_as: str,
                                                                        provenance: Provenance) -> None:
    work, model = _gpt_oss_moe(backend)
    eff = model.efficiency(work, _hw())
    assert roofline(work, _hw()).time_s() / eff.value == pytest.approx(
        _table_prediction_s(model, work, backend, priced_as), rel=1e-9)
    assert eff.provenance is provenance
    assert MOE_STAND_IN.get((backend, "w4a16_mxfp4"), "w4a16_mxfp4") == priced_as


def test_every_stand_in_is_a_format_of_the_same_weight_bytes_its_backend_measured() -> None:
    for (backend, missing), stand_in in MOE_STAND_IN.items():
        assert missing != stand_in and backend in ("vllm", "sglang", "trtllm")
        assert (missing, stand_in) in {("w4a16_mxfp4", "int4_wo"), ("int4_wo", "w4a16_mxfp4")}
        assert (backend, stand_in) not in MOE_STAND_IN  # a stand-in is itself measured, never replaced again
        assert abs(MOE_DTYPES[missing][0] - MOE_DTYPES[stand_in][0]) < 0.02  # 4-bit weights plus scales
        assert MOE_DTYPES[missing][1].peak_key() == MOE_DTYPES[stand_in][1].peak_key() == "bf16"  # 16-bit activations
