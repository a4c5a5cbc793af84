"""Bulk decode stepping gives exactly the results of the request-by-request reference path."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest
from conftest import scenario_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import (
    SimResult,
    client_latency_s,
    load_engine_profile,
    load_host_params,
    resolved_async_scheduling,
    scenario_efficiency,
    simulate,
)
from sim.engine.pricer import StepKey, StepPricer
from sim.engine.simulation import SimLimits, Simulation, request_states
from sim.errors import ConfigError
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.transformer import build_step_graph
from sim.perf.host import host_cost, step_time_s
from sim.perf.step import StepCostModel
from sim.serving.kv_cache import BlockCountingKVCache, KVCacheManager, kv_cache_for
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict
from sim.workload.generate import generate
from sim.workload.requests import UNIQUE_CONTENT_BASE, RequestSpec, Segment, prefix_content_id

# -- scheduler in lockstep ---------------------------------------------------------------------


def _specs(lengths: list[tuple[int, int, int]], prefix_tokens: int) -> list[RequestSpec]:
    specs = []
    for rid, (prompt, output, group) in enumerate(lengths):
        segments: tuple[Segment, ...]
        if group >= 0 and prompt > prefix_tokens:
            segments = (Segment(content_id=prefix_content_id(group), num_tokens=prefix_tokens),
                        Segment(content_id=UNIQUE_CONTENT_BASE + rid, num_tokens=prompt - prefix_tokens))
        else:
            group = -1
            segments = (Segment(content_id=UNIQUE_CONTENT_BASE + rid, num_tokens=prompt),)
        specs.append(RequestSpec(request_id=rid, arrival_s=0.0, prompt_tokens=prompt, output_tokens=output,
                                 segments=segments, prefix_group=group))
    return specs


def _summary(plan: StepPlan) -> tuple[object, ...]:
    """What a plan computes, with decodes summarised as the pricer sees them."""
    prefills = sorted((c.num_new_tokens, c.num_context_tokens, c.samples) for c in plan.chunks if not c.is_decode())
    decodes = [c.num_context_tokens for c in plan.chunks if c.is_decode()]
    return (plan.step_id, tuple(prefills), len(decodes) + plan.num_bulk_decodes,
            sum(decodes) + plan.bulk_decode_context_tokens, plan.num_prefix_hit_tokens,
            tuple(r.request_id for r in plan.preempted))


_SCHEDULES = {
    "arrivals": st.lists(st.integers(0, 40), min_size=12, max_size=12),
    "block_size": st.sampled_from([2, 4]),
    "spare_blocks": st.integers(0, 30),
    "budget": st.integers(4, 32),
    "max_num_seqs": st.integers(1, 6),
    "chunked": st.booleans(),
    "threshold": st.sampled_from([0, 3, 8]),
    "reserve_full_output": st.booleans(),
    "prefill_priority": st.booleans(),
    "chunk_unit": st.sampled_from([1, 1, 4]),
    "rnd": st.randoms(use_true_random=False),
}
"""Scheduler settings and arrivals the lockstep property tests draw."""


def _feasible(lengths: list[tuple[int, int, int]], block_size: int, spare_blocks: int, budget: int,
              max_num_seqs: int, chunked: bool) -> tuple[int, int]:
    """(blocks, token budget) feasible as scenarios require: the longest request fits the cache
    (and, unchunked, the budget)."""
    longest = max(p + o for p, o, _ in lengths)
    num_blocks = -(-longest // block_size) + spare_blocks
    return num_blocks, (max(budget, max_num_seqs) if chunked else max(budget, max_num_seqs, longest))


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12), st.integers(-1, 1)), min_size=1, max_size=12),
    **_SCHEDULES,
    caching=st.booleans(),
)
def test_bulk_scheduler_matches_the_reference_step_by_step(
    lengths: list[tuple[int, int, int]], arrivals: list[int], block_size: int, spare_blocks: int, budget: int,
    max_num_seqs: int, chunked: bool, threshold: int, caching: bool, reserve_full_output: bool,
    prefill_priority: bool, chunk_unit: int, rnd: random.Random,
) -> None:
    num_blocks, budget = _feasible(lengths, block_size, spare_blocks, budget, max_num_seqs, chunked)
    specs = _specs(lengths, prefix_tokens=9)
    scheds, states = [], []
    for bulk_decodes in (True, False):
        kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=caching)
        scheds.append(VllmV1Scheduler(kv=kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                                      enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                                      bulk_decodes=bulk_decodes, reserve_full_output=reserve_full_output,
                                      prefill_priority=prefill_priority, context_chunk_unit=chunk_unit))
        states.append({s.request_id: s for s in request_states(specs, kv)})
    bulk, ref = scheds
    finished: list[list[int]] = [[], []]
    computed = 0
    for step in range(10_000):
        for rid, at in enumerate(arrivals[:len(specs)]):
            if at == step:
                bulk.add(states[0][rid])
                ref.add(states[1][rid])
        shape = bulk.next_bulk_decode_steps()
        if shape is not None and rnd.random() < 0.7:
            num_decode, context, until_finish = shape
            steps, done, free_after = bulk.run_bulk_decode_steps(rnd.randint(1, until_finish + 1))
            assert 1 <= steps <= until_finish
            for j in range(steps):
                plan_ref = ref.schedule()
                assert plan_ref is not None
                computed += plan_ref.num_batched_tokens()
                _, prefills, n, ctx, _, preempted = _summary(plan_ref)
                assert (prefills, preempted, n, ctx) == ((), (), num_decode, context + j * num_decode)
                done_ref = [r.request_id for r in ref.finish_step(plan_ref)]
                assert done_ref == ([r.request_id for r in done] if j == steps - 1 else [])
                assert ref.kv.num_free_blocks() == free_after[j]
            finished[0] += [r.request_id for r in done]
            finished[1] += [r.request_id for r in done]
        else:
            plan = bulk.schedule()
            plan_ref = ref.schedule()
            computed += 0 if plan_ref is None else plan_ref.num_batched_tokens()
            assert (plan is None) == (plan_ref is None)
            if plan is None or plan_ref is None:
                if step > max(arrivals):
                    break
                continue
            assert _summary(plan) == _summary(plan_ref)
            finished[0] += [r.request_id for r in bulk.finish_step(plan)]
            finished[1] += [r.request_id for r in ref.finish_step(plan_ref)]
        assert finished[0] == finished[1]
        for rid in states[1]:
            assert bulk.kv.blocks_of(rid) == ref.kv.blocks_of(rid)
        assert bulk.kv.free_block_ids() == ref.kv.free_block_ids()
    assert sorted(finished[0]) == list(range(len(specs)))
    fields = ("num_output", "num_computed", "num_preemptions", "recomputed_tokens", "prefix_hit_tokens")
    for rid, req in states[0].items():
        assert [getattr(req, f) for f in fields] == [getattr(states[1][rid], f) for f in fields]
    # Tokens computed = prompts - prefix hits + outputs (the last is sampled, not computed) + recomputed.
    reqs = states[1].values()
    assert computed == sum(r.prompt_tokens - r.prefix_hit_tokens + r.output_tokens - 1 + r.recomputed_tokens
                           for r in reqs)



@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 12), st.just(-1)), min_size=1, max_size=12),
    **_SCHEDULES,
)
def test_block_counts_schedule_as_block_tables_without_prefix_caching(
    lengths: list[tuple[int, int, int]], arrivals: list[int], block_size: int, spare_blocks: int, budget: int,
    max_num_seqs: int, chunked: bool, threshold: int, reserve_full_output: bool, prefill_priority: bool,
    chunk_unit: int, rnd: random.Random,
) -> None:
    """`BlockCountingKVCache` (what a run without prefix caching uses) gives the schedule of the
    block-table `KVCacheManager`: the same plans, preemptions, finishes and free counts, and each
    request holds as many blocks, whether decodes run in bulk or step by step."""
    num_blocks, budget = _feasible(lengths, block_size, spare_blocks, budget, max_num_seqs, chunked)
    specs = _specs(lengths, prefix_tokens=9)
    bulk_decodes = rnd.random() < 0.5
    kvs: list[KVCacheManager] = [
        kv_cache_for(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False),
        KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False),
    ]
    assert isinstance(kvs[0], BlockCountingKVCache)
    scheds = [VllmV1Scheduler(kv=kv, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                              enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                              bulk_decodes=bulk_decodes, reserve_full_output=reserve_full_output,
                              prefill_priority=prefill_priority, context_chunk_unit=chunk_unit)
              for kv in kvs]
    states = [{s.request_id: s for s in request_states(specs, kv)} for kv in kvs]
    finished: list[list[int]] = [[], []]
    for step in range(10_000):
        for rid, at in enumerate(arrivals[:len(specs)]):
            if at == step:
                for sched, st_ in zip(scheds, states, strict=True):
                    sched.add(st_[rid])
        shapes = [s.next_bulk_decode_steps() for s in scheds]
        assert shapes[0] == shapes[1]
        if shapes[0] is not None and rnd.random() < 0.7:
            n = rnd.randint(1, shapes[0][2] + 1)
            runs = [s.run_bulk_decode_steps(n) for s in scheds]
            assert runs[0][0] == runs[1][0] and list(runs[0][2]) == list(runs[1][2])
            for i in (0, 1):
                finished[i] += [r.request_id for r in runs[i][1]]
        else:
            counted, tables = scheds[0].schedule(), scheds[1].schedule()
            assert (counted is None) == (tables is None)
            if counted is None or tables is None:
                if step > max(arrivals):
                    break
                continue
            assert _summary(counted) == _summary(tables)
            finished[0] += [r.request_id for r in scheds[0].finish_step(counted)]
            finished[1] += [r.request_id for r in scheds[1].finish_step(tables)]
        assert finished[0] == finished[1]
        assert kvs[0].num_free_blocks() == kvs[1].num_free_blocks()
        for rid in states[1]:
            assert kvs[0].num_blocks_held(rid) == kvs[1].num_blocks_held(rid)
    assert sorted(finished[0]) == list(range(len(specs)))


def test_block_counts_refuse_what_they_cannot_show() -> None:
    kv = BlockCountingKVCache(num_blocks=4, block_size=2)
    assert kv.allocate(1, num_tokens=5, keys=(), num_computed_tokens=0)
    assert kv.num_blocks_held(1) == 3 and kv.num_free_blocks() == 1
    assert not kv.allocate(2, num_tokens=3, keys=(), num_computed_tokens=0)  # fails without side effects
    assert kv.num_free_blocks() == 1 and kv.num_blocks_held(2) == 0
    kv.append_one_block([1])
    assert kv.num_free_blocks() == 0 and kv.usage_frac() == 1.0
    kv.free(1)
    assert kv.allocate(1, num_tokens=1, keys=(), num_computed_tokens=0)
    kv.append_blocks(1, 2)  # as append_one_block([1, 1])
    assert kv.num_blocks_held(1) == 3 and kv.num_free_blocks() == 1
    with pytest.raises(ValueError, match="prefix caching is off"):
        kv.allocate(3, num_tokens=4, keys=(), num_computed_tokens=2)
    with pytest.raises(TypeError, match="block ids are not tracked"):
        kv.blocks_of(1)
    kv.free(1)
    kv.free(1)  # a request that holds nothing is ignored
    assert kv.num_free_blocks() == 4


@pytest.mark.parametrize("bulk_decodes", [True, False])
def test_a_prompt_chunk_cut_by_the_budget_is_whole_chunk_units(bulk_decodes: bool) -> None:
    """TensorRT-LLM's rule (`context_chunk_unit`): a chunk the budget cuts is cut down to whole units,
    one cut to nothing waits; a prompt's last chunk is whatever is left."""
    kv = kv_cache_for(num_blocks=64, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=12, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, bulk_decodes=bulk_decodes, context_chunk_unit=4)
    a = RequestState(request_id=0, prompt_tokens=3, output_tokens=20, arrival_s=0.0, keys=())
    b = RequestState(request_id=1, prompt_tokens=30, output_tokens=2, arrival_s=0.0, keys=())
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [3, 8]  # 9 left for b: 8
    sched.finish_step(plan)
    sizes = []
    for _ in range(6):
        plan = sched.schedule()
        assert plan is not None
        sizes.append([c.num_new_tokens for c in plan.chunks if c.request is b])
        sched.finish_step(plan)
    # a decodes every step (1 token), b gets 11 -> 8, 8, then its last 6 whole, then decodes.
    assert sizes[:3] == [[8], [8], [6]]


