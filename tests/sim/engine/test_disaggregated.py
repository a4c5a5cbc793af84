"""Disaggregated prefill/decode serving: scenario rules, transfer pricing, the event loop."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import check_feasible, load_engine_profile, simulate
from sim.engine.simulation import SimLimits
from sim.errors import ConfigError, InfeasibleScenario
from sim.serving.kv_cache import KVCacheManager
from sim.serving.kv_transfer import TransferPath, transfer_path
from sim.serving.request import RequestState
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict


def _disagg(prefill: dict[str, Any] | None = None, decode: dict[str, Any] | None = None,
            **sections: Any) -> Scenario:
    data = scenario_dict(**sections)
    data["disaggregation"] = {**data.get("disaggregation", {}),
                              "prefill": {"num_workers": 1, **(prefill or {})},
                              "decode": {"num_workers": 1, **(decode or {})}}
    return scenario_from_dict(data, source="t.toml")


def test_transfer_time_is_bytes_over_link_plus_latency() -> None:
    sc = _disagg()
    path = transfer_path(sc.disaggregation)  # type: ignore[arg-type]
    # Llama-3.1-8B bf16: 32 layers x K and V x 8 KV heads x 128 x 2 bytes per token.
    assert path.bytes_per_token == 32 * 2 * 8 * 128 * 2
    # Two single-GPU workers fit one 8-GPU H100 node: NVLink, 450 GB/s per GPU, 10 us.
    assert path.link_name == "nvlink"
    assert path.transfer_s(1000) == pytest.approx(1e-5 + 1000 * 131072 / 450e9)
    assert path.exposed_s(1000, prefill_span_s=1.0) == path.transfer_s(1000)  # nixl: nothing overlaps


def test_transfer_goes_inter_node_when_the_fleet_outgrows_a_node() -> None:
    sc = _disagg({"num_workers": 2, "engine": {"tensor_parallel_size": 4}}, {"engine": {"tensor_parallel_size": 2}})
    path = transfer_path(sc.disaggregation)  # type: ignore[arg-type]
    assert path.link_name == "inter_node"
    assert path.bandwidth_bytes_per_s == sc.hardware.inter_node_link.bandwidth_bytes_per_s
    # Decode TP2 ranks each receive 4 of the 8 KV heads, two links at once.
    assert path.bytes_per_token == 2 * (32 * 2 * 4 * 128 * 2)
    assert path.num_parallel_links == 2


def test_layerwise_transfer_exposes_only_the_last_layer_when_the_link_keeps_up() -> None:
    path = TransferPath(link_name="nvlink", bandwidth_bytes_per_s=1e9, latency_s=0.001, bytes_per_token=1000,
                        num_parallel_links=1, num_layers=10, layerwise=True)
    # 1000 tokens: 1 ms on the wire, 0.1 ms per layer; a 10 ms prefill hides all but the last layer.
    assert path.exposed_s(1000, prefill_span_s=0.010) == pytest.approx(0.001 + 0.0001)
    # A 1 ms prefill: layers leave every 0.1 ms; the link is the bottleneck: 1 ms - 0.9 ms hidden.
    assert path.exposed_s(1000, prefill_span_s=0.001) == pytest.approx(0.001 + 0.0001)
    # A 0.1 ms prefill hides 0.09 ms of the 1 ms.
    assert path.exposed_s(1000, prefill_span_s=0.0001) == pytest.approx(0.001 + 0.001 - 0.00009)


def test_pool_keys_override_the_base_engine() -> None:
    sc = _disagg({"num_workers": 3, "engine": {"max_num_batched_tokens": 16384}}, {"engine": {"max_num_seqs": 64}})
    d = sc.disaggregation
    assert d is not None
    assert d.prefill.num_workers == 3 and d.prefill.scenario.engine.max_num_batched_tokens == 16384
    assert d.decode.scenario.engine.max_num_seqs == 64
    assert d.decode.scenario.engine.max_num_batched_tokens == sc.engine.max_num_batched_tokens
    assert d.num_gpus() == 4


def test_mismatched_kv_layouts_are_rejected() -> None:
    with pytest.raises(ConfigError) as err:
        _disagg(decode={"engine": {"kv_cache_dtype": "fp8"}})
    assert err.value.key == "disaggregation.decode.engine.kv_cache_dtype"
    with pytest.raises(ConfigError) as err:
        _disagg(decode={"engine": {"block_size": 32}})
    assert err.value.key == "disaggregation.decode.engine.block_size"


def test_bad_pool_engine_key_is_named_with_its_pool() -> None:
    with pytest.raises(ConfigError) as err:
        _disagg(decode={"engine": {"tensor_parallel_size": 3}})
    assert err.value.key == "disaggregation.decode.engine.tensor_parallel_size"
    with pytest.raises(ConfigError) as err:
        _disagg(prefill={"num_workers": 0})
    assert err.value.key == "disaggregation.prefill.num_workers"


def test_decode_pool_that_cannot_hold_one_request_is_infeasible() -> None:
    sc = _disagg(decode={"engine": {"gpu_memory_utilization": 0.245}}, engine={"max_model_len": 65536},
                 workload={"random_input_len": 60000, "random_output_len": 16, "num_prompts": 1})
    with pytest.raises(InfeasibleScenario) as err:
        check_feasible(sc)
    assert err.value.key == "disaggregation.decode.engine.max_model_len"
    assert "decode pool" in err.value.rule


def test_one_request_ttft_is_prefill_plus_transfer_plus_first_decode_step() -> None:
    sc = _disagg(workload={"num_prompts": 1, "random_input_len": 1000, "random_output_len": 4,
                           "dataset_name": "fixed"},
                 engine={"api_server_latency_s": 0.0})  # engine times, as the step log's
    result = simulate(sc, max_step_events=100)
    (rec,) = result.records
    steps = sorted(result.steps, key=lambda s: s.start_s)
    prefill, first_decode = steps[0], steps[1]
    assert result.replica_pools[prefill.replica] == "prefill"
    assert result.replica_pools[first_decode.replica] == "decode"
    assert prefill.start_s == 0.0 and prefill.num_prefill_tokens == 1000
    transfer_s = transfer_path(sc.disaggregation).transfer_s(1000)  # type: ignore[arg-type]
    # The decode worker computes the last prompt token (context 999) and samples the first token.
    assert first_decode.start_s == pytest.approx(prefill.end_s + transfer_s, abs=1e-12)
    assert first_decode.num_prefill_tokens == 1
    assert rec.first_token_s == pytest.approx(prefill.end_s + transfer_s + first_decode.step_s, abs=1e-12)
    assert rec.output_tokens == 4 and rec.first_scheduled_s == 0.0
    assert result.transfer is not None and result.transfer.bytes_moved == 1000 * 131072
    decode_pool = result.pools[1]
    assert decode_pool.pool == "decode" and decode_pool.queue_delay_mean_s == 0.0
    assert result.summary.num_gpus == 2


def test_sglang_decode_worker_streams_the_prefills_token_when_it_admits_the_request() -> None:
    """SGLang's decode worker takes the token the prefill server sampled (its PrebuiltExtendBatch skips
    the forward): the first token streams at admission, and the worker runs one decode step fewer than
    vLLM's, which computes the last prompt token again to sample it."""
    workload = {"num_prompts": 1, "random_input_len": 1000, "random_output_len": 4, "dataset_name": "fixed"}
    runs = {}
    for backend in ("sglang", "vllm"):
        sc = _disagg(workload=workload, engine={"api_server_latency_s": 0.0, "backend": backend})
        result = simulate(sc, max_step_events=100)
        (rec,) = result.records
        steps = sorted(result.steps, key=lambda s: s.start_s)
        decode_steps = [st for st in steps if result.replica_pools[st.replica] == "decode"]
        transfer_s = transfer_path(sc.disaggregation).transfer_s(1000)  # type: ignore[arg-type]
        runs[backend] = (rec, steps[0], decode_steps, transfer_s, result)
    rec, prefill, decode_steps, transfer_s, result = runs["sglang"]
    assert rec.first_token_s == pytest.approx(prefill.end_s + transfer_s, abs=1e-12)
    assert sum(st.num_steps for st in decode_steps) == 3  # tokens 2..4; token 1 came from the prefill
    assert decode_steps[0].num_prefill_tokens == 0 and decode_steps[0].num_decodes == 1
    assert rec.output_tokens == 4 and rec.finish_s == pytest.approx(decode_steps[-1].end_s, abs=1e-12)
    assert result.summary.itl_mean_s == pytest.approx(result.summary.tpot_mean_s)
    vllm_rec, vllm_prefill, vllm_decodes, vllm_transfer_s, _ = runs["vllm"]
    assert sum(st.num_steps for st in vllm_decodes) == 4
    assert vllm_rec.first_token_s == pytest.approx(vllm_prefill.end_s + vllm_transfer_s + vllm_decodes[0].step_s,
                                                   abs=1e-12)


