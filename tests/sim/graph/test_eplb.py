"""EPLB: redundant expert slots and load-balanced placement over the expert-parallel ranks."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import check_feasible, step_graph
from sim.errors import ConfigError
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.moe import rank0_load
from sim.specs.scenario import Scenario, scenario_from_dict

_DP8EP8 = {"data_parallel_size": 8, "enable_expert_parallel": True, "kv_cache_dtype": "fp8", "max_model_len": 4096}


def _scenario(**engine: Any) -> Scenario:
    d = scenario_dict(hardware={"name": "h200_sxm"}, model={"name": "deepseek-ai/DeepSeek-R1"},
                      engine={**_DP8EP8, **engine}, workload={"random_input_len": 512, "random_output_len": 16})
    return scenario_from_dict(d, source="t.toml")


def _moe_node(sc: Scenario) -> KernelWork:
    batch = BatchShape(prefills=(PrefillChunk(new_tokens=2048, context_tokens=0, samples=True),),
                       decode_context_tokens=())
    (work,) = {n.work for n in step_graph(sc, batch).nodes if n.work.kind is KernelKind.MOE}
    return work


def test_eplb_balances_rank_zero_and_redundant_slots_hold_more_weights() -> None:
    plain, eplb = _scenario(), _scenario(enable_eplb=True, num_redundant_experts=32)
    a, b = _moe_node(plain), _moe_node(eplb)
    assert (a.variant, b.variant) == ("power_law_1.01", "power_law_1.01_eplb")
    assert (a.shape[4], b.shape[4]) == (256, 288)  # 36 slots per rank
    # Balanced over 288 slots: rank 0 gets exactly 1/8 of the 2048 x 8 tokens x top-8 selections.
    assert rank0_load(num_tokens=2048 * 8, num_experts=288, topk=8, ep=8, routing="power_law_1.01_eplb") \
        == rank0_load(num_tokens=2048 * 8, num_experts=288, topk=8, ep=8, routing="balanced")
    assert b.flops == pytest.approx(2048 * 8 * 8 / 8 * 6 * 7168 * 2048)
    assert b.flops < a.flops  # the power-law skew put more than 1/8 of the work on rank 0
    # Four more experts per GPU: 4 x 3 x 7168 x 2048 FP8 bytes per MoE layer (58 layers).
    extra = check_feasible(eplb).weight_bytes - check_feasible(plain).weight_bytes
    assert extra == pytest.approx(58 * 4 * 3 * 7168 * 2048 * 1.0, rel=1e-3)


@pytest.mark.parametrize(("engine", "key"), [
    ({"num_redundant_experts": 32}, "engine.num_redundant_experts"),  # without enable_eplb
    ({"enable_eplb": True, "num_redundant_experts": 30}, "engine.num_redundant_experts"),  # 286 % 8
    ({"enable_eplb": True, "enable_expert_parallel": False}, "engine.enable_eplb"),  # no EP ranks
])
def test_check_rejects_eplb_layouts_vllm_rejects(engine: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        _scenario(**engine)
    assert err.value.key == key