def test_chunk_units_larger_than_the_budget_are_refused() -> None:
    sc = scenario_from_dict(scenario_dict(engine={"backend": "trtllm", "block_size": 32,
                                                  "max_num_batched_tokens": 16, "max_num_seqs": 4}),
                            source="s.toml")
    with pytest.raises(ConfigError, match="must be at least block_size"):
        simulate(sc)

def test_bulk_decodes_grow_one_block_each_in_running_order() -> None:
    """Two decoding requests cross block boundaries at different steps and take blocks in turn."""
    kv = KVCacheManager(num_blocks=20, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0)
    a = RequestState(request_id=0, prompt_tokens=4, output_tokens=9, arrival_s=0.0, keys=())
    b = RequestState(request_id=1, prompt_tokens=6, output_tokens=9, arrival_s=0.0, keys=())
    sched.add(a)
    sched.add(b)
    plan = sched.schedule()
    assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [4, 6]
    assert sched.finish_step(plan) == []
    assert kv.blocks_of(0) == (0,) and kv.blocks_of(1) == (1, 2)
    # Both decode from now on: contexts 4 and 6 tokens; both sample their last token 8 steps on.
    assert sched.next_bulk_decode_steps() == (2, 10, 8)
    steps, done, free_after = sched.run_bulk_decode_steps(1)
    assert (steps, done, [int(f) for f in free_after]) == (1, [], [16])  # a's context 4 fills block 0: it takes 3
    assert kv.blocks_of(0) == (0, 3) and kv.blocks_of(1) == (1, 2)
    assert sched.next_bulk_decode_steps() == (2, 12, 7)
    # Contexts (5, 7): nothing; (6, 8): b takes 4; (7, 9); (8, 10): a takes 5; (9, 11); (10, 12): b takes 6.
    steps, done, free_after = sched.run_bulk_decode_steps(6)
    assert (steps, done, [int(f) for f in free_after]) == (6, [], [16, 15, 15, 14, 14, 13])
    assert kv.blocks_of(0) == (0, 3, 5) and kv.blocks_of(1) == (1, 2, 4, 6)
    assert sched.next_bulk_decode_steps() == (2, 11 + 13, 1)  # both sample their last token in it
    plan = sched.schedule()
    assert plan is not None and plan.chunks == () and plan.num_bulk_decodes == 2
    assert plan.bulk_decode_context_tokens == 11 + 13
    assert plan.batch_shape().decode_context_tokens == (12, 12)
    assert sched.finish_step(plan) == [a, b]
    assert (a.num_output, a.num_computed, b.num_output, b.num_computed) == (9, 12, 9, 14)
    assert kv.num_free_blocks() == 20