def test_trtllm_generation_server_streams_the_prefills_token_with_its_first_steps_token() -> None:
    """TensorRT-LLM's generation server adds the token the context server sampled to the request when
    the KV transfer completes and runs one step fewer than vLLM's; the client gets that token in the
    generation server's first response, after its first step, together with the step's token (the
    disaggregated server streams only the generation server's responses). So TTFT has the first
    decode step in it, as vLLM's, and the first chunk holds two tokens: no ITL gap between them."""
    workload = {"num_prompts": 1, "random_input_len": 1000, "random_output_len": 4, "dataset_name": "fixed"}
    sc = _disagg(workload=workload, engine={"api_server_latency_s": 0.0, "backend": "trtllm"})
    result = simulate(sc, max_step_events=100)
    (rec,) = result.records
    steps = sorted(result.steps, key=lambda s: s.start_s)
    decode_steps = [st for st in steps if result.replica_pools[st.replica] == "decode"]
    transfer_s = transfer_path(sc.disaggregation).transfer_s(1000)  # type: ignore[arg-type]
    assert sum(st.num_steps for st in decode_steps) == 3  # tokens 2..4; token 1 came from the prefill
    assert decode_steps[0].num_prefill_tokens == 0 and decode_steps[0].num_decodes == 1
    assert rec.first_token_s == pytest.approx(steps[0].end_s + transfer_s + decode_steps[0].step_s, abs=1e-12)
    assert rec.output_tokens == 4 and rec.finish_s == pytest.approx(decode_steps[-1].end_s, abs=1e-12)
    # Tokens 3 and 4 each come one step after the chunk before: two gaps over three tokens after the first.
    assert result.summary.itl_mean_s == pytest.approx(decode_steps[-1].step_s, rel=0.05)
    assert result.summary.tpot_mean_s == pytest.approx((rec.finish_s - rec.first_token_s) / 3, abs=1e-12)


