"""Pipeline micro-batches (`sim.engine.micro_batches`): the split, the cycle's price, the scheduler's
bounds, and whole runs with and without them."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import scenario_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import load_host_params, scenario_efficiency, simulate
from sim.engine.micro_batches import pipeline_micro_batches, split_step
from sim.engine.pricer import StepKey, StepPricer
from sim.engine.simulation import SimLimits
from sim.perf.step import StepCostModel
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.scheduler import StepPlan
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict


def _pp(backend: str = "vllm", pp: int = 2, **engine: Any) -> Scenario:
    return scenario_from_dict(scenario_dict(
        engine={"backend": backend, "pipeline_parallel_size": pp, **engine},
        workload={"num_prompts": 120, "max_concurrency": 64, "random_input_len": 800, "random_output_len": 120,
                  "random_range_ratio": 0.5}), source="pp.toml")


def test_split_spreads_decodes_evenly_and_places_chunks_largest_first() -> None:
    assert split_step((), 7, 3) == [((), 3), ((), 2), ((), 2)]
    assert split_step((), 1, 4) == [((), 1)]  # empty micro-batches are left out
    # Decodes 2/2; the 900-token chunk goes to the first micro-batch, then the 300 and the 100 to
    # the second (fewest tokens: 2 < 902, then 302 < 902).
    chunks = ((100, 0, True), (900, 64, False), (300, 0, True))
    assert split_step(chunks, 4, 2) == [(((900, 64, False),), 2), (((100, 0, True), (300, 0, True)), 2)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192), st.booleans()), max_size=12),
       st.integers(0, 600), st.integers(2, 8))
def test_split_keeps_every_chunk_and_decode(chunks: list[tuple[int, int, bool]], num_decode: int, m: int) -> None:
    parts = split_step(tuple(chunks), num_decode, m)
    assert len(parts) <= m
    assert sorted(c for cs, _ in parts for c in cs) == sorted(chunks)
    assert sum(n for _, n in parts) == num_decode
    decodes = [n for _, n in parts]
    if num_decode >= m:
        assert max(decodes) - min(decodes) <= 1
    assert all(cs or n for cs, n in parts)
    assert all(list(cs) == sorted(cs) for cs, _ in parts)


def test_micro_batches_only_with_a_pipeline_outside_lockstep_groups() -> None:
    assert pipeline_micro_batches(_pp(pp=1)) == 1
    assert pipeline_micro_batches(_pp(pp=4)) == 4
    moe_dp = scenario_from_dict(scenario_dict(
        model={"name": "mistralai/Mixtral-8x7B-v0.1"},
        engine={"pipeline_parallel_size": 2, "data_parallel_size": 2, "tensor_parallel_size": 2,
                "max_model_len": 4096}), source="m.toml")
    assert pipeline_micro_batches(moe_dp) == 1


_LAST_STAGE = ("final_norm", "lm_head", "logits_all_gather", "sampler")


def _seconds_by_name(pricer: StepPricer, key: StepKey) -> dict[str, float]:
    """Device seconds of a one-batch step by kernel name."""
    _, parts, _ = pricer._rank_step(key, None)
    out: dict[str, float] = {}
    for part in parts:
        for (_, name), seconds in zip(part.labels, part.seconds, strict=True):
            out[name] = out.get(name, 0.0) + float(seconds)
    return out


def _pricers(sc: Scenario, m: int, host: Any = None) -> tuple[StepPricer, StepPricer]:
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc))
    host = host or load_host_params(sc.engine.backend)
    return StepPricer(sc, cost, host, micro_batches=m), StepPricer(sc, cost, host)


def test_a_cycle_costs_at_least_its_slowest_micro_batch_through_the_whole_pipeline() -> None:
    sc = _pp(pp=2)
    cycle, one = _pricers(sc, 2)
    mixed: StepKey = (((100, 0, True), (2000, 0, True)), 9, 256)
    # 5 + 4 decodes; the 2,000-token chunk joins the 4 (fewest tokens), the 100-token chunk the 5.
    slowest = max(one.step_s((((2000, 0, True),), 4, 256)), one.step_s((((100, 0, True),), 5, 256)))
    assert slowest <= cycle.step_s(mixed) < one.step_s(mixed)
    # One micro-batch alone crosses the stages in turn: its own step.
    assert cycle.step_s(((), 1, 512)) == one.step_s(((), 1, 512))


def test_the_last_stage_runs_the_lm_head_of_every_micro_batch() -> None:
    """A full pipeline's cycle is its busiest stage's work on every micro-batch: with the LM head and
    the sampler on the last stage, two micro-batches of 32 decodes take twice (half the layers + the
    LM head + the hop into it), more than one of them crossing both stages (vLLM's even split of
    Llama-3.1-8B's 32 layers)."""
    sc = _pp(pp=2)
    cycle, one = _pricers(sc, 2)
    by_name = _seconds_by_name(one, ((), 32, 512))
    last_only = sum(by_name.get(n, 0.0) for n in _LAST_STAGE)
    hop = by_name["pp_send_recv"]
    layered = sum(by_name.values()) - last_only - hop - by_name["embedding"]
    last_stage = layered / 2 + last_only + hop
    assert cycle.step_s(((), 64, 512)) == pytest.approx(2 * last_stage, rel=1e-9)
    assert cycle.step_s(((), 64, 512)) > 1.03 * one.step_s(((), 32, 512))


def test_uneven_stages_bound_the_cycle_by_the_one_with_more_layers() -> None:
    """32 layers on 3 stages are 11, 11 and 10 (vLLM's `get_pp_indices`): three micro-batches of a
    prompt chunk that samples nothing (no LM head) take three times 11 / 32 of one's layers."""
    sc = _pp(pp=3)
    cycle, one = _pricers(sc, 3)
    chunk = (512, 0, False)
    by_name = _seconds_by_name(one, ((chunk,), 0, 0))
    hops = by_name["pp_send_recv"]
    layered = sum(by_name.values()) - hops - by_name["embedding"] - by_name["final_norm"]
    assert cycle.step_s(((chunk,) * 3, 0, 0)) == pytest.approx(3 * (layered * 11 / 32 + hops / 2), rel=1e-9)
    assert cycle.step_s(((chunk,) * 3, 0, 0)) > 1.02 * one.step_s(((chunk,), 0, 0))


def test_one_host_thread_schedules_every_micro_batch_of_a_cycle() -> None:
    """A host-bound cycle lasts the scheduling work of all its micro-batches, done in turn."""
    sc = _pp(pp=4)
    host = load_host_params("vllm")
    slow_host = replace(host, schedule=replace(host.schedule, base_s=0.05))
    cycle, one = _pricers(sc, 4, slow_host)
    key: StepKey = ((), 64, 512)
    assert one.step_s(((), 16, 512)) < 0.1
    assert cycle.step_s(key) > 4 * 0.05


def test_each_stage_launches_only_its_own_kernels() -> None:
    """SGLang launches a prompt step's kernels eagerly, each rank those of its own stage: four
    micro-batches of one 256-token prompt on 4 stages launch a quarter of their kernels per stage
    each, about one micro-batch's launches in all, not four."""
    sc = _pp("sglang", pp=4)
    cycle, one = _pricers(sc, 4)
    chunk = (256, 0, True)
    _, _, host = one._rank_step(((chunk,), 0, 0), None)
    assert host.launch_s > 0.5 * one.step_s(((chunk,), 0, 0))  # launch-bound
    assert cycle.step_s(((chunk,) * 4, 0, 0)) < 1.3 * one.step_s(((chunk,), 0, 0))


def test_scheduler_bounds_per_micro_batch() -> None:
    """A pipeline step holds every micro-batch's token budget, each chunk at most one budget;
    TensorRT-LLM's max_batch_size bounds each micro-batch, vLLM's max_num_seqs all of them."""
    budget = 512
    for backend, most_running in (("vllm", 16), ("trtllm", 32)):
        sc = _pp(backend, max_num_seqs=16, max_num_batched_tokens=budget)
        result = simulate(sc, max_step_events=100_000)
        assert result.summary.num_completed == 120
        steps = result.steps
        assert max(s.num_prefill_tokens + s.num_decodes for s in steps) > budget
        assert max(s.num_prefill_tokens + s.num_decodes for s in steps) <= 2 * budget
        assert max(s.num_prefills + s.num_decodes for s in steps) == most_running
        # One batch at a time: one budget, max_num_seqs in all.
        flat = simulate(sc, max_step_events=100_000, limits=SimLimits(pipeline_micro_batches=False))
        assert max(s.num_prefill_tokens + s.num_decodes for s in flat.steps) <= budget
        assert max(s.num_prefills + s.num_decodes for s in flat.steps) == 16


@pytest.mark.parametrize(("seqs", "pp", "most"), [(6, 4, 4), (2, 4, 4), (10, 3, 9), (16, 2, 16)])
def test_sglang_bounds_each_micro_batch_by_its_share_of_the_running_requests(seqs: int, pp: int, most: int) -> None:
    """SGLang's `pp_max_micro_batch_size` defaults to max(max_running_requests // pp, 1) per micro-batch."""
    sc = scenario_from_dict(scenario_dict(
        engine={"backend": "sglang", "pipeline_parallel_size": pp, "max_num_seqs": seqs},
        workload={"num_prompts": 40, "max_concurrency": 32, "random_input_len": 200, "random_output_len": 40}),
        source="pp.toml")
    result = simulate(sc, max_step_events=100_000)
    assert result.summary.num_completed == 40
    assert max(s.num_prefills + s.num_decodes for s in result.steps) == most


def test_tensorrt_llm_cuts_pipeline_chunks_to_whole_blocks() -> None:
    """A prompt longer than one micro-batch's budget is cut to whole KV blocks (TensorRT-LLM's chunk
    unit), as one batch at a time cuts it."""
    sc = scenario_from_dict(scenario_dict(
        engine={"backend": "trtllm", "pipeline_parallel_size": 2, "max_num_batched_tokens": 1000, "block_size": 16,
                "max_num_seqs": 64},
        workload={"num_prompts": 20, "random_input_len": 3000, "random_output_len": 20, "random_range_ratio": 0.5}),
        source="pp.toml")
    result = simulate(sc, max_step_events=100_000)
    assert result.summary.num_completed == 20
    assert max(s.num_prefill_tokens for s in result.steps if s.num_prefills == 1 and not s.num_decodes) == 992


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_micro_batches_raise_throughput_and_finish_every_request_under_kv_pressure(backend: str) -> None:
    """A pipeline keeps its stages busy (more throughput than one batch at a time), and a replica
    short of KV blocks preempts (vLLM, SGLang) or holds admissions (TensorRT-LLM) as one engine
    does: every request finishes."""
    roomy = _pp(backend, max_num_seqs=64)
    a, b = simulate(roomy), simulate(roomy, limits=SimLimits(pipeline_micro_batches=False))
    assert a.summary.output_throughput_tokens_per_s > 1.1 * b.summary.output_throughput_tokens_per_s
    # SGLang's mem_fraction_static pays for the weights only (sim.graph.memory): 0.098 leaves 319 blocks.
    tight = _pp(backend, max_num_seqs=64, gpu_memory_utilization=0.098 if backend == "sglang" else 0.12)
    result = simulate(tight)
    assert result.summary.num_completed == 120 and not result.summary.truncated
    if backend != "trtllm":
        assert result.summary.num_preemptions > 0


@pytest.mark.parametrize("bulk", [True, False])
def test_a_chunk_gets_what_one_micro_batch_leaves_beside_its_decodes(bulk: bool) -> None:
    """Two micro-batches of 512 tokens with 20 running decodes (10 each): a long prompt's chunk is
    at most 512 - 10 tokens, though the step's budget has room for more."""
    plan = _long_prompt_beside_20_decodes(bulk_decodes=bulk)
    assert [c.num_new_tokens for c in plan.chunks if c.request.request_id == 99] == [502]
    assert plan.num_bulk_decodes + sum(1 for c in plan.chunks if c.request.request_id != 99) == 20


@pytest.mark.parametrize("bulk", [True, False])
def test_without_chunked_prefill_a_prompt_waits_for_a_micro_batch_with_room(bulk: bool) -> None:
    """A whole prompt is admitted only into the room one micro-batch has beside its running
    requests: 500 tokens do not fit 512 less 60 / 2 running, though the plan's budget has room;
    they do once the running requests are done."""
    kv = KVCacheManager(num_blocks=2000, block_size=16, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=256, max_num_batched_tokens=2 * 512, enable_chunked_prefill=False,
                            long_prefill_token_threshold=0, bulk_decodes=bulk, micro_batches=2)
    for i in range(60):
        sched.add(RequestState(request_id=i, prompt_tokens=4, output_tokens=5, arrival_s=0.0, keys=()))
    plan = sched.schedule()
    assert plan is not None
    sched.finish_step(plan)
    sched.add(RequestState(request_id=99, prompt_tokens=500, output_tokens=10, arrival_s=0.0, keys=()))
    admitted_at = None
    for step in range(1, 10):
        plan = sched.schedule()
        assert plan is not None
        if any(c.request.request_id == 99 for c in plan.chunks):
            admitted_at = step
            assert [c.num_new_tokens for c in plan.chunks if c.request.request_id == 99] == [500]
            break
        sched.finish_step(plan)
    assert admitted_at == 5  # the step after the 60 requests' last token (they sample 5: steps 1..4 here)


def test_a_threshold_without_chunked_prefill_does_not_hold_prompts_forever() -> None:
    """`long_prefill_token_threshold` cuts a prompt (as without pipeline parallelism) instead of
    keeping it waiting for room it can never have."""
    cut = scenario_from_dict(scenario_dict(
        engine={"pipeline_parallel_size": 2, "enable_chunked_prefill": False, "long_prefill_token_threshold": 500,
                "max_model_len": 2048},
        workload={"num_prompts": 40, "request_rate": 20.0, "random_input_len": 1000, "random_output_len": 30,
                  "random_range_ratio": 0.5}), source="pp.toml")
    result = simulate(cut)
    assert result.summary.num_completed == 40 and not result.summary.truncated


def _decoding(sched: VllmV1Scheduler, n: int) -> None:
    for i in range(n):
        sched.add(RequestState(request_id=i, prompt_tokens=4, output_tokens=100, arrival_s=0.0, keys=()))
    for _ in range(3):
        plan = sched.schedule()
        assert plan is not None
        sched.finish_step(plan)


def _long_prompt_beside_20_decodes(**policy: bool) -> StepPlan:
    """The first plan of two 512-token micro-batches once 20 requests decode and a 3,000-token
    prompt waits."""
    kv = KVCacheManager(num_blocks=2000, block_size=16, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=64, max_num_batched_tokens=2 * 512, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, micro_batches=2, **policy)
    _decoding(sched, 20)
    sched.add(RequestState(request_id=99, prompt_tokens=3000, output_tokens=10, arrival_s=0.0, keys=()))
    plan = sched.schedule()
    assert plan is not None
    return plan


def test_prefill_only_steps_give_a_chunk_a_whole_micro_batch() -> None:
    """SGLang's prefill priority: a prefill-only plan holds no decodes, so a chunk gets one micro-batch's
    whole budget."""
    plan = _long_prompt_beside_20_decodes(prefill_priority=True)
    assert plan.num_bulk_decodes == 0
    assert [c.num_new_tokens for c in plan.chunks] == [512]


def test_a_set_threshold_caps_chunks_as_without_a_pipeline() -> None:
    """TensorRT-LLM's chunk unit rounds what the budget leaves, not `long_prefill_token_threshold`."""
    for m in (1, 2):
        kv = KVCacheManager(num_blocks=2000, block_size=32, enable_prefix_caching=False)
        sched = VllmV1Scheduler(kv=kv, max_num_seqs=64, max_num_batched_tokens=m * 512, enable_chunked_prefill=True,
                                long_prefill_token_threshold=100, context_chunk_unit=32, micro_batches=m)
        sched.add(RequestState(request_id=0, prompt_tokens=3000, output_tokens=10, arrival_s=0.0, keys=()))
        plan = sched.schedule()
        assert plan is not None and [c.num_new_tokens for c in plan.chunks] == [100]
