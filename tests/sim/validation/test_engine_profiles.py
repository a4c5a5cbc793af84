"""Engine profiles: shipped TOMLs load, and the two scheduler policies behave as documented."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest
from conftest import MEASURED_DATA, scenario_dict

from sim.api import load_engine_profile, load_host_params, simulate, step_graph
from sim.errors import ConfigError
from sim.graph.batch import BatchShape, PrefillChunk
from sim.measured import open_text, resolve
from sim.perf.profile import SchedulingPolicy
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import scenario_from_dict
from sim.validation.fit import host_params, profile_toml


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_shipped_profiles_load_and_host_params_match(backend: str) -> None:
    profile = load_engine_profile(backend)
    assert profile.backend == backend
    assert load_host_params(backend) == profile.host


def test_policies_per_backend() -> None:
    assert load_engine_profile("vllm").policy == SchedulingPolicy()
    assert load_engine_profile("sglang").policy.prefill_priority
    assert load_engine_profile("trtllm").policy.reserve_full_output


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_profile_toml_round_trips(tmp_path: Path, backend: str) -> None:
    profile = load_engine_profile(backend)
    path = tmp_path / "p.toml"
    path.write_text(profile_toml(profile, header="test"))
    assert load_engine_profile(backend, path) == profile


def test_a_host_fit_keeps_the_profiles_launch_behaviour() -> None:
    sglang = load_engine_profile("sglang").host
    fitted = host_params(1e-4, 1e-6, 2e-5, like=sglang, source="test")
    assert (fitted.eager_launch_s, fitted.uncaptured_launch) == (sglang.eager_launch_s, "eager")


def _req(rid: int, prompt: int, output: int) -> RequestState:
    return RequestState(request_id=rid, prompt_tokens=prompt, output_tokens=output, arrival_s=0.0, keys=())


def _sched(num_blocks: int, **policy: bool) -> VllmV1Scheduler:
    kv = KVCacheManager(num_blocks=num_blocks, block_size=4, enable_prefix_caching=False)
    return VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=True,
                           long_prefill_token_threshold=0, **policy)


def _run_prefill(sched: VllmV1Scheduler) -> None:
    plan = sched.schedule()
    assert plan is not None
    sched.finish_step(plan)


@pytest.mark.parametrize("bulk_decodes", [False, True])
def test_prefill_priority_runs_a_waiting_prompt_alone_and_decodes_wait(bulk_decodes: bool) -> None:
    sched = _sched(100, prefill_priority=True, bulk_decodes=bulk_decodes)
    sched.add(_req(0, 8, 5))
    _run_prefill(sched)  # request 0 now decodes
    sched.add(_req(1, 12, 5))
    plan = sched.schedule()
    assert plan is not None
    assert [(c.request.request_id, c.num_new_tokens) for c in plan.chunks] == [(1, 12)]
    assert plan.num_bulk_decodes == 0  # request 0 waits
    sched.finish_step(plan)
    plan = sched.schedule()  # nothing left to prefill: both decode
    assert plan is not None
    if bulk_decodes:  # counted, not listed; request 0 last sampled two steps ago (step 1)
        assert (plan.chunks, plan.num_bulk_decodes, plan.waited_bulk) == ((), 2, ((1, 1),))
    else:
        assert sorted((c.request.request_id, c.num_new_tokens) for c in plan.chunks) == [(0, 1), (1, 1)]


def test_without_prefill_priority_the_decode_and_the_prompt_share_a_step() -> None:
    sched = _sched(100)
    sched.add(_req(0, 8, 5))
    _run_prefill(sched)
    sched.add(_req(1, 12, 5))
    plan = sched.schedule()
    assert plan is not None
    # Request 0 decodes in bulk (counted, not listed) next to request 1's whole prompt.
    assert [(c.request.request_id, c.num_new_tokens) for c in plan.chunks] == [(1, 12)]
    assert plan.num_bulk_decodes == 1
    assert plan.num_batched_tokens() == 13


def test_reserve_full_output_waits_for_room_for_every_output_token() -> None:
    # 10 blocks of 4 tokens. Request 0 needs (8 + 16) / 4 = 6 blocks at full length, request 1
    # (8 + 20) / 4 = 7: 6 + 7 > 10, so 1 waits although its prompt (2 blocks) would fit now.
    sched = _sched(10, reserve_full_output=True)
    sched.add(_req(0, 8, 16))
    sched.add(_req(1, 8, 20))
    plan = sched.schedule()
    assert plan is not None
    assert [c.request.request_id for c in plan.chunks] == [0]
    while plan is not None and not any(c.request.request_id == 1 for c in plan.chunks):
        sched.finish_step(plan)
        plan = sched.schedule()
    assert plan is not None  # admitted once request 0 finished and freed its reservation
    assert sched.num_preemptions == 0


@pytest.mark.parametrize("bulk_decodes", [False, True])
def test_reserve_full_output_counts_a_shared_prefix_once(bulk_decodes: bool) -> None:
    """TensorRT-LLM's GUARANTEED_NO_EVICT reserves what each request still needs: a running request's
    full-length blocks less those it holds (`getRemainingBlocksToCompletion`), shared prefix blocks
    included, and a new request's less the blocks of its prefix hit that running requests hold. 24
    blocks of 4 tokens; every request has the same 32-token prefix (8 blocks), 4 tokens of its own
    and 8 outputs: 11 blocks at full length, of which 3 are its own. Counting the prefix once per
    request admits 2 (33 > 24); counting it once, 5 (8 + 5 x 3 = 23 <= 24), and nothing is preempted."""
    kv = KVCacheManager(num_blocks=24, block_size=4, enable_prefix_caching=True)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0, reserve_full_output=True, bulk_decodes=bulk_decodes)
    prefix_keys = tuple(range(1000, 1008))
    for rid in range(8):
        sched.add(RequestState(request_id=rid, prompt_tokens=36, output_tokens=8, arrival_s=0.0, keys=prefix_keys))
    most = 0
    plan = sched.schedule()
    while plan is not None:
        most = max(most, sched.num_running())
        sched.finish_step(plan)
        plan = sched.schedule()
    assert most == 5
    assert sched.num_preemptions == 0 and sched.num_outstanding() == 0


def test_vllm_policy_admits_both_and_preempts_when_blocks_run_out() -> None:
    # Both grow one token per step; at 8 + 13 tokens each needs 6 blocks: 12 > 10.
    sched = _sched(10)
    sched.add(_req(0, 8, 16))
    sched.add(_req(1, 8, 20))
    plan = sched.schedule()
    assert plan is not None
    assert [c.request.request_id for c in plan.chunks] == [0, 1]
    while plan is not None:
        sched.finish_step(plan)
        plan = sched.schedule()
    assert sched.num_preemptions > 0


def test_simulate_selects_the_profile_from_the_backend() -> None:
    d = scenario_dict(engine={"backend": "sglang"},
                      workload={"num_prompts": 12, "random_input_len": 512, "random_output_len": 64,
                                "request_rate": 20.0})
    sc = scenario_from_dict(d, source="t")
    default = simulate(sc).summary
    assert default == simulate(sc, profile=load_engine_profile("sglang")).summary
    assert default != simulate(sc, profile=load_engine_profile("vllm")).summary


@pytest.mark.parametrize(("version", "expected"), [("0.12.0", False), ("0.11.2", False), ("0.14.0", True),
                                                   ("v0.19.0-cu130", True), ("nightly-5b8c30d", True)])
def test_vllm_async_scheduling_is_on_by_default_from_0_14(version: str, expected: bool) -> None:
    assert load_engine_profile("vllm").defaults.async_for(version) is expected


def _wait_sched(iters: int, ratio: float) -> VllmV1Scheduler:
    kv = KVCacheManager(num_blocks=100, block_size=4, enable_prefix_caching=False)
    return VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=True,
                           long_prefill_token_threshold=0, batch_wait_timeout_iters=iters,
                           batch_wait_max_tokens_ratio=ratio)


def _steps_until_admitted(sched: VllmV1Scheduler, rid: int) -> int:
    """Steps planned (and run) before the one that admits request `rid`."""
    held = 0
    while True:
        plan = sched.schedule()
        assert plan is not None
        if any(c.request.request_id == rid for c in plan.chunks):
            sched.finish_step(plan)
            return held
        held += 1
        sched.finish_step(plan)


def test_batch_waiting_holds_a_prompt_for_the_timeout_while_decodes_run() -> None:
    # TRT-LLM PyExecutor._waiting_requests: 8 prompt + 1 decode tokens < 0.9 x 64, so request 1 is
    # held for exactly `batch_wait_timeout_iters` = 3 steps, then admitted.
    sched = _wait_sched(3, 0.9)
    sched.add(_req(0, 8, 20))
    _run_prefill(sched)  # nothing decodes yet: request 0 is not held
    sched.add(_req(1, 8, 5))
    assert _steps_until_admitted(sched, 1) == 3
    # The counter restarts after a release: the next prompt is held 3 steps again.
    sched.add(_req(2, 8, 5))
    assert _steps_until_admitted(sched, 2) == 3


def test_batch_waiting_releases_at_once_when_the_token_ratio_is_reached() -> None:
    # 60 prompt tokens + 1 decode >= 0.9 x 64 = 57.6: admitted in the first step.
    sched = _wait_sched(3, 0.9)
    sched.add(_req(0, 8, 20))
    _run_prefill(sched)
    sched.add(_req(1, 60, 5))
    assert _steps_until_admitted(sched, 1) == 0


@pytest.mark.parametrize(("iters", "ratio"), [(0, 0.9), (3, 0.0)])
def test_batch_waiting_needs_both_knobs_as_in_trtllm(iters: int, ratio: float) -> None:
    # TRT-LLM stops waiting when count >= timeout or tokens >= ratio x max_num_tokens: either at 0 never waits.
    sched = _wait_sched(iters, ratio)
    sched.add(_req(0, 8, 20))
    _run_prefill(sched)
    sched.add(_req(1, 8, 5))
    assert _steps_until_admitted(sched, 1) == 0


def test_batch_waiting_raises_ttft_in_a_trtllm_run_and_is_rejected_on_other_backends() -> None:
    wl = {"num_prompts": 16, "random_input_len": 512, "random_output_len": 64, "max_concurrency": 4}
    base = scenario_from_dict(scenario_dict(engine={"backend": "trtllm"}, workload=wl), source="t")
    waited = base.with_overrides({"engine.batch_wait_timeout_iters": 20, "engine.batch_wait_max_tokens_ratio": 0.9})
    plain, held = simulate(base).summary, simulate(waited).summary
    # 12 of 16 requests arrive while others decode and wait ~20 decode steps (the first 4 are not held).
    assert held.ttft_mean_s > plain.ttft_mean_s + 5 * plain.tpot_mean_s
    with pytest.raises(ConfigError, match="backend"):
        scenario_from_dict(scenario_dict(engine={"backend": "vllm", "batch_wait_timeout_iters": 20,
                                                 "batch_wait_max_tokens_ratio": 0.9}), source="t")


def test_sglang_eager_launch_cost_is_its_attention_modules_eager_floor_per_simulated_kernel() -> None:
    # The shipped number is a measurement (docs/serving.md): the median small-work latency of SGLang's
    # MLA attention module (h100 and h200 tables: batch <= 2, seq_len <= 128), spread over the
    # kernels the simulator builds for that module (from the q/kv projections through o_proj).
    floors = []
    for gpu in ("h100_sxm", "h200_sxm"):
        with open_text(resolve(MEASURED_DATA / "aiconfigurator" / gpu / "mla_module_context.csv")) as f:
            floors += [float(r["latency_ms"]) * 1e-3 for r in csv.DictReader(f)
                       if r["backend"] == "sglang" and int(r["batch_size"]) <= 2 and int(r["seq_len"]) <= 128]
    sc = scenario_from_dict(scenario_dict(hardware={"name": "h200_sxm"}, model={"name": "deepseek-ai/DeepSeek-R1"},
                                          engine={"backend": "sglang", "max_model_len": 4096,
                                                  "tensor_parallel_size": 8}), source="t.toml")
    names = [n.work.name for n in step_graph(sc, BatchShape(prefills=(PrefillChunk(new_tokens=64),))).nodes]
    module_kernels = names.index("o_proj") - names.index("input_layernorm")
    assert len(floors) == 252 and module_kernels == 8
    assert load_engine_profile("sglang").host.eager_launch_s == pytest.approx(
        statistics.median(floors) / module_kernels, rel=1e-9)