def test_disaggregated_runs_are_deterministic_and_complete() -> None:
    sc = _disagg({"num_workers": 2}, {"num_workers": 2, "engine": {"max_num_seqs": 8}},
                 workload={"num_prompts": 60, "request_rate": 50.0, "random_input_len": 512, "random_output_len": 32})
    a, b = simulate(sc), simulate(sc)
    assert a.summary == b.summary and a.records == b.records
    assert a.summary.num_completed == 60 and not a.summary.truncated
    assert {p.pool for p in a.pools} == {"prefill", "decode"}
    assert all(0 < p.utilization_frac <= 1 for p in a.pools)
    assert not math.isnan(a.summary.tpot_median_s)


def test_transferred_request_is_admitted_without_prefill_compute() -> None:
    kv = KVCacheManager(num_blocks=100, block_size=16, enable_prefix_caching=True)
    sched = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=64, enable_chunked_prefill=True,
                            long_prefill_token_threshold=0)
    req = RequestState(request_id=7, prompt_tokens=1000, output_tokens=3, arrival_s=0.0, keys=())
    sched.add_transferred(req)
    plan = sched.schedule()
    assert plan is not None
    (chunk,) = plan.chunks
    assert (chunk.num_new_tokens, chunk.num_context_tokens, chunk.samples) == (1, 999, True)
    assert kv.num_blocks - kv.num_free_blocks() == 63  # ceil(1000 / 16) blocks for the whole prompt
    assert kv.num_prefix_queries_tokens == 0  # not a prefix-cache lookup


