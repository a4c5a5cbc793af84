"""Speculative decoding: acceptance, token accounting, step pricing, configuration rules."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from conftest import REPO, scenario_dict

from sim.api import (
    load_host_params,
    load_scenario,
    scenario_efficiency,
    scenario_memory,
    simulate,
    vllm_drops_last_hit_block,
    vllm_lookahead_tokens,
)
from sim.engine.pricer import NGRAM_LOOKUP_S_PER_REQUEST, StepPricer
from sim.errors import ConfigError, InfeasibleScenario
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, gemm_work
from sim.graph.mla import verify_nodes
from sim.graph.transformer import build_step_graph, is_attention_work, prefill_attention_nodes
from sim.perf.host import host_cost, step_time_s
from sim.perf.step import StepCostModel
from sim.serde import parse_override
from sim.serving.kv_cache import KVCacheManager
from sim.serving.request import RequestState
from sim.serving.speculative import AcceptanceSampler
from sim.serving.vllm_v1 import VllmV1Scheduler
from sim.specs.scenario import Scenario, scenario_from_dict
from sim.specs.speculative import acceptance_rates, constant_rate_for_length, mean_acceptance_length


def _scenario(spec: dict[str, Any] | None, **sections: dict[str, Any]) -> Scenario:
    engine = dict(sections.pop("engine", {}))
    if spec is not None:
        engine["speculative_config"] = spec
    perf = {"tier": "roofline"}
    return scenario_from_dict(scenario_dict(engine=engine, perf=perf, **sections), source="test")


EAGLE3_K2 = {"method": "eagle3", "num_speculative_tokens": 2, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}

# -- acceptance ---------------------------------------------------------------------------------


def test_mean_acceptance_length_by_hand() -> None:
    assert mean_acceptance_length((1.0, 0.0)) == 2.0
    assert mean_acceptance_length((0.5, 0.5)) == 1.0 + 0.5 + 0.25
    r = constant_rate_for_length(2.5, 3)
    assert mean_acceptance_length((r,) * 3) == pytest.approx(2.5, abs=1e-12)
    assert acceptance_rates("eagle3", 4, (0.9, 0.5), None) == (0.9, 0.5, 0.5, 0.5)  # last entry repeats
    assert acceptance_rates("mtp", 2, None, None) == (0.875, 0.875)


def test_sampler_rates_one_zero_accept_exactly_one() -> None:
    sampler = AcceptanceSampler((1.0, 0.0), seed=3)
    assert [sampler.accepted(7, 2) for _ in range(600)] == [1] * 600
    always = AcceptanceSampler((1.0, 1.0, 1.0), seed=3)
    assert always.accepted(1, 3) == 3
    assert always.accepted(1, 2) == 2  # drafts cut by the token budget cap the accepted count


def test_sampler_is_seeded_per_request_and_matches_the_rates() -> None:
    rates = (0.8, 0.5)
    a, b = AcceptanceSampler(rates, seed=11), AcceptanceSampler(rates, seed=11)
    # Order of requests does not matter: each request has its own stream.
    first = [a.accepted(1, 2) for _ in range(300)] + [a.accepted(2, 2) for _ in range(300)]
    second_2 = [b.accepted(2, 2) for _ in range(300)]
    second_1 = [b.accepted(1, 2) for _ in range(300)]
    assert first == second_1 + second_2
    assert [AcceptanceSampler(rates, seed=12).accepted(1, 2) for _ in range(300)] != first[:300]
    draws = [a.accepted(5, 2) for _ in range(20_000)]
    assert sum(d >= 1 for d in draws) / len(draws) == pytest.approx(0.8, abs=0.02)
    assert sum(d == 2 for d in draws) / len(draws) == pytest.approx(0.4, abs=0.02)


# -- token accounting and TPOT ------------------------------------------------------------------


def _one_request(spec: dict[str, Any] | None, rates: list[float] | None, output: int) -> tuple[Scenario, Any]:
    workload: dict[str, Any] = {"num_prompts": 1, "random_input_len": 128, "random_output_len": output,
                                "dataset_name": "fixed"}
    if rates is not None:
        workload["spec_acceptance_rates"] = rates
    sc = _scenario(spec, workload=workload)
    return sc, simulate(sc, max_step_events=100)


def test_k2_rates_one_zero_emit_two_tokens_per_step() -> None:
    _, result = _one_request(EAGLE3_K2, [1.0, 0.0], output=9)
    # Prefill samples token 1; each verification emits 2 (one accepted draft + the bonus token).
    assert result.summary.num_steps == 1 + 4
    assert result.records[0].output_tokens == 9
    verify_steps = [s for s in result.steps if s.num_prefill_tokens == 0]
    assert sum(s.num_steps for s in verify_steps) == 4
    step_s = verify_steps[0].step_s
    assert all(s.step_s == step_s for s in verify_steps)
    # TPOT = (finish - first token) / (outputs - 1) = 4 steps / 8 tokens.
    assert result.summary.tpot_mean_s == pytest.approx(4 * step_s / 8, rel=1e-12)
    # One streamed chunk per step: ITL is the step time (vllm bench serve records chunk gaps).
    assert result.summary.itl_mean_s == pytest.approx(step_s, rel=1e-12)


def test_rates_one_emit_k_plus_one_and_output_is_capped() -> None:
    spec = {**EAGLE3_K2, "num_speculative_tokens": 3}
    _, result = _one_request(spec, [1.0], output=10)
    # 1 from the prefill, then 4 + 4 + 1 (the last step's accepted tokens are cut at max_tokens).
    assert result.summary.num_steps == 1 + 3
    assert result.records[0].output_tokens == 10


def test_verification_step_prices_k_plus_one_tokens_and_the_drafter() -> None:
    sc = _scenario(EAGLE3_K2)
    host = load_host_params("vllm")
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc))
    pricer = StepPricer(sc, cost, host, block_pricing=False)
    n, ctx, k = 8, 512, 2  # 8 x 3 = 24 tokens: a capture size, so vLLM pads nothing
    got = pricer.step_s(((), n, ctx))
    # Expected, assembled from the graph builders: the target over n(k+1) tokens all sampled, attention
    # of n alike (k+1)-token chunks; the EAGLE-3 head (one Llama layer, 32k vocabulary) over the same
    # tokens plus its fc (3h -> h) and one draft token sampled per request, then k - 1 single-token passes.
    t = n * (k + 1)
    target = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware,
                              BatchShape(decode_context_tokens=(1,) * t))
    nodes = [(nd.work, nd.repeat) for nd in target.nodes if not is_attention_work(nd.work)]
    nodes += prefill_attention_nodes(sc.model, sc.engine, sc.precision, sc.hardware, new_tokens=k + 1,
                                     context_tokens=ctx, count=n)
    draft = sc.draft_model
    assert draft is not None and draft.num_layers == 1 and draft.vocab_size == 32_000
    engine = dataclasses.replace(sc.engine, speculative_config=None)
    first = build_step_graph(draft, engine, sc.precision, sc.hardware,
                             BatchShape(prefills=(PrefillChunk(new_tokens=k + 1, context_tokens=ctx),) * n))
    nodes += [(nd.work, nd.repeat) for nd in first.nodes]
    h = sc.model.hidden_size
    w = sc.precision.linear_weight_dtype
    nodes.append((gemm_work("fc", t, h, 3 * h, weight_dtype=w, act_dtype=sc.precision.activation_dtype,
                            compute_dtype=sc.precision.gemm_compute_dtype(w, sc.hardware)), 1))
    rest = build_step_graph(draft, engine, sc.precision, sc.hardware, BatchShape(decode_context_tokens=(ctx,) * n))
    nodes += [(nd.work, nd.repeat * (k - 1)) for nd in rest.nodes]
    gpu = sum(cost.estimate(work).time_s * r for work, r in nodes)
    hc = host_cost(params=host, mode="cuda_graph", num_seqs=n, num_sampled=n, is_decode_only=True,
                   max_cudagraph_capture_size=sc.engine.max_cudagraph_capture_size or 0, num_launches=0,
                   num_layers=sc.model.num_layers, short_kernel_gap_s=0.0)
    # `async_scheduling` unset: vLLM's default, on with EAGLE-3 (sim.perf.profile.resolved_async_scheduling).
    assert got == pytest.approx(step_time_s(device_s=gpu, host=hc, async_scheduling=True), rel=1e-9)
    labels = {name for part in pricer._key_parts[((), n, ctx)][0] for _, name in part.labels}
    assert {"attn_verify", "draft:fc", "draft:lm_head", "draft:attn_verify", "draft:attn_decode"} <= labels
    assert "attn_decode" not in labels


def test_speculation_helps_at_batch_one_and_costs_more_per_step_at_large_batches() -> None:
    sc = _scenario(EAGLE3_K2)
    off = _scenario(None)
    host = load_host_params("vllm")
    on_p = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), host)
    off_p = StepPricer(off, StepCostModel(off.hardware, scenario_efficiency(off)), host)
    tokens = mean_acceptance_length(acceptance_rates("eagle3", 2, None, None))
    # Per emitted token: a verification step over its expected tokens against one plain decode step.
    # Short contexts: the GEMMs of 512 x 3 tokens are compute-bound, so verifying costs more than it saves.
    assert on_p.step_s(((), 1, 256)) / tokens < off_p.step_s(((), 1, 256))
    assert on_p.step_s(((), 512, 256)) / tokens > off_p.step_s(((), 512, 256))


def test_ngram_adds_host_time_and_no_draft_kernels() -> None:
    sc = _scenario({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})
    assert sc.draft_model is None
    host = load_host_params("vllm")
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), host)
    pricer.step_s(((), 8, 256))
    parts, hc = pricer._key_parts[((), 8, 256)]
    assert not any(name.startswith("draft:") for part in parts for _, name in part.labels)
    plain = host_cost(params=host, mode="cuda_graph", num_seqs=8, num_sampled=8, is_decode_only=True,
                      max_cudagraph_capture_size=sc.engine.max_cudagraph_capture_size or 0, num_launches=0,
                      num_layers=sc.model.num_layers, short_kernel_gap_s=0.0)
    assert hc.cpu_s == pytest.approx(plain.cpu_s + 8 * NGRAM_LOOKUP_S_PER_REQUEST)


def test_runs_are_deterministic_per_seed() -> None:
    workload = {"num_prompts": 12, "random_output_len": 40, "random_range_ratio": 0.5, "max_concurrency": 4}
    a = simulate(_scenario(EAGLE3_K2, workload=workload))
    b = simulate(_scenario(EAGLE3_K2, workload=workload))
    c = simulate(scenario_from_dict({**scenario_dict(engine={"speculative_config": EAGLE3_K2}, perf={"tier": "roofline"},
                                                     workload=workload), "seed": 5}, source="test"))
    assert a.records == b.records and a.summary == b.summary
    assert a.summary.num_steps != c.summary.num_steps or a.records != c.records


def test_drafter_memory_takes_kv_blocks() -> None:
    on, off = scenario_memory(_scenario(EAGLE3_K2)), scenario_memory(_scenario(None))
    sc = _scenario(EAGLE3_K2)
    h, v = sc.model.hidden_size, 32_000
    assert on.kv_bytes_per_token == off.kv_bytes_per_token * 33 // 32  # one more layer of KV
    # One Llama layer (attention + MLP), the 3h -> h fc and the 32k-vocabulary head, in BF16; the
    # layer's QKV takes a 2h-wide input (vLLM's llama_eagle3), h x (q + 2 kv) more than a Llama layer.
    m = sc.model
    qkv = (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
    params = m.attention_params() + m.dense_mlp_params() + 2 * h + 3 * h * h + v * h + h * qkv
    assert on.weight_bytes - off.weight_bytes == pytest.approx(2 * params, rel=1e-6)
    assert on.num_kv_blocks < off.num_kv_blocks


def test_mla_verification_reads_each_request_latent_once() -> None:
    from sim.specs.catalog import load_model
    from sim.specs.engine import EngineParams
    from sim.specs.precision import resolve_precision
    model = load_model("deepseek-ai/DeepSeek-R1")
    precision = resolve_precision(model, EngineParams(tensor_parallel_size=8))
    nodes = verify_nodes(model, precision, 8, num_requests=3, context_tokens=100, num_query_tokens=2)
    attn = [w for w, _ in nodes if w.kind is KernelKind.MLA_DECODE]
    assert len(attn) == 1 and attn[0].name == "mla_verify"
    assert model.mla is not None
    row = model.mla.latent_width() * precision.kv_cache_dtype.bytes_per_element()
    assert attn[0].kv_read_bytes == 3 * 102 * row
    assert attn[0].shape[0] == 6  # queries


# -- configuration rules ------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "workload", "key", "words"), [
    ({"method": "medusa", "num_speculative_tokens": 2}, {}, "engine.speculative_config.method", "must be one of"),
    ({"method": "eagle3", "num_speculative_tokens": 0}, {}, "engine.speculative_config.num_speculative_tokens",
     "1..16"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, {}, "engine.speculative_config.model",
     "needs a draft model"),
    ({"method": "mtp", "num_speculative_tokens": 1}, {}, "engine.speculative_config.method",
     "num_nextn_predict_layers"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, {}, "engine.speculative_config.model",
     "no separate draft model"),
    ({"method": "draft_model", "num_speculative_tokens": 2, "model": "mistralai/Mistral-7B-v0.1"}, {},
     "engine.speculative_config.model", "vocab_size"),
    ({"method": "eagle3", "num_speculative_tokens": 2, "typo": 1}, {}, "engine.speculative_config.typo",
     "unknown key"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, {"spec_acceptance_rates": [1.5]},
     "workload.spec_acceptance_rates[0]", "[0, 1]"),
    ({"method": "eagle3", "num_speculative_tokens": 2}, {"spec_mean_acceptance_length": 3.5},
     "workload.spec_mean_acceptance_length", "<= num_speculative_tokens + 1"),
    (None, {"spec_acceptance_rates": [0.5]}, "workload.spec_acceptance_rates", "speculative_config"),
])
def test_config_errors_name_key_value_rule(spec: dict[str, Any] | None, workload: dict[str, Any], key: str,
                                           words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _scenario(spec, workload=workload)
    assert err.value.key == key
    assert words in err.value.rule


def test_mtp_on_deepseek_uses_its_moe_mtp_layer() -> None:
    sc = scenario_from_dict(scenario_dict(
        hardware={"name": "h200_sxm"}, model={"name": "deepseek-ai/DeepSeek-R1"},
        engine={"tensor_parallel_size": 8, "speculative_config": {"method": "mtp", "num_speculative_tokens": 1}},
        perf={"tier": "roofline"}), source="test")
    draft = sc.draft_model
    assert draft is not None and draft.num_layers == 1 and draft.mla is not None
    assert draft.moe is not None and draft.moe.moe_layer_indices == (0,)


def test_a_decode_pool_that_speculates_alone_takes_the_workloads_acceptance_rates() -> None:
    """`disaggregation.decode.engine.speculative_config` alone: the acceptance rates are the decode
    pool's (before 0.6.2 the prefill pool, resolved as its own scenario, refused them), and without
    any pool speculating they are still refused."""
    path = REPO / "scenarios" / "llama3_8b-h100-disagg-1p1d.toml"
    spec = '{ method = "eagle3", num_speculative_tokens = 3, model = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" }'
    decode_only = ["workload.num_prompts=20", "disaggregation.decode.engine={ speculative_config = " + spec + " }"]

    def tpot(*extra: str) -> float:
        sc = load_scenario(path, dict(parse_override(x) for x in [*decode_only, *extra]))
        assert sc.disaggregation is not None and sc.disaggregation.prefill.scenario.engine.speculative_config is None
        return simulate(sc).summary.tpot_mean_s

    accepting, rejecting = tpot("workload.spec_acceptance_rates=[1.0]"), tpot("workload.spec_acceptance_rates=[0.0]")
    assert accepting < 0.5 * rejecting
    with pytest.raises(ConfigError, match="speculative_config"):
        load_scenario(path, {"workload.num_prompts": 20, "workload.spec_acceptance_rates": [0.9]})


def test_tensorrt_llm_reservations_hold_the_lookahead_slots_so_nothing_is_preempted() -> None:
    """GUARANTEED_NO_EVICT (`backend = "trtllm"`) reserves a request's whole length; with speculation
    its last verification allocates prompt + output - 1 + k slots, which the reservation now holds
    (before 0.6.2 it held prompt + output: 17 preemptions here with EAGLE-3, k = 3)."""
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    workload = {"num_prompts": 200, "dataset_name": "fixed", "random_input_len": 118, "random_output_len": 10,
                "request_rate": "inf", "spec_acceptance_rates": [1.0]}
    sc = _scenario(eagle3, engine={"gpu_memory_utilization": 0.25, "backend": "trtllm"}, workload=workload)
    result = simulate(sc)
    assert result.summary.num_completed == 200
    assert result.summary.num_preemptions == 0


@pytest.mark.parametrize("lookahead,blocks", [(0, 1), (3, 2)])
def test_a_drafter_methods_step_allocates_vllms_lookahead_slots(lookahead: int, blocks: int) -> None:
    """vLLM v1 allocates `num_lookahead_tokens` = k slots past a running request's 1 + k scheduled
    tokens for the drafter methods (`allocate_slots(..., num_lookahead_tokens)`): a 10-token prompt
    verifying 3 drafts holds 11 + 3 + 3 = 17 slots, two 16-token blocks (one without lookahead)."""
    kv = KVCacheManager(num_blocks=100, block_size=16, enable_prefix_caching=False)
    scheduler = VllmV1Scheduler(kv=kv, max_num_seqs=8, max_num_batched_tokens=256, enable_chunked_prefill=True,
                                long_prefill_token_threshold=0, num_speculative_tokens=3,
                                speculation=AcceptanceSampler((0.0,), seed=0), num_lookahead_tokens=lookahead)
    scheduler.add(RequestState(request_id=0, prompt_tokens=10, output_tokens=50, arrival_s=0.0, keys=()))
    prefill = scheduler.schedule()
    assert prefill is not None and kv.num_blocks - kv.num_free_blocks() == 1  # nothing computed: no lookahead
    scheduler.finish_step(prefill)
    for _ in range(2):
        plan = scheduler.schedule()
        assert plan is not None and plan.chunks[0].num_draft_tokens == 3
        assert kv.num_blocks - kv.num_free_blocks() == blocks
        scheduler.finish_step(plan)


def test_lookahead_slots_follow_the_method_and_the_engine() -> None:
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    assert vllm_lookahead_tokens(_scenario(eagle3)) == 3
    assert vllm_lookahead_tokens(_scenario({"method": "ngram", "num_speculative_tokens": 3})) == 0
    assert vllm_lookahead_tokens(_scenario(eagle3, engine={"backend": "sglang"})) == 0
    assert vllm_lookahead_tokens(_scenario(None)) == 0


def test_the_last_hit_block_is_given_back_for_vllms_hidden_state_drafters() -> None:
    """`SpeculativeConfig.use_eagle()` (eagle, eagle3, mtp) makes vLLM's prefix-cache lookup pop the
    last hit block; ngram and draft_model drafters, and other engines, keep it."""
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    assert vllm_drops_last_hit_block(_scenario(eagle3))
    assert not vllm_drops_last_hit_block(_scenario({"method": "ngram", "num_speculative_tokens": 3}))
    assert not vllm_drops_last_hit_block(_scenario(eagle3, engine={"backend": "sglang"}))
    assert not vllm_drops_last_hit_block(_scenario(None))


def test_a_verification_steps_cuda_graph_is_chosen_by_its_tokens() -> None:
    """vLLM v1 captures graphs by scheduled tokens: 200 decodes verifying 3 drafts are 800 tokens,
    over a 512-token capture, so the step runs piecewise graphs (before 0.6.2 it was priced as one
    full-graph replay because 200 requests fit); 100 decodes (400 tokens) still replay one graph."""
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}
    sc = _scenario(eagle3, engine={"max_cudagraph_capture_size": 512})
    host = load_host_params("vllm")
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), host)
    launch_s = {}
    for n in (100, 200):
        key = ((), n, 512)
        pricer.step_s(key)
        launch_s[n] = pricer._key_parts[key][1].launch_s
    assert launch_s[100] == pytest.approx(host.graph_launch_s)
    assert launch_s[200] == pytest.approx(2 * sc.model.num_layers * host.graph_launch_s)


# -- the drafter's number formats (vLLM loads the draft from its own checkpoint) ----------------------


def _gemm_weight_bytes_per_element(nodes: list[tuple[Any, int]]) -> dict[str, float]:
    return {w.name: w.weight_bytes / (w.shape[1] * w.shape[2]) for w, _ in nodes if w.kind is KernelKind.GEMM}


def _target_and_draft_gemms(sc: Scenario) -> tuple[dict[str, float], dict[str, float]]:
    """Weight bytes per element of each GEMM of an 8-token decode batch: the target's, the drafter's."""
    from sim.engine.step_parts import PartNodes
    nodes = PartNodes(sc)
    assert nodes.draft is not None
    return (_gemm_weight_bytes_per_element(nodes.token(8, decode_only=True)),
            _gemm_weight_bytes_per_element(nodes.draft.token(8, decode_only=True)))


def _draft_gemms(sc: Scenario) -> dict[str, float]:
    return _target_and_draft_gemms(sc)[1]


def test_eagle_head_of_an_fp8_target_is_unquantized_unless_its_quantization_says() -> None:
    fp8 = {"quantization": "fp8"}
    bf16_head = _scenario(EAGLE3_K2, engine=fp8)
    target, head = _target_and_draft_gemms(bf16_head)
    assert target["qkv_proj"] == 1.0  # the target runs FP8 ...
    assert head["draft:qkv_proj"] == head["draft:fc"] == 2.0  # ... its published head is bf16
    fp8_head = _scenario({**EAGLE3_K2, "quantization": "fp8"}, engine=fp8)
    assert set(_draft_gemms(fp8_head).values()) == {1.0}
    # Memory: the bf16 head adds the same bytes as it does beside a bf16 target; an FP8 head about half.
    plain = scenario_memory(_scenario(EAGLE3_K2)).weight_bytes - scenario_memory(_scenario(None)).weight_bytes
    off = scenario_memory(_scenario(None, engine=fp8)).weight_bytes
    assert scenario_memory(bf16_head).weight_bytes - off == plain
    fp8_added = scenario_memory(fp8_head).weight_bytes - off
    assert 0.5 * plain < fp8_added < 0.8 * plain  # layer and fc halve; the 32k-vocabulary head stays bf16


def test_mtp_layer_takes_the_targets_format_and_eh_proj_stays_in_the_model_dtype() -> None:
    sc = _scenario({"method": "mtp", "num_speculative_tokens": 1},
                   model={"name": "deepseek-ai/DeepSeek-R1"}, hardware={"name": "h200_sxm"},
                   engine={"tensor_parallel_size": 8, "max_model_len": 4096})
    target, head = _target_and_draft_gemms(sc)
    assert head["draft:fc"] == 2.0  # vLLM's DeepSeekMultiTokenPredictorLayer.eh_proj is an nn.Linear
    quantized = {name for name, b in target.items() if b == 1.0}
    assert quantized and all(head["draft:" + name] == 1.0 for name in quantized if "draft:" + name in head)


def test_draft_model_ignores_the_targets_quantization_flag() -> None:
    spec = {"method": "draft_model", "num_speculative_tokens": 2, "model": "meta-llama/Llama-3.1-8B"}
    sc = _scenario(spec, model={"name": "meta-llama/Llama-3.1-70B"},
                   engine={"quantization": "fp8", "tensor_parallel_size": 4})
    assert set(_draft_gemms(sc).values()) == {2.0}  # vLLM passes speculative_config.quantization, not --quantization
    fp8 = _scenario({**spec, "quantization": "fp8"}, model={"name": "meta-llama/Llama-3.1-70B"},
                    engine={"quantization": "fp8", "tensor_parallel_size": 4})
    assert set(_draft_gemms(fp8).values()) - {2.0} == {1.0}  # the LM head stays bf16


def test_ngram_refuses_a_draft_quantization() -> None:
    with pytest.raises(ConfigError, match="no draft weights"):
        _scenario({"method": "ngram", "num_speculative_tokens": 2, "quantization": "fp8"})


def test_draft_quantization_key_keeps_the_hash_of_scenarios_written_before_it() -> None:
    from sim.specs.scenario import stable_identity
    sc = _scenario(EAGLE3_K2)
    assert "quantization" not in stable_identity("engine", sc.engine)["speculative_config"]
    assert sc.scenario_hash() != _scenario({**EAGLE3_K2, "quantization": "fp8"}).scenario_hash()


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 4}, EAGLE3_K2])
def test_a_request_as_long_as_the_cache_and_max_model_len_finishes(spec: dict[str, Any]) -> None:
    """vLLM cuts a verification's drafts at position max_model_len - 1 and its slots (lookahead
    included) at max_model_len, so a cache that holds one max_model_len request runs it (before
    2026-12-02 the request preempted itself at its last tokens and the run ended truncated)."""
    from sim.api import check_feasible
    engine = {"gpu_memory_utilization": 0.25, "max_model_len": 4096, "speculative_config": spec}
    workload = {"dataset_name": "fixed", "num_prompts": 1, "random_input_len": 1000, "random_output_len": 100}
    probe = scenario_from_dict(scenario_dict(engine=engine, workload=workload, perf={"tier": "roofline"}), source="t")
    cap = check_feasible(probe).kv_capacity_tokens()
    sc = scenario_from_dict(scenario_dict(engine={**engine, "max_model_len": cap},
                                          workload={**workload, "random_input_len": cap - 100},
                                          perf={"tier": "roofline"}), source="t")
    s = simulate(sc).summary
    assert (s.num_completed, s.truncated, s.num_preemptions) == (1, False, 0)
    # With max_model_len above the cache, the longest request's drafts and lookahead must fit as well.
    longer = scenario_from_dict(scenario_dict(engine={**engine, "max_model_len": cap + 64},
                                              workload={**workload, "random_input_len": cap - 100},
                                              perf={"tier": "roofline"}), source="t")
    with pytest.raises(InfeasibleScenario, match="less than one request needs"):
        check_feasible(longer)


def test_a_verification_cut_by_the_budget_samples_all_its_positions() -> None:
    # k = 3 drafts cut to d = 2 by the token budget: the target still computes logits for (and the
    # rejection sampler verifies) 1 + d = 3 positions, as vLLM's spec-decode metadata gathers them.
    from sim.serving.scheduler import ScheduledChunk, StepPlan

    sc = _scenario({**EAGLE3_K2, "num_speculative_tokens": 3})
    pricer = StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"),
                        block_pricing=False)
    req = RequestState(request_id=0, prompt_tokens=128, output_tokens=16, arrival_s=0.0, keys=())
    plan = StepPlan(1, (ScheduledChunk(req, 3, 512, True, 2),), 0, ())
    key = pricer.key(plan)
    rows: list[int] = []
    sampling = pricer.parts.sampling
    pricer.parts.sampling = lambda n: (rows.append(n), sampling(n))[1]  # type: ignore[method-assign]
    pricer.step_s(key)
    assert rows == [3]
    _, host = pricer._key_parts[key]
    one = host_cost(params=load_host_params("vllm"), mode="cuda_graph", num_seqs=1, num_sampled=1,
                    is_decode_only=False, max_cudagraph_capture_size=sc.engine.max_cudagraph_capture_size or 0,
                    num_launches=0, num_layers=sc.model.num_layers, short_kernel_gap_s=0.0, num_tokens=1)
    assert host.cpu_s == pytest.approx(one.cpu_s)  # the host still samples one request