def test_bulk_decodes_sit_out_prefill_only_steps_under_prefill_priority() -> None:
    """SGLang's prefill priority: a prefill-only step leaves the bulk decodes' counters alone, and
    the next decode step names the ones whose previous sample was before the previous step."""
    kv = KVCacheManager(num_blocks=20, block_size=4, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, prefill_priority=True)
    a = RequestState(request_id=0, prompt_tokens=4, output_tokens=5, arrival_s=0.0, keys=())
    b = RequestState(request_id=1, prompt_tokens=6, output_tokens=3, arrival_s=0.0, keys=())
    sched.add(a)
    plan = sched.schedule()  # step 1: a's prompt; a samples its first token and decodes in bulk
    assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [4]
    assert sched.finish_step(plan) == []
    plan = sched.schedule()  # step 2: a decodes (context 4)
    assert plan is not None and (plan.chunks, plan.num_bulk_decodes, plan.bulk_decode_context_tokens) == ((), 1, 4)
    assert plan.waited_bulk == ()
    assert sched.finish_step(plan) == []
    sched.add(b)
    plan = sched.schedule()  # step 3: prefill only; a sits it out
    assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [6] and plan.num_bulk_decodes == 0
    assert sched.finish_step(plan) == []
    assert sched.next_bulk_decode_steps() is None  # a last sampled in step 2, b in step 3
    assert sched.oldest_sample_step() == 2
    plan = sched.schedule()  # step 4: both decode (contexts 5 and 6); a's gap spans steps 3 and 4
    assert plan is not None and (plan.chunks, plan.num_bulk_decodes, plan.bulk_decode_context_tokens) == ((), 2, 11)
    assert plan.step_id == 4 and plan.waited_bulk == ((2, 1),)
    assert sched.finish_step(plan) == []
    assert sched.next_bulk_decode_steps() == (2, 13, 1)  # b samples its last token in the next step
    steps, done, _ = sched.run_bulk_decode_steps(1)
    assert (steps, done) == (1, [b]) and (b.num_output, b.num_computed, b.last_sample_step) == (3, 8, 5)
    plan = sched.schedule()  # step 6: a's last token
    assert plan is not None and plan.num_bulk_decodes == 1 and plan.waited_bulk == ()
    assert sched.finish_step(plan) == [a]
    assert (a.num_output, a.num_computed, a.last_sample_step) == (5, 8, 6)
    assert kv.num_free_blocks() == 20