def test_aggregated_scenario_has_no_pools() -> None:
    sc = scenario_from_dict(scenario_dict(), source="t.toml")
    assert sc.disaggregation is None
    result = simulate(sc)
    assert result.pools == () and result.transfer is None


def test_moe_decode_pool_of_attention_dp_ranks_takes_transferred_requests() -> None:
    # Mixtral decode workers with attention DP2: arriving KV goes to one of the workers' ranks.
    sc = _disagg({"engine": {"tensor_parallel_size": 2}},
                 {"engine": {"tensor_parallel_size": 1, "data_parallel_size": 2, "enable_expert_parallel": True}},
                 model={"name": "mistralai/Mixtral-8x7B-v0.1"},
                 workload={"num_prompts": 12, "random_input_len": 256, "random_output_len": 16, "request_rate": 50.0})
    result = simulate(sc)
    assert result.summary.num_completed == 12 and not result.summary.truncated


def test_moe_decode_worker_with_attention_dp_steps_its_ranks_in_lockstep(tmp_path: Path) -> None:
    # Qwen3-30B-A3B, two 1-GPU prefill workers, one decode worker of 2 attention-DP ranks (EP).
    # Requests A (8 outputs) and B (4 outputs), same 64-token prompt, both sent at 0: they prefill
    # side by side and their KV arrives at the same instant. A reaches the decode worker first and
    # goes to rank 0, whose group step starts at once; B goes to rank 1 (4 x waiting + running:
    # 4 vs 0) and waits for the group's next step, as vLLM's DP ranks meet at every MoE layer.
    trace = tmp_path / "trace.csv"
    trace.write_text("input_tokens,output_tokens,arrival_s,prefix_group,prefix_tokens\n"
                     "64,8,0,-1,0\n64,4,0,-1,0\n")
    sc = _disagg({"num_workers": 2},
                 {"engine": {"data_parallel_size": 2, "enable_expert_parallel": True}},
                 model={"name": "Qwen/Qwen3-30B-A3B"}, engine={"api_server_latency_s": 0.0},
                 workload={"dataset_name": "trace", "dataset_path": str(trace), "num_prompts": 2})
    result = simulate(sc, max_step_events=100)
    a, b = sorted(result.records, key=lambda r: r.request_id)
    decode_steps = sorted((s for s in result.steps if result.replica_pools[s.replica] == "decode"),
                          key=lambda s: s.start_s)
    # One decode replica (the worker's group, index 2 after the two prefill ranks), and 8 group
    # steps: A's 8 with B's 4 inside them (rank 1 runs a dummy batch in step 1 and steps 6-8), not
    # 8 + 4 steps of two independent ranks.
    assert result.replica_pools == ("prefill", "prefill", "decode")
    assert {s.replica for s in decode_steps} == {2} and (a.replica, b.replica) == (2, 2)
    # The log merges equal consecutive steps (`num_steps`); group steps run back to back.
    ends = [s.start_s + (k + 1) * s.step_s for s in decode_steps for k in range(s.num_steps)]
    assert len(ends) == 8
    assert all(nxt.start_s == pytest.approx(cur.end_s, abs=1e-12) for cur, nxt in itertools.pairwise(decode_steps))
    assert a.first_token_s == ends[0] and a.finish_s == pytest.approx(ends[7], abs=1e-12)
    # B's first step is the group's second, its last the fifth.
    assert b.first_token_s == ends[1] and b.finish_s == pytest.approx(ends[4], abs=1e-12)
    assert decode_steps[1].num_prefill_tokens == 1 and decode_steps[1].num_decodes == 1
    # Utilisation counts a group step on both ranks: 8 steps x 2 ranks over 2 ranks x duration.
    decode_pool = result.pools[1]
    busy_s = sum(s.step_s * s.num_steps for s in decode_steps)
    assert decode_pool.num_ranks == 2
    assert decode_pool.utilization_frac == pytest.approx(busy_s / result.summary.duration_s)


