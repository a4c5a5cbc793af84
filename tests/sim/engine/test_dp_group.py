"""Attention-data-parallel MoE engines step in lockstep: a group step lasts as long as its slowest rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import load_host_params, scenario_efficiency, sglang_round_robin_ranks, simulate
from sim.engine.pricer import GroupKey, StepKey, StepPricer
from sim.engine.simulation import request_states
from sim.perf.step import StepCostModel
from sim.serving.dp_group import DataParallelGroup
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict
from sim.workload.requests import RequestSpec, Segment

_MOE_DP2 = {"data_parallel_size": 2, "enable_expert_parallel": True}


def _scenario(tmp_path: Path | None = None, rows: str = "", **engine: Any) -> Scenario:
    workload: dict[str, Any] = {}
    if rows:
        assert tmp_path is not None
        path = tmp_path / "trace.csv"
        path.write_text("input_tokens,output_tokens,arrival_s,prefix_group,prefix_tokens\n" + rows)
        workload = {"dataset_name": "trace", "dataset_path": str(path), "num_prompts": rows.count("\n")}
    d = scenario_dict(model={"name": "Qwen/Qwen3-30B-A3B"}, engine={**_MOE_DP2, **engine}, workload=workload)
    return scenario_from_dict(d, source="t")


def _pricer(sc: Scenario) -> StepPricer:
    return StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))


def test_group_step_is_the_slowest_rank_with_every_rank_padded_to_the_most_tokens() -> None:
    sc = _scenario()
    prefill: StepKey = (((6000, 0, True),), 0, 0)
    small: StepKey = ((), 1, 64)
    big: StepKey = ((), 300, 64)
    # The prefill rank has the most tokens, so it runs exactly its own step: the group takes its time.
    # Block- and count-by-count-priced parts agree to rounding (~1e-15; docs/benchmarks.md).
    assert _pricer(sc).step_s(GroupKey(tuple(sorted((prefill, small))))) == pytest.approx(_pricer(sc).step_s(prefill), rel=1e-12)
    assert _pricer(sc).step_s(prefill) > 10 * _pricer(sc).step_s(small)
    # Two decode ranks: the one with 300 requests is the slowest (the other runs 300 padded tokens
    # but attends and samples for one).
    pricer = _pricer(sc)
    assert pricer.step_s(GroupKey((small, big))) == pytest.approx(_pricer(sc).step_s(big), rel=1e-12)
    # The small rank padded to 300 tokens costs more than alone, less than the big rank.
    padded = pricer._rank_step(small, -300)[0]  # decode-only group: low-latency all-to-all
    assert _pricer(sc).step_s(small) < padded < _pricer(sc).step_s(big)


def test_a_long_prefill_on_one_rank_stalls_the_decodes_of_the_other(tmp_path: Path) -> None:
    # Request 0 decodes on rank 0; request 1 (a 6000-token prompt) arrives while rank 0 is busy and
    # goes to rank 1, the one with the lower 4 x waiting + running.
    sc = _scenario(tmp_path, "64,40,0,-1,0\n6000,2,0.05,-1,0\n")
    result = simulate(sc, max_step_events=100)
    r0, r1 = sorted(result.records, key=lambda r: r.request_id)
    assert (r0.replica, r1.replica) == (0, 1)
    (stall,) = [s for s in result.steps if s.num_prefill_tokens == 6000]
    assert stall.num_decodes == 1  # request 0 decodes in the same group step
    assert stall.step_s == pytest.approx(_pricer(sc).step_s((((6000, 0, True),), 0, 0)), rel=1e-12)
    decode_s = _pricer(sc).step_s(((), 1, 64))
    assert stall.step_s > 10 * decode_s
    # Request 0's decoding spans the prefill step: one of its token gaps is the whole stall.
    assert r0.first_token_s <= stall.start_s and stall.end_s <= r0.finish_s
    # Inter-token gaps (39 of request 0, 1 of request 1) add up to the requests' decode spans.
    s = result.summary
    assert s.itl_mean_s * 40 == pytest.approx((r0.finish_s - r0.first_token_s) + (r1.finish_s - r1.first_token_s))
    assert (r0.finish_s - r0.first_token_s) > stall.step_s + 38 * decode_s * 0.99


def _ranks(sc: Scenario, n: int) -> list[VllmV1Scheduler]:
    e = sc.engine
    assert e.max_num_seqs is not None and e.max_num_batched_tokens is not None
    return [VllmV1Scheduler(kv=KVCacheManager(num_blocks=4000, block_size=e.block_size, enable_prefix_caching=False),
                            max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
                            enable_chunked_prefill=True, long_prefill_token_threshold=0) for _ in range(n)]


def _requests(n: int) -> list[RequestState]:
    specs = [RequestSpec(request_id=i, arrival_s=0.0, prompt_tokens=500, output_tokens=20,
                         segments=(Segment(content_id=1000 + i, num_tokens=500),)) for i in range(n)]
    kv = KVCacheManager(num_blocks=1, block_size=16, enable_prefix_caching=False)
    return request_states(specs, kv)


def test_identical_rank_loads_step_and_price_as_independent_replicas() -> None:
    """Two ranks with the same requests: every group step is each replica's step, at its price."""
    sc = _scenario()
    group = DataParallelGroup(_ranks(sc, 2))
    alone = _ranks(sc, 2)
    for req in _requests(2):
        group.add(req)
    for i, req in enumerate(_requests(2)):
        alone[i].add(req)
    pricer, reference = _pricer(sc), _pricer(sc)
    finished: list[int] = []
    while True:
        plan = group.schedule()
        plans = [s.schedule() for s in alone]
        if plan is None:
            assert plans == [None, None]
            break
        p0, p1 = plans
        assert p0 is not None and p1 is not None
        assert [pricer.key(p) for p in plan.ranks if p is not None] == [reference.key(p) for p in plans if p]
        step_s = pricer.price(plan)
        assert step_s == reference.price(p0) == reference.price(p1)
        done = group.finish_step(plan)
        assert [r.request_id for r in done] == [r.request_id for s, p in zip(alone, plans, strict=True)
                                                 if p for r in s.finish_step(p)]
        finished += [r.request_id for r in done]
    assert sorted(finished) == [0, 1]



