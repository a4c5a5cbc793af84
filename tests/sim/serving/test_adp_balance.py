"""TensorRT-LLM's attention-DP balance (`attention_dp_config`): hold new context requests until every
DP rank has one, the timeout passes, or a rank has no generation request."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import simulate
from sim.engine.simulation import request_states
from sim.errors import ConfigError
from sim.serving.adp_balance import AdpBalance, RankLoad
from sim.serving.dp_group import DataParallelGroup
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import scenario_from_dict
from sim.workload.requests import RequestSpec, Segment

_TRT_MOE_DP2 = {"backend": "trtllm", "data_parallel_size": 2, "enable_expert_parallel": True}
_MOE = {"name": "Qwen/Qwen3-30B-A3B"}


def _load(ctx: int, gen: int, cap: int = 4) -> RankLoad:
    return RankLoad(num_context=ctx, num_generation=gen, max_batch=cap)


def test_decision_table_follows_pyexecutor() -> None:
    b = AdpBalance(timeout_iters=3, batching_wait_iters=0)
    # Only rank 0 has a context request, both decode: held, the waiting counter ticks to the timeout.
    assert [b.release([_load(1, 2), _load(0, 2)]) for _ in range(4)] == [False, False, True, False]
    # The counter ticks without any context request too (TRT-LLM runs the test every iteration).
    b = AdpBalance(timeout_iters=3, batching_wait_iters=0)
    assert [b.release([_load(0, 2), _load(0, 2)]) for _ in range(2)] == [False, False]
    assert b.release([_load(1, 2), _load(0, 2)]) is True
    # A rank without a generation request lets the contexts run at once (its GPU would idle).
    b = AdpBalance(timeout_iters=3, batching_wait_iters=0)
    assert b.release([_load(1, 2), _load(0, 0)]) is True and b.waiting_iters == 0
    # Every rank has a context request: run (batching_wait_iters 0), and the waiting counter resets.
    b = AdpBalance(timeout_iters=3, batching_wait_iters=0)
    b.release([_load(1, 2), _load(0, 2)])
    assert b.release([_load(1, 2), _load(1, 2)]) is True and b.waiting_iters == 0
    # ... unless a rank's batch is full: then it counts as not ready.
    assert b.release([_load(1, 4), _load(1, 2)]) is False and b.waiting_iters == 1
    # batching_wait_iters 2: with every rank decoding, all-ready contexts wait 2 more iterations.
    b = AdpBalance(timeout_iters=3, batching_wait_iters=2)
    assert [b.release([_load(1, 1), _load(1, 1)]) for _ in range(4)] == [False, False, True, False]
    # ... but not when a rank has no generation request.
    b = AdpBalance(timeout_iters=3, batching_wait_iters=2)
    assert b.release([_load(1, 1), _load(1, 0)]) is True


def _ranks(n: int) -> list[VllmV1Scheduler]:
    return [VllmV1Scheduler(kv=KVCacheManager(num_blocks=400, block_size=16, enable_prefix_caching=False),
                            max_num_seqs=4, max_num_batched_tokens=1024, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, reserve_full_output=True) for _ in range(n)]


def _request(i: int) -> RequestState:
    kv = KVCacheManager(num_blocks=1, block_size=16, enable_prefix_caching=False)
    spec = RequestSpec(request_id=i, arrival_s=0.0, prompt_tokens=32, output_tokens=100,
                       segments=(Segment(content_id=1000 + i, num_tokens=32),))
    (state,) = request_states([spec], kv)
    return state


def _prefill_steps(group: DataParallelGroup, steps: int,
                   arrivals: dict[int, list[tuple[int, int]]]) -> dict[int, int]:
    """Run `steps` group steps; `arrivals` maps a step to the (request id, rank) pairs added before
    it. Returns, per request id, the group step whose plan prefills it."""
    first: dict[int, int] = {}
    for step in range(1, steps + 1):
        for i, rank in arrivals.get(step, []):
            req = _request(i)
            req.replica = rank
            group.ranks[rank].add(req)
        plan = group.schedule()
        assert plan is not None
        for chunk in plan.chunks:
            if not chunk.is_decode():
                first.setdefault(chunk.request.request_id, step)
        group.finish_step(plan)
    return first


def test_two_rank_trace_holds_a_lone_context_until_the_timeout() -> None:
    # Step 1: request 0 on rank 0, request 1 on rank 1: every rank has a context request and none
    # decodes, so both prefill at once. Request 2 then arrives on rank 0 while both ranks decode:
    # only rank 0 has a context request, so it is held; the waiting counter reads 1, 2 in steps 2
    # and 3 and reaches timeout_iters = 3 in step 4, which prefills it.
    group = DataParallelGroup(_ranks(2), AdpBalance(timeout_iters=3, batching_wait_iters=0))
    first = _prefill_steps(group, 6, {1: [(0, 0), (1, 1)], 2: [(2, 0)]})
    assert first == {0: 1, 1: 1, 2: 4}
    # The same without the balance: request 2 prefills in the step it arrives for.
    plain = DataParallelGroup(_ranks(2))
    assert _prefill_steps(plain, 6, {1: [(0, 0), (1, 1)], 2: [(2, 0)]}) == {0: 1, 1: 1, 2: 2}


def test_two_rank_trace_releases_when_the_other_rank_gets_a_context() -> None:
    # Request 2 is held in step 2 (counter 1); request 3 arrives on rank 1 before step 3: both
    # ranks now have a context request and a free slot, so both prefill in step 3.
    group = DataParallelGroup(_ranks(2), AdpBalance(timeout_iters=60, batching_wait_iters=0))
    first = _prefill_steps(group, 5, {1: [(0, 0), (1, 1)], 2: [(2, 0)], 3: [(3, 1)]})
    assert first == {0: 1, 1: 1, 2: 3, 3: 3}


def test_an_empty_rank_counts_its_dummy_generation_request() -> None:
    # Rank 1 has no request: TRT-LLM pads it with a dummy generation request, so rank 0's new
    # context waits for the timeout (2 iterations) although rank 1 is idle.
    group = DataParallelGroup(_ranks(2), AdpBalance(timeout_iters=2, batching_wait_iters=0))
    first = _prefill_steps(group, 5, {1: [(0, 0)], 2: [(2, 0)]})
    # Step 1: rank 0 has a context and no decode -> runs at once. Steps 2 (counter 1) held, 3 runs.
    assert first == {0: 1, 2: 3}


def _sc(**engine: Any) -> dict[str, Any]:
    return scenario_dict(model=_MOE, engine={**_TRT_MOE_DP2, **engine},
                         workload={"num_prompts": 40, "max_concurrency": 8, "random_input_len": 256,
                                   "random_output_len": 64, "dataset_name": "random",
                                   "random_range_ratio": 0.5})


@pytest.mark.parametrize(("engine", "model", "key", "words"), [
    ({"backend": "vllm", "attention_dp_enable_balance": True}, _MOE, "engine.attention_dp_enable_balance",
     "backend = \"trtllm\""),
    ({"backend": "sglang", "attention_dp_timeout_iters": 60}, _MOE, "engine.attention_dp_timeout_iters",
     "backend = \"trtllm\""),
    ({"attention_dp_enable_balance": True, "data_parallel_size": 1}, _MOE, "engine.attention_dp_enable_balance",
     "data_parallel_size >= 2"),
    ({"attention_dp_enable_balance": True, "enable_expert_parallel": False},
     {"name": "meta-llama/Llama-3.1-8B"}, "engine.attention_dp_enable_balance", "MoE model"),
    ({"attention_dp_enable_balance": True, "attention_dp_timeout_iters": -1}, _MOE,
     "engine.attention_dp_timeout_iters", ">= 0"),
    ({"attention_dp_batching_wait_iters": -2}, _MOE, "engine.attention_dp_batching_wait_iters", ">= 0"),
])
def test_config_errors_name_key_value_and_rule(engine: dict[str, Any], model: dict[str, Any], key: str,
                                               words: str) -> None:
    d = scenario_dict(model=model, engine={**_TRT_MOE_DP2, **engine})
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(d, source="s.toml")
    assert info.value.source == "s.toml" and info.value.key == key and words in info.value.rule


def test_disaggregated_pools_reject_the_balance() -> None:
    d = _sc()
    d["disaggregation"] = {"prefill": {"engine": {"attention_dp_enable_balance": True}}, "decode": {}}
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(d, source="s.toml")
    assert info.value.key == "disaggregation.prefill.engine.attention_dp_enable_balance"


def test_defaults_keep_hash_and_results(tmp_path: Path) -> None:
    base = scenario_from_dict(_sc(), source="t")
    same = scenario_from_dict(_sc(attention_dp_enable_balance=False, attention_dp_timeout_iters=50,
                                  attention_dp_batching_wait_iters=10), source="t")
    assert same.scenario_hash() == base.scenario_hash()
    on = scenario_from_dict(_sc(attention_dp_enable_balance=True, attention_dp_timeout_iters=60,
                                attention_dp_batching_wait_iters=0), source="t")
    assert on.scenario_hash() != base.scenario_hash()
    assert simulate(same).summary == simulate(base).summary
    # On: the same requests, later first tokens (held contexts), never earlier on average.
    held, free = simulate(on).summary, simulate(base).summary
    assert held.num_completed == free.num_completed == 40
    assert held.ttft_mean_s > free.ttft_mean_s


@pytest.mark.parametrize("bulk", [True, False])
def test_the_balance_holds_a_chunked_prompts_next_chunk_too(bulk: bool) -> None:
    """`PyExecutor._balance_adp_requests` returns no context request for a held iteration, the next
    chunk of a prompt already being chunked included (before 2026-12-02 only new prompts were held)."""
    kv = KVCacheManager(num_blocks=1000, block_size=32, enable_prefix_caching=False)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=512, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, bulk_decodes=bulk)
    decode = RequestState(request_id=0, prompt_tokens=16, output_tokens=50, arrival_s=0.0, keys=())
    long = RequestState(request_id=1, prompt_tokens=2000, output_tokens=8, arrival_s=0.0, keys=())
    for req in (decode, long):
        sched.add(req)
    for _ in range(2):  # the short prompt and the long prompt's first chunks, then a decode
        plan = sched.schedule()
        assert plan is not None
        sched.finish_step(plan)
    assert 0 < long.num_computed < long.prompt_tokens
    sched.hold_new = True
    plan = sched.schedule()
    assert plan is not None and all(c.request is not long for c in plan.chunks)
    assert plan.num_bulk_decodes + sum(c.request is decode for c in plan.chunks) == 1  # the decode runs
    sched.finish_step(plan)
    sched.hold_new = False
    plan = sched.schedule()
    assert plan is not None and any(c.request is long for c in plan.chunks)


def test_tensorrt_llm_does_not_wait_for_batches_under_attention_dp() -> None:
    """`PyExecutor._schedule` waits for batches only without attention DP: the keys change nothing there."""
    def run(**engine: Any) -> Any:
        return simulate(scenario_from_dict(scenario_dict(
            model=_MOE, engine={**_TRT_MOE_DP2, "max_model_len": 4096, **engine}, perf={"tier": "roofline"},
            workload={"num_prompts": 40, "request_rate": 20.0, "random_input_len": 512, "random_output_len": 64}),
            source="t")).summary
    assert run(batch_wait_timeout_iters=20, batch_wait_max_tokens_ratio=0.9) == run()