@pytest.mark.parametrize("backend", ["vllm", "sglang", "trtllm"])
def test_disaggregated_bulk_decodes_give_the_reference_results(backend: str) -> None:
    """Decode workers run their decodes in bulk (under SGLang they sit out the 1-token prefill-only
    steps of transferred requests); a tight KV cache makes them preempt. Same results as the
    request-by-request path."""
    sc = _disagg({"num_workers": 1}, {"num_workers": 2, "engine": {"gpu_memory_utilization": 0.25}},
                 engine={"backend": backend},
                 workload={"num_prompts": 120, "max_concurrency": 96, "random_input_len": 2000,
                           "random_output_len": 200, "random_range_ratio": 0.5})
    bulk, ref = simulate(sc, limits=SimLimits(bulk_decode=True)), simulate(sc, limits=SimLimits(bulk_decode=False))
    assert bulk.records == ref.records and bulk.summary == ref.summary
    assert bulk.summary.num_completed == 120
    # TensorRT-LLM reserves each request's whole output (GUARANTEED_NO_EVICT): it never preempts.
    assert (bulk.summary.num_preemptions > 0) is (backend != "trtllm")


def test_disaggregated_attention_dp_decode_workers_bulk_steps_give_the_reference_results() -> None:
    """Two decode workers of two attention-DP ranks each run their group steps in bulk between
    transfers; the same results as stepping every rank's requests one by one."""
    sc = _disagg({"num_workers": 2}, {"num_workers": 2, "engine": {"data_parallel_size": 2,
                                                                   "enable_expert_parallel": True}},
                 model={"name": "Qwen/Qwen3-30B-A3B"},
                 workload={"num_prompts": 100, "request_rate": 20.0, "random_input_len": 600,
                           "random_output_len": 120, "random_range_ratio": 0.5})
    bulk, ref = simulate(sc, limits=SimLimits(bulk_decode=True)), simulate(sc, limits=SimLimits(bulk_decode=False))
    assert bulk.records == ref.records and bulk.summary == ref.summary and bulk.kv_usage == ref.kv_usage
    assert bulk.summary.num_completed == 100


def test_traffic_classes_are_summarised_in_a_disaggregated_run() -> None:
    """Per-class summaries, as an aggregated run of the same workload gives them (before 0.6.2 a
    disaggregated run dropped them)."""
    classes = [{"name": "chat", "share": 0.7, "input_len": 256, "output_len": 32, "range_ratio": 0.5, "ttft_s": 0.5},
               {"name": "rag", "share": 0.3, "input_len": 2000, "output_len": 16, "range_ratio": 0.3, "ttft_s": 2.0}]
    workload = {"num_prompts": 40, "request_rate": 20.0, "classes": classes}
    data = scenario_dict(workload=workload)
    for key in ("random_input_len", "random_output_len"):
        data["workload"].pop(key)
    aggregated = simulate(scenario_from_dict(data, source="a.toml"))
    result = simulate(scenario_from_dict({**data, "disaggregation": {"prefill": {"num_workers": 1},
                                                                     "decode": {"num_workers": 1}}}, source="d.toml"))
    assert [(c.name, c.num_requests) for c in result.classes] == [(c.name, c.num_requests) for c in aggregated.classes]
    assert sum(c.num_completed for c in result.classes) == result.summary.num_completed == 40


