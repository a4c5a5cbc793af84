"""A simulated MoE layer's routing as a router meets it (`sim.graph.moe_routing.served`), against the
collector's synthetic routing that the measured rows keep."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import scenario_dict

from sim.api import predict_step
from sim.dtypes import DType
from sim.graph import moe_routing
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelKind
from sim.graph.moe import moe_work
from sim.graph.moe_routing import SERVED, moe_rank0_load, served
from sim.perf.table_kernels import moe_batch, work_columns
from sim.specs.catalog import load_hardware
from sim.specs.scenario import scenario_from_dict


@pytest.mark.parametrize("distribution,expected", [
    ("power_law_1.01", "served:power_law_1.01"), ("power_law_1.2", "served:power_law_1.2"),
    ("balanced", "balanced"), ("power_law_0", "balanced"), ("power_law_0.0", "balanced"),
    ("power_law_1.01_eplb", "balanced"), ("uniform", "balanced"),
])
def test_only_skewed_routings_are_served(distribution: str, expected: str) -> None:
    assert served(distribution) == expected


@pytest.mark.parametrize("tokens,experts,topk,ep", [
    (64, 512, 10, 8), (33, 256, 8, 8), (17, 128, 8, 4), (4096, 256, 8, 8), (100, 64, 4, 1),
])
def test_where_the_collector_spreads_the_tokens_its_load_stands(tokens: int, experts: int, topk: int,
                                                                ep: int) -> None:
    assert tokens * topk > experts
    for distribution in ("power_law_1.01", "power_law_1.2"):
        assert moe_rank0_load(tokens, experts, topk, ep, served(distribution)) \
            == moe_rank0_load(tokens, experts, topk, ep, distribution)


def test_a_few_tokens_are_routed_one_by_one_not_all_to_rank0() -> None:
    # The collector's draw rounds every one of 512 experts' shares to zero and its repair hands the
    # 40 pairs of 4 tokens x top-10 to experts 0..39, all on rank 0 of 8.
    assert moe_rank0_load(4, 512, 10, 8, "power_law_1.01") == (40.0, 40.0, 1.0)
    pairs, active, heaviest = moe_rank0_load(4, 512, 10, 8, served("power_law_1.01"))
    assert 40 / 8 < pairs < 40 / 2  # the busiest of 8 ranks: above the even share, far below all
    assert 1 <= heaviest <= 4 and active <= pairs
    # DeepSeek-R1's 2 decode tokens, top-8 of 256 experts over 8 ranks: 16 pairs on rank 0 before.
    assert moe_rank0_load(2, 256, 8, 8, "power_law_1.01")[0] == 16
    assert moe_rank0_load(2, 256, 8, 8, served("power_law_1.01"))[0] < 8


@pytest.mark.parametrize("experts,topk,ep", [(512, 10, 8), (256, 8, 8), (128, 8, 4), (256, 8, 16)])
def test_served_loads_grow_with_the_tokens_and_meet_the_collectors(experts: int, topk: int, ep: int) -> None:
    last = experts // topk  # the last count whose collector draw is on its few-token interval
    pairs = np.array([moe_rank0_load(t, experts, topk, ep, served("power_law_1.01"))[0] for t in range(1, last + 1)])
    assert (np.diff(pairs) > -1.0).all()  # each count's own draws: no step back beyond one pair
    assert pairs[0] < topk  # one token's top-k spread over the ranks, not all on one
    # From the next count on the collector's load stands, with no jump between them.
    collector = moe_rank0_load(last + 1, experts, topk, ep, "power_law_1.01")[0]
    assert moe_rank0_load(last + 1, experts, topk, ep, served("power_law_1.01"))[0] == collector
    assert abs(collector - pairs[-1]) < 0.2 * collector


def test_one_rank_keeps_the_collectors_load() -> None:
    for tokens in (1, 3, 8, 16):
        assert moe_rank0_load(tokens, 128, 8, 1, served("power_law_1.01")) \
            == moe_rank0_load(tokens, 128, 8, 1, "power_law_1.01")


def test_served_loads_are_seeded_by_the_shape() -> None:
    key = (5, 512, 10, 8, SERVED + "power_law_1.01")
    first = moe_rank0_load(*key)
    moe_routing._LOADS.clear()
    assert moe_rank0_load(*key) == first
    assert moe_routing.moe_rank0_loads([key, (*key[:4], "power_law_1.01")])[0] == first


def _qwen35_ep8() -> dict[str, Any]:
    return scenario_dict(hardware={"name": "h200_sxm"}, model={"name": "Qwen/Qwen3.5-397B-A17B"},
                         engine={"backend": "sglang", "quantization": "fp8_block", "tensor_parallel_size": 8,
                                 "moe_tensor_parallel_size": 1, "moe_expert_parallel_size": 8,
                                 "max_model_len": 4096})


def test_simulated_moe_layer_costs_more_with_more_decodes() -> None:
    """Qwen3.5-397B (top-10 of 512 experts) over 8 EP ranks: with the collector's draw one decode of
    4 tokens put all 40 pairs on one rank and cost more than a decode of 8 (16.3 vs 12.5 ms a step)."""
    sc = scenario_from_dict(_qwen35_ep8(), source="test")
    moe_s = []
    for n in (1, 2, 4, 8, 16, 32):
        timing = predict_step(sc, BatchShape(decode_context_tokens=(1000,) * n))
        moe_s.append(timing.seconds_by_kind()[KernelKind.MOE])
    assert moe_s == sorted(moe_s)


def test_measured_rows_keep_the_collectors_routing() -> None:
    sc = scenario_from_dict(_qwen35_ep8(), source="test")
    timing = predict_step(sc, BatchShape(decode_context_tokens=(1000,) * 4))
    work = next(k.estimate.work for k in timing.kernels if k.estimate.work.kind is KernelKind.MOE)
    simulated = work_columns([work])
    assert simulated["distribution"].tolist() == ["served:power_law_1.01"]
    measured = {**simulated, "distribution": np.array(["power_law_1.01"], dtype=object)}
    hw = load_hardware("h200_sxm")
    idx = np.arange(1)
    # A measured row's roofline is rank 0's work under the collector's draw: 40 pairs, not the served few.
    assert moe_batch(measured, idx, hw).roofline_s[0] > 2 * moe_batch(simulated, idx, hw).roofline_s[0]


@pytest.mark.parametrize("routing", ["power_law_0", "power_law_0.0", "power_law_1.01", "power_law_1.2",
                                     "power_law_1.01_eplb", "balanced"])
def test_graph_and_table_row_price_the_same_load(routing: str) -> None:
    """The graph's roofline work and its table row's (the fitted family's features) come from one load:
    a power law of exponent 0 is the balanced round robin in both (the tables read it so)."""
    hw = load_hardware("h200_sxm")
    for tokens in (1, 4, 8, 64, 4096):
        work = moe_work(num_tokens=tokens, hidden=4096, inter_size=1024, topk=10, num_experts=512, moe_tp=1,
                        moe_ep=8, routing=routing, weight_dtype=DType.FP8_BLOCK, act=DType.BFLOAT16)
        row = moe_batch(work_columns([work]), np.arange(1), hw)
        assert row.flops[0] == pytest.approx(work.flops, rel=1e-12)
        if routing in ("power_law_0", "power_law_0.0"):
            balanced = moe_work(num_tokens=tokens, hidden=4096, inter_size=1024, topk=10, num_experts=512,
                                moe_tp=1, moe_ep=8, routing="balanced", weight_dtype=DType.FP8_BLOCK,
                                act=DType.BFLOAT16)
            assert work.flops == balanced.flops