# -- whole simulations ------------------------------------------------------------------------


def _pair(sc: Scenario) -> tuple[SimResult, SimResult]:
    return simulate(sc, limits=SimLimits(bulk_decode=True)), simulate(sc, limits=SimLimits(bulk_decode=False))


def _assert_same(a: SimResult, b: SimResult) -> None:
    assert a.records == b.records
    assert a.summary == b.summary
    assert a.kv_usage == b.kv_usage
    for x, y in ((a.breakdown.seconds_by_name, b.breakdown.seconds_by_name),
                 (a.breakdown.seconds_by_kind, b.breakdown.seconds_by_kind)):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-12)


SCENARIOS: dict[str, dict[str, dict[str, Any]]] = {
    "poisson": {"workload": {"num_prompts": 150, "request_rate": 20.0, "random_input_len": 300,
                             "random_output_len": 60, "random_range_ratio": 0.8}},
    "burst-with-threshold": {"engine": {"long_prefill_token_threshold": 100, "max_num_batched_tokens": 256,
                                        "max_num_seqs": 16},
                             "workload": {"num_prompts": 80, "random_input_len": 600, "random_output_len": 40,
                                          "random_range_ratio": 0.5}},
    "preemption-prefix-cache": {"engine": {"gpu_memory_utilization": 0.25},
                                "workload": {"num_prompts": 120, "random_input_len": 1000,
                                             "random_output_len": 300, "random_range_ratio": 0.5,
                                             "random_prefix_len": 200, "num_prefix_groups": 2}},
    "no-chunking": {"engine": {"enable_chunked_prefill": False, "max_num_seqs": 8},
                    "workload": {"num_prompts": 60, "request_rate": 40.0, "random_input_len": 500,
                                 "random_output_len": 30, "random_range_ratio": 0.5}},
    "dp-prefix-aware": {"engine": {"data_parallel_size": 3, "router": "prefix_aware"},
                        "workload": {"num_prompts": 120, "request_rate": 60.0, "random_prefix_len": 64,
                                     "num_prefix_groups": 4, "random_range_ratio": 0.5}},
    "moe-dp-group": {"model": {"name": "Qwen/Qwen3-30B-A3B"},
                     "engine": {"data_parallel_size": 2, "enable_expert_parallel": True, "max_num_seqs": 16,
                                "gpu_memory_utilization": 0.5},
                     "workload": {"num_prompts": 80, "request_rate": 30.0, "random_input_len": 400,
                                  "random_output_len": 60, "random_range_ratio": 0.5}},
    # The group runs bulk group steps; TensorRT-LLM's attention-DP balance counts their iterations.
    "moe-dp-group-trtllm-balance": {
        "model": {"name": "Qwen/Qwen3-30B-A3B"},
        "engine": {"backend": "trtllm", "data_parallel_size": 4, "enable_expert_parallel": True, "max_num_seqs": 16,
                   "attention_dp_enable_balance": True, "attention_dp_timeout_iters": 7,
                   "attention_dp_batching_wait_iters": 2},
        "workload": {"num_prompts": 90, "request_rate": 25.0, "random_input_len": 300, "random_output_len": 80,
                     "random_range_ratio": 0.5}},
    # Tight KV: group steps stop where a rank's blocks run out; that rank preempts.
    "moe-dp-group-preempting": {
        "model": {"name": "Qwen/Qwen3-30B-A3B"},
        "engine": {"data_parallel_size": 2, "enable_expert_parallel": True, "gpu_memory_utilization": 0.43},
        "workload": {"num_prompts": 120, "max_concurrency": 96, "random_input_len": 1500, "random_output_len": 300,
                     "random_range_ratio": 0.5}},
    "closed-loop": {"workload": {"num_prompts": 100, "max_concurrency": 7, "random_input_len": 256,
                                 "random_output_len": 50, "random_range_ratio": 0.5}},
    # Pipeline micro-batches short of KV blocks: preemption (vLLM, SGLang) or held admissions
    # (TensorRT-LLM, whose max_batch_size bounds each micro-batch).
    "pp2-preempting": {"engine": {"pipeline_parallel_size": 2, "gpu_memory_utilization": 0.12, "max_num_seqs": 64},
                       "workload": {"num_prompts": 100, "max_concurrency": 96, "random_input_len": 1000,
                                    "random_output_len": 200, "random_range_ratio": 0.5}},
    # Pipeline micro-batches without chunked prefill: whole prompts of up to 900 tokens in
    # micro-batches of 1,024 beside a few hundred running requests.
    "pp2-no-chunking": {"engine": {"pipeline_parallel_size": 2, "enable_chunked_prefill": False, "max_model_len": 1024,
                                   "max_num_batched_tokens": 1024, "max_num_seqs": 512},
                        "workload": {"num_prompts": 500, "max_concurrency": 400, "random_input_len": 600,
                                     "random_output_len": 60, "random_range_ratio": 0.5}},
    # Equal lengths on two replicas: runs of decode steps end at the same instant as another
    # replica's event that routes a request to them.
    "dp2-equal-lengths": {"engine": {"data_parallel_size": 2},
                          "workload": {"num_prompts": 40, "random_input_len": 600, "random_output_len": 200,
                                       "random_range_ratio": 0.0, "max_concurrency": 4}},
    "pp2-trtllm-tight": {"engine": {"backend": "trtllm", "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.12,
                                    "max_num_seqs": 32},
                         "workload": {"num_prompts": 100, "max_concurrency": 96, "random_input_len": 1000,
                                      "random_output_len": 200, "random_range_ratio": 0.5}},
}
# SGLang's prefill priority: bulk decodes sit out the prefill-only steps.
SCENARIOS.update({f"sglang-{name}": {**spec, "engine": {**spec.get("engine", {}), "backend": "sglang"}}
                  for name, spec in list(SCENARIOS.items()) if "trtllm" not in name})


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_bulk_simulation_matches_the_reference(name: str) -> None:
    sc = scenario_from_dict(scenario_dict(**SCENARIOS[name]), source="t")
    bulk, ref = _pair(sc)
    _assert_same(bulk, ref)
    assert bulk.summary.num_completed == sc.workload.num_prompts