def test_sglang_sends_requests_to_its_dp_ranks_round_robin() -> None:
    """SGLang's `DataParallelController` (`--load-balance-method auto`: round robin, but in a disaggregated
    prefill server) sends requests to the attention-DP ranks in turn, whatever their loads; vLLM's
    balancer sends each to the least `4 x waiting + running`."""
    sc = _scenario()
    by_load, in_turn = DataParallelGroup(_ranks(sc, 2)), DataParallelGroup(_ranks(sc, 2), round_robin=True)
    for group in (by_load, in_turn):
        reqs = _requests(4)
        group.ranks[0].add(reqs[0])  # rank 0 already holds a request
        for req in reqs[1:]:
            group.add(req)
    assert [r.num_outstanding() for r in by_load.ranks] == [2, 2]  # the load balancer fills rank 1 first
    assert [r.num_outstanding() for r in in_turn.ranks] == [3, 1]  # in turn: 0, 1, 0
    # A KV-aware router's pick of a rank takes no turn.
    in_turn.add(_requests(6)[5], rank=1)
    in_turn.add(_requests(7)[6])
    assert [r.num_outstanding() for r in in_turn.ranks] == [3, 3]


@pytest.mark.parametrize(("backend", "round_robin"), [("sglang", True), ("vllm", False), ("trtllm", False)])
def test_only_sglang_groups_take_requests_in_turn(backend: str, round_robin: bool) -> None:
    sc = _scenario(backend=backend)
    assert sglang_round_robin_ranks(sc) is round_robin
    assert sglang_round_robin_ranks(sc, prefill_pool=True) is False  # follow_bootstrap_room: not modelled
