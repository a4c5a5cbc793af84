"""The engine's step log and Chrome trace, routers, runs that cannot finish, an exact preemption."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import scenario_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import load_host_params, scenario_efficiency, simulate
from sim.engine.pricer import StepPricer
from sim.engine.records import StepRecord
from sim.engine.simulation import SimLimits, Simulation, loads_imbalanced
from sim.engine.step_log import StepLog
from sim.errors import ConfigError
from sim.metrics.chrome_trace import write_chrome_trace
from sim.perf.step import StepCostModel
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict


def _scenario(**sections: dict[str, Any]) -> Scenario:
    return scenario_from_dict(scenario_dict(**sections), source="t")


def _request(rid: int, prompt: int, output: int, arrival_s: float = 0.0) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=prompt, output_tokens=output, arrival_s=arrival_s, keys=())


def _scheduler(num_blocks: int, block_size: int, budget: int, bulk: bool = True) -> VllmV1Scheduler:
    kv = KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False)
    return VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=budget, enable_chunked_prefill=True,
                           long_prefill_token_threshold=0, bulk_decodes=bulk)


def _pricer(sc: Scenario) -> StepPricer:
    return StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"))


# -- step log and Chrome trace --------------------------------------------------------------------

def test_one_request_logs_its_prefill_then_one_decode_event_per_priced_context() -> None:
    sc = _scenario(workload={"dataset_name": "fixed", "num_prompts": 1, "random_input_len": 300,
                             "random_output_len": 5},
                   engine={"api_server_latency_s": 0.0})  # engine times: the record's finish ends the log
    result = simulate(sc, max_step_events=100)
    pricer = _pricer(sc)
    prefill_s = pricer.step_s((((300, 0, True),), 0, 0))
    decode_s = pricer.step_s(((), 1, 304))  # contexts 300..303 all price at the 304 bucket
    assert result.steps == (
        StepRecord(replica=0, start_s=0.0, end_s=prefill_s, num_steps=1, step_s=prefill_s, num_prefills=1,
                   num_prefill_tokens=300, num_decodes=0, mean_decode_context_tokens=0, num_preempted=0),
        StepRecord(replica=0, start_s=prefill_s, end_s=result.records[0].finish_s, num_steps=4, step_s=decode_s,
                   num_prefills=0, num_prefill_tokens=0, num_decodes=1, mean_decode_context_tokens=304,
                   num_preempted=0),
    )
    assert result.steps[1].end_s == pytest.approx(prefill_s + 4 * decode_s, rel=1e-12)
    assert [s.kind() for s in result.steps] == ["prefill", "decode"]
    assert simulate(sc).steps == ()  # no log unless asked


@pytest.mark.parametrize("engine", [{}, {"data_parallel_size": 2, "router": "least_outstanding"}])
def test_step_log_is_the_same_on_bulk_and_reference_paths_and_counts_every_step(engine: dict[str, Any]) -> None:
    sc = _scenario(engine=engine, workload={"num_prompts": 60, "request_rate": 40.0, "random_input_len": 700,
                                            "random_output_len": 40, "random_range_ratio": 0.5})
    bulk = simulate(sc, max_step_events=10_000)
    ref = simulate(sc, max_step_events=10_000, limits=SimLimits(bulk_decode=False))
    assert bulk.steps == ref.steps
    assert sum(s.num_steps for s in bulk.steps) == bulk.summary.num_steps
    assert bulk.summary == simulate(sc).summary  # logging changes nothing
    assert any(s.kind() == "mixed" for s in bulk.steps) and any(s.num_steps > 1 for s in bulk.steps)


def test_step_log_stops_at_its_cap_and_counts_the_rest() -> None:
    sc = _scenario(workload={"num_prompts": 30, "request_rate": 20.0})
    full = simulate(sc, max_step_events=10_000)
    capped = simulate(sc, max_step_events=5)
    assert capped.steps == full.steps[:5]
    assert capped.num_steps_not_logged == sum(s.num_steps for s in full.steps[5:]) > 0


def test_chrome_trace_has_one_complete_event_per_step_record() -> None:
    sc = _scenario(engine={"data_parallel_size": 2}, workload={"num_prompts": 8, "request_rate": 10.0})
    result = simulate(sc, max_step_events=1000)
    f = io.StringIO()
    write_chrome_trace(f, result.steps, result.records, num_steps_not_logged=0)
    trace = json.loads(f.getvalue())
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    assert len(steps) == len(result.steps)
    for event, rec in zip(steps, result.steps, strict=True):
        assert event["ph"] == "X" and event["pid"] == rec.replica and event["tid"] == 0
        assert event["ts"] == rec.start_s * 1e6 and event["dur"] == (rec.end_s - rec.start_s) * 1e6
        assert event["name"] == event["args"]["kind"] == rec.kind()
        assert event["args"]["num_steps"] == rec.num_steps
        assert event["args"]["num_prefill_tokens"] == rec.num_prefill_tokens
        assert event["args"]["num_decodes"] == rec.num_decodes
    assert {e["pid"] for e in steps} == {0, 1}
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "request"]) == 8


def test_step_log_merges_only_identical_back_to_back_steps() -> None:
    log = StepLog(max_events=3)
    decode = ((), 4, 512)
    log.add(replica=0, start_s=0.0, step_s=1.0, num_steps=1, end_s=1.0, key=decode, num_preempted=0)
    log.add(replica=1, start_s=0.5, step_s=1.0, num_steps=1, end_s=1.5, key=decode, num_preempted=0)
    log.add(replica=0, start_s=1.0, step_s=1.0, num_steps=2, end_s=3.0, key=decode, num_preempted=0)  # merged
    log.add(replica=0, start_s=3.5, step_s=1.0, num_steps=1, end_s=4.5, key=decode, num_preempted=0)  # a gap
    log.add(replica=0, start_s=4.5, step_s=1.0, num_steps=1, end_s=5.5, key=decode, num_preempted=0)  # merged
    assert log.num_dropped_steps == 0
    log.add(replica=0, start_s=5.5, step_s=1.0, num_steps=1, end_s=6.5, key=((), 4, 528), num_preempted=0)
    log.add(replica=1, start_s=1.5, step_s=1.0, num_steps=7, end_s=8.5, key=decode, num_preempted=1)
    log.add(replica=1, start_s=1.5, step_s=2.0, num_steps=1, end_s=3.5, key=decode, num_preempted=0)
    assert [(r.replica, r.start_s, r.end_s, r.num_steps) for r in log.records()] == [
        (0, 0.0, 3.0, 3), (1, 0.5, 1.5, 1), (0, 3.5, 5.5, 2)]
    assert len(log) == 3 and log.num_dropped_steps == 9  # another context, a preemption, another duration


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 60)), min_size=1, max_size=25),
    gaps_ms=st.lists(st.floats(0.0, 50.0), min_size=25, max_size=25),
    replicas=st.integers(1, 3),
    budget=st.sampled_from([256, 2048, 8192]),
    bulk=st.booleans(),
)
def test_real_simulation_never_starts_a_step_before_an_earlier_one(
        lengths: list[tuple[int, int]], gaps_ms: list[float], replicas: int, budget: int, bulk: bool) -> None:
    sc = _scenario()  # prices the steps; the replicas are built here
    arrivals, t = [], 0.0
    for gap in gaps_ms[:len(lengths)]:
        t += gap / 1e3
        arrivals.append(t)
    scheds = [_scheduler(4096, 16, budget, bulk=bulk) for _ in range(replicas)]
    log = StepLog(max_events=100_000)
    sim = Simulation(replicas=scheds, pricer=_pricer(sc), router="least_outstanding", max_concurrency=None,
                     limits=SimLimits(bulk_decode=bulk), step_log=log)
    records = sim.run([_request(i, p, o, a) for i, ((p, o), a) in enumerate(zip(lengths, arrivals, strict=False))])
    assert len(records) == len(lengths) and not sim.truncated
    steps = log.records()
    starts = [s.start_s for s in steps]
    assert starts == sorted(starts)  # the clock never goes back
    last_end: dict[int, float] = {}
    for s in steps:  # a replica runs one step at a time
        assert s.start_s >= last_end.get(s.replica, 0.0) and s.end_s > s.start_s
        last_end[s.replica] = s.end_s
    assert sum(s.num_steps for s in steps) == sim.num_steps
    assert max(r.finish_s for r in records) == max(last_end.values())


# -- runs that cannot finish ------------------------------------------------------------------------

@pytest.mark.parametrize("bulk", [True, False])
def test_a_request_that_can_never_be_scheduled_marks_the_run_truncated(bulk: bool) -> None:
    sc = _scenario()
    # 2 blocks of 16 tokens: request 1's 100-token prompt never fits; request 0 (10 + 2) does.
    sim = Simulation(replicas=[_scheduler(2, 16, 256, bulk=bulk)], pricer=_pricer(sc), router="round_robin",
                     max_concurrency=None, limits=SimLimits(bulk_decode=bulk))
    records = sim.run([_request(0, 10, 2), _request(1, 100, 2)])
    assert [r.request_id for r in records] == [0]
    assert sim.truncated


def _trace_scenario(tmp_path: Path, rows: str, **engine: Any) -> Scenario:
    path = tmp_path / "trace.csv"
    path.write_text("input_tokens,output_tokens,arrival_s,prefix_group,prefix_tokens\n" + rows)
    num_rows = rows.count("\n")
    return _scenario(engine=engine, workload={"dataset_name": "trace", "dataset_path": str(path),
                                              "num_prompts": num_rows})


def test_simulating_a_trace_row_over_max_model_len_is_a_config_error(tmp_path: Path) -> None:
    sc = _trace_scenario(tmp_path, "100,10,0,-1,0\n8000,193,0,-1,0\n")  # 8193 > max_model_len 8192
    with pytest.raises(ConfigError) as info:
        simulate(sc)
    assert info.value.source.endswith("trace.csv row 2") and info.value.value == 8193
    assert "max_model_len=8192" in info.value.rule
    ok = _trace_scenario(tmp_path, "100,10,0,-1,0\n8000,192,0,-1,0\n")
    assert simulate(ok).summary.num_completed == 2


# -- routers -------------------------------------------------------------------------------------------

# Request 0 (prefix group 0) decodes for seconds on the replica it lands on; request 1 (group 1)
# finishes within the first second. At t=1 s requests 2 (group 0), 3 and 4 (group 1) arrive together.
_ROUTER_TRACE = "612,2000,0,0,512\n612,2,0,1,512\n612,2,1.0,0,512\n612,2,1.0,1,512\n612,2,1.0,1,512\n"


@pytest.mark.parametrize("router, expected", [
    # in turn
    ("round_robin", [0, 1, 0, 1, 0]),
    # fewest waiting + running (ties to the lowest index): at t=1 loads are (1, 0), then (1, 1), then (2, 1)
    ("least_outstanding", [0, 1, 1, 0, 1]),
    # most cached prefix tokens first: group 0 is cached on replica 0 (busy), group 1 on replica 1
    ("prefix_aware", [0, 1, 0, 1, 1]),
])
def test_routers_route_as_documented(tmp_path: Path, router: str, expected: list[int]) -> None:
    sc = _trace_scenario(tmp_path, _ROUTER_TRACE, data_parallel_size=2, router=router)
    records = sorted(simulate(sc).records, key=lambda r: r.request_id)
    assert records[1].finish_s < 1.0 < records[0].finish_s  # the premise of the expected routes
    assert [r.replica for r in records] == expected


def test_prefix_aware_routing_balances_a_prefix_every_request_shares() -> None:
    """One system prompt in every request: the replica that cached it first holds the most cached
    tokens for every later request, so a router that only follows the cache sends them all there
    (it did: 300 of 300, the other replica idle). SGLang router's cache-aware policy balances load
    once the outstanding requests differ by more than 64 and 1.5x, and so does `prefix_aware`."""
    sc = _scenario(engine={"data_parallel_size": 2, "router": "prefix_aware"},
                   workload={"num_prompts": 300, "request_rate": 200.0, "random_input_len": 128,
                             "random_output_len": 256, "random_prefix_len": 512})
    counts = [0, 0]
    for record in simulate(sc).records:
        counts[record.replica] += 1
    assert min(counts) >= 100, counts


def test_loads_imbalanced_follows_sglang_cache_aware_thresholds() -> None:
    assert not loads_imbalanced([64, 0])  # max - min must exceed 64
    assert loads_imbalanced([65, 0])
    assert not loads_imbalanced([200, 135])  # 200 - 135 > 64 but 200 < 1.5 x 135
    assert loads_imbalanced([203, 135])


# -- an exact preemption --------------------------------------------------------------------------------

@pytest.mark.parametrize("bulk", [True, False])
def test_preemption_by_hand(bulk: bool) -> None:
    """4 blocks of 4 tokens, requests a and b of 6 prompt + 6 output tokens.

    Step 1 prefills both (2 blocks each, all 4 used) and samples their first tokens; steps 2 and 3
    decode both (contexts 7, 8: still 2 blocks each). In step 4 a needs a 9th token slot, a third
    block: none is free, so b, the last running, is preempted with 8 computed tokens (6 prompt + 2
    decoded) and a runs alone. b (9 known tokens = 3 blocks) cannot be admitted while a holds 3;
    a samples its 6th token in step 6 and frees its blocks; step 7 recomputes b's 8 tokens plus its
    unprocessed 3rd output token (9 tokens) and b finishes in step 9.
    """
    sched = _scheduler(4, 4, 64, bulk=bulk)
    a, b = _request(0, 6, 6), _request(1, 6, 6)
    sched.add(a)
    sched.add(b)
    log = []
    while (plan := sched.schedule()) is not None:
        tokens = {c.request.request_id: c.num_new_tokens for c in plan.chunks}
        decodes = plan.num_bulk_decodes
        finished = sched.finish_step(plan)
        log.append((plan.step_id, tokens, decodes, [r.request_id for r in plan.preempted],
                    [r.request_id for r in finished]))
    if bulk:  # bulk decodes are counted, not listed: compare total tokens per step
        assert [(s, sum(t.values()) + d, p, f) for s, t, d, p, f in log] == [
            (1, 12, [], []), (2, 2, [], []), (3, 2, [], []), (4, 1, [1], []), (5, 1, [], []), (6, 1, [], [0]),
            (7, 9, [], []), (8, 1, [], []), (9, 1, [], [1])]
    else:
        assert [(s, t, p, f) for s, t, _, p, f in log] == [
            (1, {0: 6, 1: 6}, [], []), (2, {0: 1, 1: 1}, [], []), (3, {0: 1, 1: 1}, [], []),
            (4, {0: 1}, [1], []), (5, {0: 1}, [], []), (6, {0: 1}, [], [0]),
            (7, {1: 9}, [], []), (8, {1: 1}, [], []), (9, {1: 1}, [], [1])]
    assert (a.num_preemptions, a.recomputed_tokens) == (0, 0)
    assert (b.num_preemptions, b.recomputed_tokens) == (1, 8)
    assert sched.num_preemptions == 1 and sched.kv.num_free_blocks() == 4


def test_a_request_admitted_after_another_in_the_same_step_hits_its_prefix() -> None:
    """vLLM registers the full blocks a step will fill when it allocates them (`allocate_slots` ->
    `cache_blocks`), so a request admitted later in the same step hits a prompt scheduled before it
    (before 2026-12-02 blocks were indexed at the step's end and such a request recomputed them)."""
    from sim.engine.simulation import request_states
    from sim.workload.requests import UNIQUE_CONTENT_BASE, RequestSpec, Segment, prefix_content_id

    kv = KVCacheManager(num_blocks=100, block_size=16, enable_prefix_caching=True)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=1000, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0)
    specs = [RequestSpec(request_id=i, arrival_s=0.0, prompt_tokens=80, output_tokens=2, prefix_group=0,
                         segments=(Segment(content_id=prefix_content_id(0), num_tokens=64),
                                   Segment(content_id=UNIQUE_CONTENT_BASE + i, num_tokens=16))) for i in range(3)]
    for state in request_states(specs, kv):
        sched.add(state)
    plan = sched.schedule()
    assert plan is not None
    assert [(c.num_new_tokens, c.num_context_tokens) for c in plan.chunks] == [(80, 0), (16, 64), (16, 64)]
    assert plan.num_prefix_hit_tokens == 128
    # A whole run: 16 requests at once over 8 prefix groups; the second of each group hits.
    sc = scenario_from_dict(scenario_dict(workload={
        "num_prompts": 16, "request_rate": float("inf"), "random_input_len": 64, "random_output_len": 4,
        "random_range_ratio": 0.0, "random_prefix_len": 256, "num_prefix_groups": 8},
        perf={"tier": "roofline"}), source="test")
    records = sorted(simulate(sc).records, key=lambda r: r.request_id)
    assert [r.prefix_hit_tokens for r in records] == [0] * 8 + [256] * 8
    reference = simulate(sc, limits=SimLimits(bulk_decode=False))
    assert sorted(reference.records, key=lambda r: r.request_id) == records


def test_vllm_pads_a_captured_steps_tokens_to_the_next_capture_size() -> None:
    """vLLM runs a batch of at most the largest capture as the graph of the next capture size
    (`pad_for_cudagraph`: 1, 2, 4, every 8 below 256, every 16 above): 9 decodes run the 16-token
    graph, so the token part is priced at 16 (attention and sampling at 9); SGLang's profile is not
    padded here, nor a vLLM step above the largest capture."""
    from sim.engine.pricer import capture_ladder

    assert capture_ladder(512)[:5] == (1, 2, 4, 8, 16) and capture_ladder(512)[-2:] == (496, 512)
    assert capture_ladder(100)[-1] == 96  # vLLM's largest graph is the last size of the ladder

    def token_part(backend: str, n: int) -> float:
        sc = scenario_from_dict(scenario_dict(engine={"backend": backend}, perf={"tier": "roofline"}), source="t")
        pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params(backend))
        pricer.step_s(((), n, 512))
        parts, _ = pricer._key_parts[((), n, 512)]
        return parts[0].gpu_s + parts[0].comm_s

    assert token_part("vllm", 9) == token_part("vllm", 16) > token_part("vllm", 8)
    assert token_part("sglang", 9) < token_part("sglang", 16)