@pytest.mark.parametrize("name", ["moe-dp-group", "moe-dp-group-trtllm-balance", "moe-dp-group-preempting"])
def test_attention_dp_groups_run_bulk_group_steps(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scenarios above that match the reference do take the group fast path (most of their
    steps), so the comparison covers it."""
    ran = [0]
    run = Simulation._run_group_bulk_decodes

    def counted(self: Simulation, idx: int) -> list[RequestState]:
        before = self.num_steps
        out = run(self, idx)
        ran[0] += self.num_steps - before
        return out

    monkeypatch.setattr(Simulation, "_run_group_bulk_decodes", counted)
    result = simulate(scenario_from_dict(scenario_dict(**SCENARIOS[name]), source="t"))
    if name == "moe-dp-group-preempting":
        # Ranks with preempted requests waiting for blocks plan step by step (as one engine does).
        assert ran[0] > 0 and result.summary.num_preemptions > 0
    else:
        assert ran[0] > 0.3 * result.summary.num_steps


def test_preemption_scenario_preempts_and_hits_the_prefix_cache() -> None:
    """The scenario above exercises what it is meant to: preemptions and prefix hits."""
    sc = scenario_from_dict(scenario_dict(**SCENARIOS["preemption-prefix-cache"]), source="t")
    result = simulate(sc)
    assert result.summary.num_preemptions > 10
    assert result.summary.prefix_hit_frac > 0.05


def test_step_limit_truncates_both_paths_at_the_same_step() -> None:
    sc = scenario_from_dict(scenario_dict(**SCENARIOS["poisson"]), source="t")
    a = simulate(sc, limits=SimLimits(max_num_steps=500))
    b = simulate(sc, limits=SimLimits(max_num_steps=500, bulk_decode=False))
    assert a.summary.truncated and a.summary.num_steps == 500
    assert a.records == b.records and a.summary == b.summary


def test_shared_prefix_keys_until_preemption_give_the_records_of_full_keys() -> None:
    """Keys of request-unique prompt blocks are derived when a request is preempted; indexing every
    request's prompt blocks from its first step instead gives the same records."""
    sc = scenario_from_dict(scenario_dict(**SCENARIOS["preemption-prefix-cache"]), source="t")
    lazy = simulate(sc)
    assert lazy.summary.num_preemptions > 0
    engine = sc.engine
    assert engine.max_num_seqs is not None and engine.max_num_batched_tokens is not None
    kv = KVCacheManager(num_blocks=lazy.memory.usable_kv_blocks(), block_size=engine.block_size,
                        enable_prefix_caching=True)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=engine.max_num_seqs,
                            max_num_batched_tokens=engine.max_num_batched_tokens,
                            enable_chunked_prefill=engine.enable_chunked_prefill,
                            long_prefill_token_threshold=engine.long_prefill_token_threshold)
    (seq,) = np.random.SeedSequence(sc.seed).spawn(1)
    states = [RequestState(request_id=s.request_id, prompt_tokens=s.prompt_tokens, output_tokens=s.output_tokens,
                           arrival_s=s.arrival_s, segments=s.segments,
                           keys=kv.prompt_block_keys(s.segments, s.request_id, s.prompt_tokens))
              for s in generate(sc.workload, np.random.default_rng(seq))]
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))
    sim = Simulation(replicas=[sched], pricer=pricer, router=engine.router, max_concurrency=None,
                     limits=SimLimits(), client_latency_s=client_latency_s(engine, load_host_params("vllm")))
    assert tuple(sim.run(states)) == lazy.records


