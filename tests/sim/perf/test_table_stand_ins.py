"""A table-keyed kernel its backend never measured (or measured host-bound) is priced by the backend's stand-in."""

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
from sim.perf.stand_ins import MLA_KV_STAND_IN, MOE_STAND_IN
from sim.perf.table_kernels import MOE_DTYPES, table_batch, work_columns
from sim.provenance import Provenance
from sim.specs.catalog import load_hardware
from sim.specs.hardware import HardwareSpec
from sim.specs.scenario import scenario_from_dict


def _node(model_name: str, backend: str, name: str, **engine: object) -> tuple[KernelWork, FittedEfficiency]:
    sc = scenario_from_dict(scenario_dict(hardware={"name": "h200_sxm"}, model={"name": model_name},
                                          engine={"backend": backend, "max_model_len": 4096,
                                                  "tensor_parallel_size": 8, **engine}), source="t.toml")
    work = next(n.work for n in step_graph(sc, BatchShape(decode_context_tokens=(1000,) * 16)).nodes
                if n.work.name == name)
    model = efficiency_model_for(sc.hardware, tier="cross-generation", backend=backend)
    assert isinstance(model, FittedEfficiency)
    return work, model


def _table_prediction_s(model: FittedEfficiency, work: KernelWork, table: str, family: str, backend: str,
                        **key: str) -> float:
    """The family's predicted latency of the measured-table row of `backend` with `key` at the node's shape."""
    rows = work_columns([work])
    rows["backend"] = np.array([backend], dtype=object)
    for column, value in key.items():
        rows[column] = np.array([value], dtype=object)
    hw = _hw()
    tb = table_batch(table, rows, np.arange(1), hw)
    y, _, _ = model.predict_log_slowdown(family, tb.prims, tb.cats, hw, rowwise=True)
    return float(tb.roofline_s[0] * np.exp(y[0]))


def _hw() -> HardwareSpec:
    return load_hardware("h200_sxm")


@pytest.mark.parametrize(("backend", "priced_as", "provenance"), [
    ("trtllm", "w4a16_mxfp4", Provenance.TRANSFERRED),  # TensorRT-LLM measured its own W4A16 MXFP4 MoE
    ("vllm", "int4_wo", Provenance.EXTRAPOLATED),  # vLLM measured none: its W4A16 (Marlin) int4 MoE stands in
])
def test_gpt_oss_experts_on_hopper_are_priced_by_the_backends_w4a16_moe(backend: str, priced_as: str,
                                                                        provenance: Provenance) -> None:
    work, model = _node("openai/gpt-oss-120b", backend, "moe_experts")
    eff = model.efficiency(work, _hw())
    assert roofline(work, _hw()).time_s() / eff.value == pytest.approx(
        _table_prediction_s(model, work, "moe", "moe", backend, moe_dtype=priced_as), rel=1e-9)
    assert eff.provenance is provenance
    assert MOE_STAND_IN.get((backend, "w4a16_mxfp4"), "w4a16_mxfp4") == priced_as


def test_every_stand_in_is_a_format_of_the_same_weight_bytes_its_backend_measured() -> None:
    for (backend, missing), stand_in in MOE_STAND_IN.items():
        assert missing != stand_in and backend in ("vllm", "sglang", "trtllm")
        assert (missing, stand_in) in {("w4a16_mxfp4", "int4_wo"), ("int4_wo", "w4a16_mxfp4")}
        assert (backend, stand_in) not in MOE_STAND_IN  # a stand-in is itself measured, never replaced again
        assert abs(MOE_DTYPES[missing][0] - MOE_DTYPES[stand_in][0]) < 0.02  # 4-bit weights plus scales
        assert MOE_DTYPES[missing][1].peak_key() == MOE_DTYPES[stand_in][1].peak_key() == "bf16"  # 16-bit activations


@pytest.mark.parametrize(("backend", "priced_as", "provenance"), [
    ("trtllm", "fp8", Provenance.TRANSFERRED),  # TensorRT-LLM's FP8-cache MLA kernel, as measured
    ("vllm", "bfloat16", Provenance.EXTRAPOLATED),  # vLLM's FP8-cache series is host-bound: its bf16 one stands in
])
def test_mla_decode_with_an_fp8_cache_is_priced_by_the_backends_kernel_for_it(backend: str, priced_as: str,
                                                                              provenance: Provenance) -> None:
    work, model = _node("deepseek-ai/DeepSeek-R1", backend, "mla_decode", kv_cache_dtype="fp8")
    eff = model.efficiency(work, _hw())
    assert roofline(work, _hw()).time_s() / eff.value == pytest.approx(
        _table_prediction_s(model, work, "mla_generation", "mla_decode", backend, kv_cache_dtype=priced_as),
        rel=1e-9)
    assert eff.provenance is provenance
    assert MLA_KV_STAND_IN.get((backend, "fp8"), "fp8") == priced_as
