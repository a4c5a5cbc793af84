"""Engine-profile kernel sources: an engine's dense GEMMs priced by another framework's measurements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.api import load_engine_profile, predict_step
from sim.calibration.select import efficiency_model_for
from sim.dtypes import DType
from sim.errors import ConfigError
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import KernelColumns
from sim.perf.fitted import FittedEfficiency
from sim.specs.catalog import load_hardware
from sim.specs.scenario import scenario_from_dict
from sim.validation.fit import profile_toml

H100 = load_hardware("h100_sxm")


def _gemm(kind: KernelKind, dtype: DType, m: int, n: int = 4096, k: int = 4096) -> KernelWork:
    per = 1.0 if dtype in (DType.FP8, DType.FP8_BLOCK) else 2.0
    return KernelWork(kind=kind, name="g", dtype=dtype, flops=2.0 * m * n * k, weight_bytes=per * n * k,
                      activation_bytes=per * m * k + 2.0 * m * n, shape=(m, n, k))


def _model(backend: str, sources: dict[str, str] | None = None) -> FittedEfficiency:
    model = efficiency_model_for(H100, tier="target-measured", backend=backend, gemm_backends=sources)
    assert isinstance(model, FittedEfficiency)
    return model


def test_shipped_vllm_profile_prices_quantized_dense_gemms_with_sglang_kernels() -> None:
    assert dict(load_engine_profile("vllm").kernel_sources.gemm) == {"fp8": "sglang", "fp8_block": "sglang"}
    assert not load_engine_profile("sglang").kernel_sources.gemm
    assert not load_engine_profile("trtllm").kernel_sources.gemm


@pytest.mark.parametrize("m", [16, 256, 8192])
def test_override_selects_the_other_backend_for_dense_gemms_only(m: int) -> None:
    vllm, sglang = _model("vllm"), _model("sglang")
    redirected = _model("vllm", {"fp8": "sglang"})
    fp8 = _gemm(KernelKind.GEMM, DType.FP8, m)
    assert redirected.efficiency(fp8, H100) == sglang.efficiency(fp8, H100)
    assert redirected.efficiency(fp8, H100).value != vllm.efficiency(fp8, H100).value
    # Formats not named, and MoE grouped GEMMs (another kernel path), keep the engine's own level.
    bf16 = _gemm(KernelKind.GEMM, DType.BFLOAT16, m)
    assert redirected.efficiency(bf16, H100) == vllm.efficiency(bf16, H100)
    moe = _gemm(KernelKind.MOE_GEMM, DType.FP8, m)
    assert redirected.efficiency(moe, H100) == vllm.efficiency(moe, H100)


def test_column_path_applies_the_same_override() -> None:
    redirected = _model("vllm", {"fp8": "sglang"})
    works = [_gemm(KernelKind.GEMM, DType.FP8, m) for m in (1, 7, 64, 300, 4096)]
    values, _ = redirected.efficiency_columns(KernelColumns.of(works), H100)
    one = np.array([redirected.efficiency(w, H100).value for w in works])
    np.testing.assert_allclose(values, one, rtol=1e-6)


def test_simulated_step_uses_the_profile_kernel_sources() -> None:
    base = {"hardware": {"name": "h100_sxm"}, "model": {"name": "meta-llama/Llama-3.1-8B"},
            "engine": {"quantization": "fp8", "max_model_len": 4096}, "perf": {"tier": "target-measured"},
            "workload": {"num_prompts": 1, "random_input_len": 16, "random_output_len": 4}}
    scenario = scenario_from_dict(base, source="test")
    batch = BatchShape(prefills=(PrefillChunk(new_tokens=4096),))
    step = predict_step(scenario, batch)
    own = predict_step(scenario, batch, efficiency=_model("vllm"))
    redirected = predict_step(scenario, batch, efficiency=_model("vllm", {"fp8": "sglang", "fp8_block": "sglang"}))
    assert step.device_s() == pytest.approx(redirected.device_s(), rel=1e-12)
    assert step.device_s() != pytest.approx(own.device_s(), rel=1e-3)


def test_bad_kernel_source_names_file_key_and_rule(tmp_path: Path) -> None:
    profile = load_engine_profile("vllm")
    text = profile_toml(profile, header="test").replace('fp8 = "sglang"', 'fp8 = "tensorrt"')
    path = tmp_path / "vllm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_engine_profile("vllm", path)
    assert err.value.key == "kernel_sources.gemm.fp8" and err.value.value == "tensorrt"
    assert str(path) in str(err.value) and "must be one of" in err.value.rule


def test_profile_toml_round_trips_kernel_sources(tmp_path: Path) -> None:
    profile = load_engine_profile("vllm")
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(profile, header="test"))
    assert load_engine_profile("vllm", path) == profile


def test_unknown_weight_format_is_an_error_naming_it(tmp_path: Path) -> None:
    text = profile_toml(load_engine_profile("vllm"), header="test").replace("fp8_block = ", "fp8block = ")
    path = tmp_path / "vllm.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_engine_profile("vllm", path)
    assert err.value.key == "kernel_sources.gemm.fp8block" and "weight format" in err.value.rule


def test_profiles_stay_hashable_values() -> None:
    profile = load_engine_profile("vllm")
    assert hash(profile) == hash(load_engine_profile("vllm")) and profile == load_engine_profile("vllm")


def _mla_prefill(tokens: int, heads: int = 16) -> KernelWork:
    flops = 2.0 * heads * (192 + 128) * tokens * tokens / 2
    return KernelWork(kind=KernelKind.MLA_PREFILL, name="mla_prefill", dtype=DType.FP8, flops=flops,
                      activation_bytes=tokens * heads * (192 * 2 + 128 * 2) * 2.0, shape=(1, tokens, 0, heads, 128, 64, 128))


def test_shipped_sglang_profile_prices_mla_attention_with_trtllm_rows() -> None:
    sglang = load_engine_profile("sglang").kernel_sources
    assert (sglang.mla_prefill, sglang.mla_decode) == ("trtllm", "trtllm")
    assert sglang.table_backends() == {"mla_context": "trtllm", "mla_generation": "trtllm"}
    for backend in ("vllm", "trtllm"):
        assert load_engine_profile(backend).kernel_sources.table_backends() == {}


def test_mla_decode_source_selects_the_other_backend_rows_for_mla_decode_only() -> None:
    own = efficiency_model_for(H100, tier="cross-generation", backend="sglang")
    trt = efficiency_model_for(H100, tier="cross-generation", backend="trtllm")
    redirected = efficiency_model_for(H100, tier="cross-generation", backend="sglang",
                                      table_backends={"mla_generation": "trtllm"})
    decode = KernelWork(kind=KernelKind.MLA_DECODE, name="mla_decode", dtype=DType.FP8, flops=1e9,
                        activation_bytes=1e7, shape=(8, 2048, 2048, 16, 512, 64))
    assert redirected.efficiency(decode, H100) == trt.efficiency(decode, H100)
    assert redirected.efficiency(decode, H100).value != own.efficiency(decode, H100).value
    assert redirected.efficiency(_mla_prefill(4096), H100) == own.efficiency(_mla_prefill(4096), H100)


@pytest.mark.parametrize("tokens", [512, 8192])
def test_mla_prefill_source_selects_the_other_backend_rows_for_mla_prefill_only(tokens: int) -> None:
    own = efficiency_model_for(H100, tier="cross-generation", backend="sglang")
    trt = efficiency_model_for(H100, tier="cross-generation", backend="trtllm")
    redirected = efficiency_model_for(H100, tier="cross-generation", backend="sglang",
                                      table_backends={"mla_context": "trtllm"})
    work = _mla_prefill(tokens)
    assert redirected.efficiency(work, H100) == trt.efficiency(work, H100)
    assert redirected.efficiency(work, H100).value != own.efficiency(work, H100).value
    values, _ = redirected.efficiency_columns(KernelColumns.of([work]), H100)
    assert values[0] == redirected.efficiency(work, H100).value
    # Other table-keyed kernels (the absorbed MLA decode) keep the engine's own rows.
    decode = KernelWork(kind=KernelKind.MLA_DECODE, name="mla_decode", dtype=DType.FP8, flops=1e9,
                        activation_bytes=1e7, shape=(8, 2048, 2048, 16, 512, 64))
    assert redirected.efficiency(decode, H100) == own.efficiency(decode, H100)


def test_mla_prefill_source_names_the_key_when_the_calibration_lacks_the_level(tmp_path: Path) -> None:
    text = profile_toml(load_engine_profile("sglang"), header="test").replace('mla_decode = "trtllm"',
                                                                               'mla_decode = "tensorrt"')
    path = tmp_path / "sglang.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_engine_profile("sglang", path)
    assert err.value.key == "kernel_sources.mla_decode" and err.value.value == "tensorrt"
    assert "must be one of" in err.value.rule


def test_sglang_profile_toml_round_trips_the_mla_sources(tmp_path: Path) -> None:
    profile = load_engine_profile("sglang")
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(profile, header="test"))
    assert load_engine_profile("sglang", path) == profile


def test_mla_prefill_level_missing_from_the_calibration_is_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        efficiency_model_for(H100, tier="cross-generation", backend="sglang", table_backends={"mla_context": "tensorrt"})
    assert err.value.key == "kernel_sources.mla_prefill" and "mla_prefill model has backend levels" in err.value.rule