def test_a_given_engine_profile_prices_the_pools_of_its_backend() -> None:
    """`simulate(profile=P)` (how `validate --fit-profiles` scores a candidate) applies to a
    disaggregated run's pools as to an aggregated run (before 0.6.2 the pools kept the shipped
    profile whatever was given)."""
    shipped = load_engine_profile("vllm")
    slower = dataclasses.replace(shipped, host=dataclasses.replace(
        shipped.host, api_server_latency_s=shipped.host.api_server_latency_s + 0.010))
    sc = _disagg(workload={"num_prompts": 20, "request_rate": 10.0, "random_input_len": 512, "random_output_len": 32})
    base, candidate = simulate(sc), simulate(sc, profile=slower)
    assert candidate.api_server_latency_s == pytest.approx(base.api_server_latency_s + 0.010)
    assert candidate.summary.ttft_mean_s == pytest.approx(base.summary.ttft_mean_s + 0.010, rel=1e-9)
    assert simulate(sc, profile=shipped).records == base.records


def test_prefix_aware_routing_sees_every_rank_of_a_lockstep_worker(tmp_path: Path) -> None:
    """Two prefill workers of two attention-DP ranks each: a request whose prefix is cached on
    worker 1's rank 1 goes there and hits it, as a KV-aware router picks worker and DP rank
    together (before 0.6.2 the router read only each worker's rank 0 and the hit was lost)."""
    rows = ["input_tokens,output_tokens,arrival_s,prefix_group,prefix_tokens",
            "1100,4,0.0,0,1024", "1100,4,0.0001,1,1024", "1100,4,0.0002,2,1024", "1100,4,0.0003,3,1024",
            "6000,4,5.0,-1,0", "6000,4,5.0001,-1,0", "1100,4,5.0002,3,1024"]
    path = tmp_path / "trace.csv"
    path.write_text("\n".join(rows) + "\n")
    sc = _disagg({"num_workers": 2, "engine": {"data_parallel_size": 2, "enable_expert_parallel": True,
                                              "router": "prefix_aware", "enable_prefix_caching": True}},
                 {"num_workers": 1}, model={"name": "Qwen/Qwen3-30B-A3B"}, engine={"max_model_len": 8192},
                 workload={"dataset_name": "trace", "dataset_path": str(path), "num_prompts": len(rows) - 1})
    result = simulate(sc)
    again = next(r for r in result.records if r.request_id == 6)
    assert again.prefix_hit_tokens == 1024


def test_prefix_aware_routing_spreads_a_shared_prefix_over_a_lockstep_engines_ranks() -> None:
    """An aggregated MoE engine of 4 attention-DP ranks, every prompt behind one system prompt: the
    rank that cached it first had the longest hit for every later request, and `prefix_aware` sent
    all of them to it (ties went to the lowest rank, load was never read) while 3 ranks idled. Ties
    now go to the least outstanding rank, and imbalanced ranks to the group's load balancer."""
    sc = scenario_from_dict(scenario_dict(
        model={"name": "Qwen/Qwen3-30B-A3B"},
        engine={"data_parallel_size": 4, "enable_expert_parallel": True, "router": "prefix_aware"},
        workload={"num_prompts": 200, "request_rate": 100.0, "random_input_len": 128, "random_output_len": 64,
                  "random_prefix_len": 512}), source="t")
    counts = [0] * 4
    for record in simulate(sc).records:
        counts[record.replica] += 1
    assert min(counts) >= 25, counts


def test_the_prefill_pool_reports_the_kv_its_steps_held() -> None:
    """A prefill pool frees a prompt's blocks as its prefill ends, so its KV usage is sampled while
    each step ran (before 0.6.2 it was sampled after the release: always 0 for one-step prompts)."""
    result = simulate(_disagg(workload={"num_prompts": 40, "request_rate": 20.0, "random_input_len": 1024,
                                        "random_output_len": 16}))
    prefill = next(p for p in result.pools if p.pool == "prefill")
    assert prefill.kv_usage_max_frac > 0 and prefill.kv_usage_mean_frac > 0