# -- pricer parts ------------------------------------------------------------------------------


def _reference_step_s(sc: Scenario, key: StepKey, cost: StepCostModel) -> float:
    """The step price from the whole kernel graph, as the pricer computed it before it had parts."""
    prefills, num_decode, mean = key
    batch = BatchShape(prefills=tuple(PrefillChunk(new_tokens=n, context_tokens=c, samples=s) for n, c, s in prefills),
                       decode_context_tokens=(mean,) * num_decode)
    graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch)
    timing = cost.cost(graph)
    host = load_host_params("vllm")
    mode = sc.engine.effective_launch_mode()
    gap = sum(max(0.0, host.eager_launch_s - k.estimate.time_s) * k.repeat for k in timing.kernels)
    assert sc.engine.max_cudagraph_capture_size is not None
    hc = host_cost(params=host, mode=mode, num_seqs=batch.num_sequences(), num_sampled=batch.num_sampled(),
                   is_decode_only=not prefills, max_cudagraph_capture_size=sc.engine.max_cudagraph_capture_size,
                   num_launches=graph.num_launches(), num_layers=sc.model.num_layers,
                   short_kernel_gap_s=gap if mode == "eager" else 0.0)
    return step_time_s(device_s=timing.device_s(), host=hc, async_scheduling=resolved_async_scheduling(sc.engine, load_engine_profile("vllm")))


