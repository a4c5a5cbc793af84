"""Shared experts beside the routed experts: which engine runs them there, and what they then cost."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import load_host_params, scenario_efficiency, simulate, step_graph
from sim.calibration.select import EfficiencyModels
from sim.engine.part_prices import PartPrices, pricing_identity
from sim.engine.pricer import StepPricer
from sim.engine.simulation import SimLimits
from sim.engine.step_parts import PartNodes
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.shared_experts import (
    BESIDE_ROUTED_EXPERTS,
    beside_token_limit,
    beside_variant,
    depends_on_decode_only,
    sglang_fuses_shared_expert,
    shared_expert_token_limit,
)
from sim.perf.efficiency import KernelColumns
from sim.perf.roofline import roofline
from sim.perf.step import StepCostModel
from sim.provenance import Provenance
from sim.specs.scenario import Scenario, scenario_from_dict

R1 = "deepseek-ai/DeepSeek-R1"
KIMI = "moonshotai/Kimi-K2.5"
QWEN35 = "Qwen/Qwen3.5-397B-A17B"
_MODELS = EfficiencyModels()
_SHARED = ("shared_expert_gate_up_proj", "shared_expert_silu_and_mul", "shared_expert_down_proj")


def scenario(backend: str, model: str = R1, **engine: Any) -> Scenario:
    d = scenario_dict(hardware={"name": "h200_sxm"}, model={"name": model},
                      engine={"max_model_len": 8192, "tensor_parallel_size": 8, "backend": backend, **engine})
    return scenario_from_dict(d, source="t.toml")


def limit(sc: Scenario, decode_only: bool) -> int | None:
    return shared_expert_token_limit(sc.model, sc.engine, sc.precision, sc.hardware, decode_only=decode_only)


def shared_variants(sc: Scenario, batch: BatchShape) -> set[str]:
    return {n.work.variant for n in step_graph(sc, batch).nodes if n.work.name in _SHARED}


DECODE = BatchShape(decode_context_tokens=(1000,) * 16)
MIXED = BatchShape(prefills=(PrefillChunk(new_tokens=200),), decode_context_tokens=(1000,) * 16)


def test_sglang_fuses_deepseeks_shared_expert_without_expert_parallelism() -> None:
    sc = scenario("sglang")
    assert sglang_fuses_shared_expert(sc.model, sc.engine, sc.precision)
    assert beside_token_limit(beside_variant(limit(sc, False) or 0)) == limit(sc, False) == limit(sc, True)
    # One more expert of the fused kernel in every step, prompt chunks included.
    assert shared_variants(sc, MIXED) == shared_variants(sc, DECODE) == {BESIDE_ROUTED_EXPERTS}
    assert not depends_on_decode_only(sc.model, sc.engine, sc.precision, sc.hardware)
    ep = scenario("sglang", moe_tensor_parallel_size=1, moe_expert_parallel_size=8)
    assert not sglang_fuses_shared_expert(ep.model, ep.engine, ep.precision)
    # Expert parallelism without attention DP: no fusion, the dual stream in captured decode steps.
    assert limit(ep, True) == min(ep.engine.max_cudagraph_capture_size or 0, 1024) and limit(ep, False) is None
    deepep = scenario("sglang", tensor_parallel_size=1, data_parallel_size=8, moe_tensor_parallel_size=1,
                      moe_expert_parallel_size=8)
    assert limit(deepep, True) is None and limit(deepep, False) is None  # DeepEP: in line


def test_sglang_runs_kimis_shared_expert_on_a_second_stream_in_captured_decode_steps() -> None:
    sc = scenario("sglang", KIMI, max_cudagraph_capture_size=2048)  # 384 routed experts: not fused
    assert not sglang_fuses_shared_expert(sc.model, sc.engine, sc.precision)
    assert limit(sc, True) == 1024  # DUAL_STREAM_TOKEN_THRESHOLD below the capture size
    assert limit(sc, False) is None
    assert shared_variants(sc, DECODE) == {f"{BESIDE_ROUTED_EXPERTS}<=1024"}
    assert shared_variants(sc, MIXED) == {""}
    assert limit(scenario("sglang", KIMI, max_cudagraph_capture_size=64), True) == 64
    assert limit(scenario("sglang", KIMI, enforce_eager=True), True) is None


def test_trtllm_overlaps_only_inside_cuda_graphs_and_vllm_up_to_256_tokens() -> None:
    trt = scenario("trtllm", max_cudagraph_capture_size=128)
    assert limit(trt, True) == 128 and limit(trt, False) is None
    assert depends_on_decode_only(trt.model, trt.engine, trt.precision, trt.hardware)
    assert limit(scenario("trtllm", launch_mode="megakernel"), True) is not None
    vllm = scenario("vllm")
    assert limit(vllm, True) == limit(vllm, False) == 256
    assert not depends_on_decode_only(vllm.model, vllm.engine, vllm.precision, vllm.hardware)
    # vLLM's SharedFusedMoE is every model's; SGLang's and TensorRT-LLM's rules are their DeepSeek code's.
    assert limit(scenario("vllm", QWEN35), False) == 256
    assert limit(scenario("sglang", QWEN35), True) is None
    assert limit(scenario("trtllm", "meta-llama/Llama-3.1-8B", tensor_parallel_size=1), True) is None


def test_a_kernel_beside_the_routed_experts_costs_its_roofline_time_within_its_limit() -> None:
    sc = scenario("vllm")
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc, models=_MODELS))
    nodes = {n.work.name: n.work for n in step_graph(sc, DECODE).nodes}
    up = nodes["shared_expert_gate_up_proj"]
    assert up.variant == f"{BESIDE_ROUTED_EXPERTS}<=256"
    est = cost.estimate(up)
    plain = cost.estimate(replace(up, variant=""))
    # The roofline is how much of a priced kernel stays exposed: the kernel model's provenance stays.
    assert est.time_s == roofline(up, sc.hardware).time_s() and est.provenance == plain.provenance
    assert est.provenance is not Provenance.ROOFLINE
    assert plain.time_s > 5 * est.time_s  # a 16-token GEMM alone is latency-bound
    # Past the limit the kernel runs in line: priced as the same kernel without the variant.
    big = replace(up, variant=f"{BESIDE_ROUTED_EXPERTS}<=8")
    assert cost.estimate(big).time_s == plain.time_s
    assert cost.estimate(big).provenance == plain.provenance


def test_column_prices_of_beside_kernels_follow_their_limit_row_by_row() -> None:
    sc = scenario("trtllm")
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc, models=_MODELS))
    assert cost.prices_columns()
    first = next(n.work for n in step_graph(sc, DECODE).nodes if n.work.name == "shared_expert_gate_up_proj")
    sizes = (1, 7, 64, 300, 513, 4096)
    works = [replace(first, shape=(m, *first.shape[1:]), flops=first.flops / 16 * m,
                     activation_bytes=first.activation_bytes / 16 * m, variant=v)
             for m in sizes for v in ("", beside_variant(512), beside_variant(1 << 62))]
    times, provs = cost.estimate_columns(KernelColumns.of(works))
    for i, m in enumerate(sizes):
        plain, limited, unlimited = (3 * i + j for j in range(3))
        bound = roofline(works[unlimited], sc.hardware).time_s()
        assert times[unlimited] == bound and provs[unlimited] == provs[plain]
        if m <= 512:
            assert times[limited] == bound
        else:  # in line: the plain kernel's column price, bit for bit
            assert times[limited] == times[plain]
        assert provs[limited] == provs[plain]
        assert cost.estimate(works[limited]).time_s == pytest.approx(float(times[limited]), rel=1e-12)


def test_decode_only_token_parts_are_the_decode_steps_kernels() -> None:
    """The pricer builds a decode-only step's token part from a batch of prompt tokens: it must hold
    exactly the kernels of the real decode step (less attention and sampling)."""
    sc = scenario("trtllm", max_cudagraph_capture_size=32)
    parts = PartNodes(sc)
    for n in (1, 16, 32, 33, 100):
        token = parts.token(n, decode_only=True)
        graph = step_graph(sc, BatchShape(decode_context_tokens=(500,) * n))
        sampled_or_attention = {"lm_head", "logits_all_gather", "sampler", "mla_decode", "mla_gen_pre",
                                "mla_gen_post"}
        assert token == [(w.work, w.repeat) for w in graph.nodes if w.work.name not in sampled_or_attention]
        beside = {w.variant for w, _ in token if w.name in _SHARED}
        assert beside == {beside_variant(32)}
        assert (cost_limit := beside_token_limit(beside.pop())) is not None and (n <= cost_limit) == (n <= 32)
    # One structure over every count: the family keeps its polynomial template.
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc, models=_MODELS))
    pricer = parts.block_pricer(("token", "decode_only"), cost, load_host_params("trtllm").eager_launch_s, 256)
    assert pricer.has_template()


def test_the_capture_size_reaches_the_pricing_identity_only_where_it_moves_the_shared_expert() -> None:
    eff = scenario_efficiency(scenario("trtllm"), models=_MODELS)
    ids = {backend: {pricing_identity(scenario(backend, max_cudagraph_capture_size=c), eff, 5e-6, True)
                     for c in (16, 64)} for backend in ("trtllm", "vllm", "sglang")}
    assert len(ids["trtllm"]) == 2
    assert len(ids["vllm"]) == 1 and len(ids["sglang"]) == 1  # vLLM: a token limit; SGLang: fused


@pytest.mark.parametrize("backend", ["trtllm", "sglang", "vllm"])
def test_runs_price_decode_steps_shared_expert_beside_the_routed_experts(backend: str) -> None:
    model = KIMI if backend == "sglang" else R1  # SGLang fuses DeepSeek-R1's (every step alike)
    sc = scenario_from_dict(scenario_dict(
        hardware={"name": "h200_sxm"}, model={"name": model},
        engine={"max_model_len": 4096, "tensor_parallel_size": 8, "backend": backend, "max_num_seqs": 24},
        workload={"num_prompts": 40, "random_input_len": 300, "random_output_len": 40, "request_rate": 20.0}),
        source="t.toml")
    eff = scenario_efficiency(sc, models=_MODELS)
    prices = PartPrices(sc, StepCostModel(sc.hardware, eff), load_host_params(backend).eager_launch_s)
    decode = prices.alone_part(("token", "decode_only"), 16, prices.nodes.decode_only_token)
    mixed = prices.alone_part(("token",), 16, prices.nodes.token)
    # vLLM's limit is a token count (any step); the others' hold in captured decode steps only.
    assert (decode.gpu_s < mixed.gpu_s) is (backend != "vllm")
    bulk = simulate(sc, efficiency=eff)
    reference = simulate(sc, efficiency=eff, limits=SimLimits(bulk_decode=False))
    assert bulk.summary == reference.summary
    assert bulk.breakdown.seconds_by_name["shared_expert_gate_up_proj"] > 0.0


def test_models_without_shared_experts_have_no_kernel_beside_the_routed_experts() -> None:
    sc = scenario("sglang", "Qwen/Qwen3-235B-A22B")
    assert limit(sc, True) is None
    assert all(not n.work.variant.startswith(BESIDE_ROUTED_EXPERTS) for n in step_graph(sc, DECODE).nodes)


def test_no_stream_overlap_off_nvidia_or_under_vllms_expert_parallel_load_balancer() -> None:
    intel = scenario_from_dict(scenario_dict(
        hardware={"name": "b60"}, model={"name": "Qwen/Qwen3-30B-A3B"}, engine={"max_model_len": 4096}),
        source="t.toml")
    assert intel.hardware.vendor != "nvidia"
    assert shared_expert_token_limit(intel.model, intel.engine, intel.precision, intel.hardware,
                                     decode_only=True) is None
    eplb = scenario("vllm", tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True,
                    enable_eplb=True)
    assert limit(eplb, True) is None and limit(eplb, False) is None
    assert limit(replace(eplb, engine=replace(eplb.engine, enable_eplb=False)), True) == 256
    # Without attention DP no token moves, so EPLB does not take vLLM's all-to-all path.
    assert limit(scenario("vllm", enable_expert_parallel=True, enable_eplb=True), True) == 256


def test_the_mtp_drafter_in_a_decode_step_runs_its_shared_expert_as_the_target_does() -> None:
    sc = scenario_from_dict(scenario_dict(
        hardware={"name": "h200_sxm"}, model={"name": R1},
        engine={"max_model_len": 4096, "tensor_parallel_size": 8, "backend": "trtllm", "max_num_seqs": 16,
                "speculative_config": {"method": "mtp", "num_speculative_tokens": 2}},
        workload={"num_prompts": 24, "random_input_len": 300, "random_output_len": 30, "request_rate": 20.0}),
        source="t.toml")
    nodes = PartNodes(sc)
    assert nodes.draft is not None
    for part in (nodes.draft.decode_only_token(12), nodes.draft.decode_only_pass_token(4)):
        assert {w.variant for w, _ in part if w.name.endswith(_SHARED)} == {beside_variant(32)}
    assert {w.variant for w, _ in nodes.draft.token(12) if w.name.endswith(_SHARED)} == {""}
    eff = scenario_efficiency(sc, models=_MODELS)
    # A decode-only step prices the drafter's token kernels as a decode-only step's.
    pricer = StepPricer(sc, StepCostModel(sc.hardware, eff), load_host_params("trtllm"))
    _, parts, _ = pricer._rank_step(((), 4, 512), None)
    drafted = [sec for part in parts for label, sec in zip(part.labels, part.seconds, strict=True)
               if label[1] == "draft:shared_expert_gate_up_proj"]
    cost = StepCostModel(sc.hardware, eff)
    # The first pass over the 4 x 3 verified tokens, then one pass of 4 tokens (k = 2).
    beside = [next(w for w, _ in nodes.draft.decode_only_pass_token(n) if w.name.endswith("shared_expert_gate_up_proj"))
              for n in (12, 4)]
    assert drafted == [cost.estimate(w).time_s for w in beside]
    assert all(cost.estimate(w).time_s < cost.estimate(replace(w, variant="")).time_s / 5 for w in beside)
    bulk = simulate(sc, efficiency=eff)
    assert bulk.summary == simulate(sc, efficiency=eff, limits=SimLimits(bulk_decode=False)).summary
