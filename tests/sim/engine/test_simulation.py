"""Serving simulation: hand-computed single requests, chunking, preemption, invariants, determinism."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, scenario_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import load_host_params, scenario_efficiency, simulate
from sim.engine.pricer import StepPricer
from sim.perf.step import StepCostModel
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import scenario_from_dict


def one_request(prompt: int, output: int, **engine: object) -> object:
    d = scenario_dict(engine=engine, workload={"dataset_name": "fixed", "num_prompts": 1,
                                               "random_input_len": prompt, "random_output_len": output})
    return scenario_from_dict(d, source="t")


def test_single_request_ttft_and_e2e_are_sums_of_priced_steps() -> None:
    sc = one_request(300, 5)
    result = simulate(sc)
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))
    prefill = pricer.step_s((((300, 0, True),), 0, 0))
    decodes = [pricer.step_s(((), 1, max(16, round(ctx / 16) * 16))) for ctx in range(300, 304)]
    rec = result.records[0]
    latency = load_host_params("vllm").api_server_latency_s  # the API server's, outside the engine
    assert rec.ttft_s() == pytest.approx(prefill + latency, rel=1e-12)
    assert rec.e2el_s() == pytest.approx(prefill + sum(decodes) + latency, rel=1e-12)
    assert result.summary.tpot_mean_s == pytest.approx(sum(decodes) / 4, rel=1e-12)


def _scheduler(num_blocks: int, block_size: int, budget: int, chunked: bool = True,
               bulk: bool = True) -> VllmV1Scheduler:
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False)
    return VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=chunked,
                           long_prefill_token_threshold=0, bulk_decodes=bulk)


def _request(rid: int, prompt: int, output: int) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=prompt, output_tokens=output, arrival_s=0.0, keys=())


@pytest.mark.parametrize("bulk", [True, False])
def test_chunked_prefill_splits_exactly_at_the_budget(bulk: bool) -> None:
    sched = _scheduler(100, 16, 256, bulk=bulk)
    sched.add(_request(0, 1000, 2))
    sizes = []
    while True:
        plan = sched.schedule()
        if plan is None:
            break
        sizes.append([c.num_new_tokens for c in plan.chunks] + [1] * plan.num_bulk_decodes)
        sched.finish_step(plan)
    assert sizes == [[256], [256], [256], [232], [1]]


def test_without_chunking_a_long_prompt_waits_for_a_whole_budget() -> None:
    sched = _scheduler(100, 16, 512, chunked=False)
    sched.add(_request(0, 10, 3))
    sched.add(_request(1, 600, 1))
    plan = sched.schedule()
    assert plan is not None
    assert [c.num_new_tokens for c in plan.chunks] == [10]


@pytest.mark.parametrize("bulk", [True, False])
def test_preemption_frees_blocks_and_recomputes(bulk: bool) -> None:
    # 4 blocks of 4 tokens: two 6-token prompts fit (2 blocks each) until decoding needs a third.
    sched = _scheduler(4, 4, 64, bulk=bulk)
    a, b = _request(0, 6, 6), _request(1, 6, 6)
    sched.add(a)
    sched.add(b)
    preempted = []
    finished = []
    for _ in range(100):
        plan = sched.schedule()
        if plan is None:
            break
        preempted += [r.request_id for r in plan.preempted]
        finished += sched.finish_step(plan)
    assert preempted and preempted[0] == 1  # the last running request goes first
    assert {r.request_id for r in finished} == {0, 1}
    assert b.num_preemptions >= 1 and b.recomputed_tokens > 0
    assert sched.kv.num_free_blocks() == 4


@settings(max_examples=25, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    outputs=st.lists(st.integers(1, 12), min_size=8, max_size=8),
    num_blocks=st.integers(13, 40),
    budget=st.integers(8, 64),
    bulk=st.booleans(),
)
def test_every_request_finishes_and_tokens_add_up(prompts: list[int], outputs: list[int], num_blocks: int,
                                                  budget: int, bulk: bool) -> None:
    sched = _scheduler(num_blocks, 4, budget, bulk=bulk)
    reqs = [_request(i, p, outputs[i]) for i, p in enumerate(prompts)]
    for r in reqs:
        sched.add(r)
    computed = 0
    finished: list[RequestState] = []
    for _ in range(10_000):
        plan = sched.schedule()
        if plan is None:
            break
        assert plan.num_batched_tokens() <= budget
        computed += plan.num_batched_tokens()
        finished += sched.finish_step(plan)
    assert len(finished) == len(reqs)
    assert sched.kv.num_free_blocks() == num_blocks
    expected = sum(r.prompt_tokens + r.output_tokens - 1 + r.recomputed_tokens for r in reqs)
    assert computed == expected


def test_prefix_caching_hits_shared_system_prompts() -> None:
    d = scenario_dict(workload={"dataset_name": "fixed", "num_prompts": 20, "random_input_len": 64,
                                "random_output_len": 4, "random_prefix_len": 512, "request_rate": 1.0})
    on = simulate(scenario_from_dict(d, source="t"))
    off = simulate(scenario_from_dict({**d, "engine": {**d["engine"], "enable_prefix_caching": False}}, source="t"))
    assert on.summary.prefix_hit_frac > 0.8
    assert off.summary.prefix_hit_frac == 0.0
    assert on.summary.ttft_mean_s < off.summary.ttft_mean_s


def test_max_concurrency_caps_requests_in_flight() -> None:
    d = scenario_dict(workload={"num_prompts": 30, "max_concurrency": 2, "random_input_len": 64,
                                "random_output_len": 8})
    result = simulate(scenario_from_dict(d, source="t"))
    # The engine's finish: the records' is the client's, the API server's latency later.
    latency = load_host_params("vllm").api_server_latency_s
    events = sorted([(r.arrival_s, 1) for r in result.records]
                    + [(r.finish_s - latency - 1e-12, -1) for r in result.records],  # (x + L) - L rounds
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert peak <= 2 and len(result.records) == 30


def test_data_parallel_replicas_share_the_load() -> None:
    d = scenario_dict(engine={"data_parallel_size": 2, "router": "least_outstanding"},
                      workload={"num_prompts": 40, "request_rate": 50.0})
    result = simulate(scenario_from_dict(d, source="t"))
    assert {r.replica for r in result.records} == {0, 1}
    assert result.summary.num_gpus == 2


def test_same_seed_gives_identical_results_in_two_processes() -> None:
    code = ("import json,sys; from sim.api import load_scenario, simulate; from sim.serde import to_jsonable;"
            "r=simulate(load_scenario('scenarios/llama3_8b-h100.toml', {'workload.num_prompts': 200}));"
            "sys.stdout.write(json.dumps(to_jsonable(r.summary), sort_keys=True))")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert outs[0] == outs[1]
    assert json.loads(outs[0])["num_completed"] == 200