@pytest.mark.parametrize("model, engine", [
    ("meta-llama/Llama-3.1-8B", {}),
    ("meta-llama/Llama-3.1-8B", {"enforce_eager": True, "tensor_parallel_size": 2}),
    ("Qwen/Qwen3-30B-A3B", {"tensor_parallel_size": 2, "async_scheduling": True}),
    ("openai/gpt-oss-120b", {"tensor_parallel_size": 2}),
    ("mistralai/Mixtral-8x7B-v0.1", {"tensor_parallel_size": 2, "enable_expert_parallel": True}),
    ("deepseek-ai/DeepSeek-R1", {"tensor_parallel_size": 8}),
    ("deepseek-ai/DeepSeek-R1", {"data_parallel_size": 8, "enable_expert_parallel": True, "kv_cache_dtype": "fp8"}),
    ("zai-org/GLM-5", {"tensor_parallel_size": 4, "moe_expert_parallel_size": 2, "moe_tensor_parallel_size": 2}),
    ("Qwen/Qwen3.5-397B-A17B", {"tensor_parallel_size": 8, "quantization": "fp8_block"}),
])
def test_pricer_parts_add_up_to_the_whole_step_graph(model: str, engine: dict[str, object]) -> None:
    sc = scenario_from_dict(scenario_dict(model={"name": model}, engine={"max_model_len": 4096, **engine}),
                            source="t")
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc))
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))
    # Token counts at vLLM's capture sizes (304, 1, 40, 336, 208; a captured step's tokens are padded to
    # the next size, tests/sim/engine/test_steps_and_routing.py) or above the largest (1,000).
    keys: list[StepKey] = [
        (((304, 0, True),), 0, 0),
        ((), 1, 16),
        ((), 40, 512),
        (((128, 0, False), (128, 0, False), (68, 256, True)), 12, 1024),
        # A one-token chunk that does not sample (one that samples is keyed as a decode where the
        # engine batches it with the decodes: vLLM's MLA backends, tests/sim/graph/test_one_token_chunks.py).
        (((1, 40, False),), 207, 2048),
        (((1000, 0, True),), 0, 0),
    ]
    for key in keys:
        assert pricer.step_s(key) == pytest.approx(_reference_step_s(sc, key, cost), rel=1e-12), key


def test_due_block_counts_are_cached_per_pattern_within_a_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cumulated blocks taken per bulk step come from a process-wide cache per block-crossing
    pattern: the same numbers as counting step by step, read-only, and never more steps held than
    the bound."""
    from sim.serving import vllm_v1

    monkeypatch.setattr(vllm_v1, "_DUE_COUNTS", {})
    monkeypatch.setattr(vllm_v1, "_due_counts_steps", [0])
    monkeypatch.setattr(vllm_v1, "_DUE_COUNTS_MAX_STEPS", 3000)
    rng = np.random.default_rng(5)
    for _ in range(200):
        sizes = rng.integers(0, 3, 16).tolist()
        r = int(rng.integers(16))
        prefix = list(itertools.accumulate(sizes[r:] + sizes[:r]))
        n = int(rng.integers(1, 700))
        got = vllm_v1.due_block_counts(n, prefix)
        expected = np.cumsum([prefix[j % 16] - (prefix[j % 16 - 1] if j % 16 else 0) for j in range(n)])
        assert got.tolist() == expected.tolist()
        assert not got.flags.writeable
        held = sum(map(len, vllm_v1._DUE_COUNTS.values()))
        assert held == vllm_v1._due_counts_steps[0] <= 3000