def test_forced_nvlink_is_refused_between_different_gpus() -> None:
    """NVLink joins the GPUs of one system: an H100 prefill pool and a B200 decode pool cannot share
    it (it was accepted and priced at the decode GPU's 900 GB/s NVLink 5, 2x an H100's own link)."""
    data = scenario_dict()
    data["disaggregation"] = {"transfer_link": "nvlink", "prefill": {"num_workers": 1},
                              "decode": {"num_workers": 1, "hardware": "b200_sxm"}}
    with pytest.raises(ConfigError) as exc:
        scenario_from_dict(data, source="t.toml")
    assert exc.value.key == "disaggregation.transfer_link"


def test_forced_nvlink_is_refused_when_no_pair_fits_one_domain() -> None:
    """A TP8 prefill worker and a TP8 decode worker on 8-GPU HGX nodes never share a node's NVLink."""
    data = scenario_dict()
    data["disaggregation"] = {"transfer_link": "nvlink",
                              "prefill": {"num_workers": 1, "engine": {"tensor_parallel_size": 8}},
                              "decode": {"num_workers": 1, "engine": {"tensor_parallel_size": 8}}}
    with pytest.raises(ConfigError) as exc:
        scenario_from_dict(data, source="t.toml")
    assert exc.value.key == "disaggregation.transfer_link"
    # A pair that fits a node may force NVLink even though the whole fleet does not (docs/disaggregation.md).
    data["disaggregation"] = {"transfer_link": "nvlink",
                              "prefill": {"num_workers": 4, "engine": {"tensor_parallel_size": 4}},
                              "decode": {"num_workers": 2, "engine": {"tensor_parallel_size": 4}}}
    path = transfer_path(scenario_from_dict(data, source="t.toml").disaggregation)  # type: ignore[arg-type]
    assert path.link_name == "nvlink"


def test_transfer_bytes_under_decode_pipeline_parallelism_are_the_models_layers() -> None:
    """A decode worker's stages hold the model's layers between them: DeepSeek-R1's 61 layers on 2 or 4
    stages move 61 layers' latent rows per attention-TP rank (ceil(61 / PP) per stage times PP
    counted 62 or 64 layers)."""
    from sim.api import load_scenario
    base = Path(__file__).resolve().parents[3] / "scenarios" / "deepseek_r1-h200-disagg-4p8d.toml"
    for pp in (1, 2, 4):
        sc = load_scenario(base, {"disaggregation.decode.engine.data_parallel_size": 1,
                                  "disaggregation.decode.engine.tensor_parallel_size": 8 // pp,
                                  "disaggregation.decode.engine.pipeline_parallel_size": pp})
        assert sc.disaggregation is not None
        assert transfer_path(sc.disaggregation).bytes_per_token == 61 * 576 * (8 // pp)


def test_pools_of_different_engines_are_refused() -> None:
    """A vLLM prefill pool cannot hand its KV to SGLang decoders (it was accepted)."""
    data = scenario_dict()
    data["disaggregation"] = {"prefill": {"num_workers": 1},
                              "decode": {"num_workers": 1, "engine": {"backend": "sglang"}}}
    with pytest.raises(ConfigError) as exc:
        scenario_from_dict(data, source="t.toml")
    assert exc.value.key == "disaggregation.decode.engine.backend" and exc.value.value == "sglang"


def test_an_unknown_decode_router_name_is_refused() -> None:
    """`Simulation` refuses an unknown router for the pool it routes (the prefill pool); the decode
    pool's router is routed by the same `_route_in` and is refused as well, not routed as
    least_outstanding."""
    from typing import cast

    from sim.engine.disaggregated import DisaggregatedSimulation

    with pytest.raises(ValueError, match="decode_router='least_loaded'"):
        DisaggregatedSimulation(prefill=[], decode=[], prefill_pricer=cast(Any, None), decode_pricer=cast(Any, None),
                                prefill_router="round_robin", decode_router=cast(Any, "least_loaded"),
                                path=cast(Any, None), decode_states=[], max_concurrency=None, limits=SimLimits())
