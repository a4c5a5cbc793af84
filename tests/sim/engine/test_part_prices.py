"""Priced step parts shared between runs (`PriceCache`) give exactly the results of pricing afresh."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from conftest import scenario_dict
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.api import SimResult, load_host_params, scenario_efficiency, simulate
from sim.calibration.select import EfficiencyModels
from sim.engine.block_pricing import BlockPricer, CappedPricer
from sim.engine.part_prices import SCHEDULING_ONLY_FIELDS, PriceCache, pricing_identity
from sim.engine.step_parts import PartNodes
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.transformer import build_step_graph
from sim.perf.step import StepCostModel
from sim.specs.scenario import Scenario, scenario_from_dict

_MODELS = EfficiencyModels()


def _scenario(**sections: dict[str, Any]) -> Scenario:
    return scenario_from_dict(scenario_dict(**sections), source="t")


def _run(sc: Scenario, prices: PriceCache | None) -> SimResult:
    efficiency = scenario_efficiency(sc, models=_MODELS)
    return simulate(sc, efficiency=efficiency, prices=prices)


def _assert_identical(a: SimResult, b: SimResult) -> None:
    assert a.records == b.records
    assert a.summary == b.summary
    assert a.kv_usage == b.kv_usage
    assert a.breakdown == b.breakdown  # exactly: same parts, same sums


_VARIANTS: list[dict[str, dict[str, Any]]] = [
    {},
    {"engine": {"max_num_seqs": 8, "max_num_batched_tokens": 256}},
    {"engine": {"max_num_batched_tokens": 512, "max_num_seqs": 64, "long_prefill_token_threshold": 100}},
    {"engine": {"enable_chunked_prefill": False, "max_num_seqs": 16}},
    {"engine": {"data_parallel_size": 2, "router": "least_outstanding"}},
    {"engine": {"launch_mode": "eager"}},
    {"workload": {"num_prompts": 40, "random_input_len": 700, "random_output_len": 30, "request_rate": 30.0}},
    {"seed": {"value": 3}},
]


def _variant(i: int, tier: str) -> Scenario:
    v = _VARIANTS[i]
    sections = {k: val for k, val in v.items() if k != "seed"}
    workload = {"num_prompts": 30, "random_input_len": 300, "random_output_len": 20, "random_range_ratio": 0.8,
                **sections.get("workload", {})}
    sc = _scenario(**{**sections, "workload": workload, "perf": {"tier": tier}})
    return sc.with_overrides({"seed": v["seed"]["value"]}) if "seed" in v else sc


_FRESH: dict[tuple[int, str], SimResult] = {}


def _fresh(i: int, tier: str) -> SimResult:
    if (i, tier) not in _FRESH:
        _FRESH[(i, tier)] = _run(_variant(i, tier), None)
    return _FRESH[(i, tier)]


@settings(max_examples=12, deadline=None)
@given(order=st.lists(st.integers(0, len(_VARIANTS) - 1), min_size=2, max_size=5),
       tier=st.sampled_from(["auto", "roofline"]))
def test_runs_sharing_a_price_cache_give_the_results_of_fresh_pricing(order: list[int], tier: str) -> None:
    """Any sequence of trials through one cache (scheduling limits, chunking, replicas, launch
    mode, workloads varied; same pricing identity) reproduces each trial's fresh result."""
    cache = PriceCache()
    for i in order:
        _assert_identical(_run(_variant(i, tier), cache), _fresh(i, tier))
    assert len(cache) == 1 and cache.hits == len(order) - 1


def test_shipped_70b_scenario_through_a_warm_cache_is_identical() -> None:
    """A bigger run: 300 requests on Llama-70B TP4, fresh, then again after another workload and
    another token budget filled the cache."""
    base = {"model": {"name": "meta-llama/Llama-3.1-70B"}, "engine": {"tensor_parallel_size": 4},
            "workload": {"num_prompts": 300, "random_input_len": 1024, "random_output_len": 128,
                         "random_range_ratio": 0.9, "request_rate": 8.0}}
    sc = _scenario(**base)
    other = sc.with_overrides({"seed": 5, "workload.request_rate": 12.0})
    budget = sc.with_overrides({"engine.max_num_batched_tokens": 4096})
    fresh = _run(sc, None)
    cache = PriceCache()
    _run(other, cache)
    _run(budget, cache)
    _assert_identical(_run(sc, cache), fresh)
    assert cache.hits == 2 and len(cache) == 1


@pytest.mark.parametrize("family", [("token",), ("sampling",), ("decode", 640), ("prefill", 300, 1)])
def test_block_prices_do_not_depend_on_the_order_counts_are_priced(family: tuple[object, ...]) -> None:
    """What makes sharing exact: a count's block price is the same whichever counts were priced
    before it and whichever window it fell in."""
    sc = _scenario(engine={"max_num_batched_tokens": 700, "max_num_seqs": 300})
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc, models=_MODELS))
    nodes = PartNodes(sc)
    top = 700 if family[0] in ("token", "prefill") else 300
    counts = list(range(1, top + 1))
    shuffled = counts[:]
    random.Random(7).shuffle(shuffled)
    priced = []
    for order in (counts, shuffled, counts[::-1]):
        pricer = nodes.block_pricer(family, cost, load_host_params("vllm").eager_launch_s, top)
        parts = {n: pricer.part(n) for n in order}
        priced.append({n: (tuple(p.seconds), p.gpu_s, p.comm_s, p.short_kernel_gap_s, p.worst_provenance)
                       for n, p in parts.items() if p is not None})
    assert len(priced[0]) == top
    assert priced[0] == priced[1] == priced[2]


_OTHER_VALUES: dict[str, Any] = {
    "data_parallel_size": 2, "max_num_seqs": 7, "max_num_batched_tokens": 333, "enable_chunked_prefill": False,
    "enable_prefix_caching": False, "long_prefill_token_threshold": 64,
    "gpu_memory_utilization": 0.5, "block_size": 32, "max_model_len": 4096, "enforce_eager": True,
    "max_cudagraph_capture_size": 8, "async_scheduling": True, "launch_mode": "megakernel",
    "scheduler": "vllm_v1", "router": "least_outstanding", "batch_wait_timeout_iters": 20,
    "batch_wait_max_tokens_ratio": 0.9, "attention_dp_enable_balance": True, "attention_dp_timeout_iters": 60,
    "attention_dp_batching_wait_iters": 0, "api_server_latency_s": 0.05,
}


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1"])
def test_scheduling_only_engine_fields_never_reach_the_kernel_graph(model: str) -> None:
    """The fields the pricing identity leaves out do not change any step's kernel nodes."""
    assert set(_OTHER_VALUES) == set(SCHEDULING_ONLY_FIELDS)
    sc = _scenario(model={"name": model}, engine={"tensor_parallel_size": 2})
    batch = BatchShape(prefills=(PrefillChunk(new_tokens=300, context_tokens=64, samples=True),),
                       decode_context_tokens=(100, 900, 17))
    graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware, batch)
    for field, value in _OTHER_VALUES.items():
        engine = replace(sc.engine, **{field: value})
        same = build_step_graph(sc.model, engine, sc.precision, sc.hardware, batch) == graph
        # MoE layers see the tokens of every attention-DP rank (the identity keeps the field for MoE).
        assert same is not (field == "data_parallel_size" and sc.model.moe is not None), field


def test_identity_keeps_data_parallelism_for_moe_models() -> None:
    sc = _scenario(model={"name": "mistralai/Mixtral-8x7B-v0.1"},
                   engine={"tensor_parallel_size": 2, "enable_expert_parallel": True})
    eff = scenario_efficiency(sc, models=_MODELS)
    dp2 = replace(sc, engine=replace(sc.engine, data_parallel_size=2))
    assert pricing_identity(sc, eff, 5e-6, True) != pricing_identity(dp2, eff, 5e-6, True)
    no_ep = replace(sc, engine=replace(sc.engine, enable_expert_parallel=False))
    no_ep_dp2 = replace(no_ep, engine=replace(no_ep.engine, data_parallel_size=2))
    # Without expert parallelism the experts are still sliced over TP x DP ranks (vLLM's rule).
    assert pricing_identity(no_ep, eff, 5e-6, True) != pricing_identity(no_ep_dp2, eff, 5e-6, True)
    dense = _scenario(engine={"tensor_parallel_size": 2})
    dense_dp2 = replace(dense, engine=replace(dense.engine, data_parallel_size=2))
    dense_eff = scenario_efficiency(dense, models=_MODELS)
    assert pricing_identity(dense, dense_eff, 5e-6, True) == pricing_identity(dense_dp2, dense_eff, 5e-6, True)


def test_price_cache_keeps_the_most_recently_used_identities() -> None:
    cache = PriceCache(max_identities=2)
    scs = [_scenario(engine={"tensor_parallel_size": tp}) for tp in (1, 2, 4)]
    effs = [scenario_efficiency(sc, models=_MODELS) for sc in scs]
    first = cache.prices(scs[0], effs[0], 5e-6)
    cache.prices(scs[1], effs[1], 5e-6)
    assert cache.prices(scs[0], effs[0], 5e-6) is first  # hit, and now the most recent
    cache.prices(scs[2], effs[2], 5e-6)  # evicts tp=2
    assert len(cache) == 2 and cache.hits == 1 and cache.misses == 3
    assert cache.prices(scs[0], effs[0], 5e-6) is first
    assert cache.prices(scs[1], effs[1], 5e-6) is not None and cache.misses == 4
    with pytest.raises(ValueError, match="max_identities"):
        PriceCache(max_identities=0)


def _priced(part: Any) -> tuple[object, ...]:
    return (tuple(part.seconds), part.gpu_s, part.comm_s, part.short_kernel_gap_s, part.worst_provenance)


@pytest.mark.parametrize("hardware", ["h100_sxm", "h200_sxm", "a100_sxm"])
@pytest.mark.parametrize("family", [("sampling",), ("decode", 1600), ("token",), ("prefill", 300, 1)])
def test_a_count_is_priced_the_same_in_a_narrow_and_a_wide_window(hardware: str, family: tuple[object, ...]) -> None:
    """A run whose limit is 21 prices counts 1..21 in one 21-column window; a run whose limit is 300
    prices them in a 128-column window. The kernel model's column arithmetic must give each count
    the same bits either way (BLAS rounds a row of one product by the number of rows; the model
    now multiplies row by row), which is what lets a narrow run share the wide run's pricer."""
    sc = _scenario(hardware={"name": hardware})
    cost = StepCostModel(sc.hardware, scenario_efficiency(sc, models=_MODELS))
    nodes = PartNodes(sc)
    eager = load_host_params("vllm").eager_launch_s
    narrow = nodes.block_pricer(family, cost, eager, 21)
    wide = nodes.block_pricer(family, cost, eager, 300)
    for n in range(1, 22):
        a, b = narrow.part(n), wide.part(n)
        assert a is not None and b is not None
        assert _priced(a) == _priced(b), n


def test_a_narrower_run_shares_the_widest_pricer_of_its_family() -> None:
    sc = _scenario()
    eff = scenario_efficiency(sc, models=_MODELS)
    prices = PriceCache().prices(sc, eff, 5e-6)
    family = ("decode", 640)
    wide = prices.block_pricer(family, 300)
    assert isinstance(wide, BlockPricer)
    narrow = prices.block_pricer(family, 40)
    assert isinstance(narrow, CappedPricer) and narrow.max_count == 40
    assert prices.block_pricer(family, 40) is narrow  # kept per (family, top)
    own = PartNodes(sc).block_pricer(family, StepCostModel(sc.hardware, eff), 5e-6, 40)
    for n in (1, 7, 40):
        part, mine = narrow.part(n), own.part(n)
        assert part is not None and mine is not None and _priced(part) == _priced(mine)
    assert narrow.part(41) is None and own.part(41) is None  # above the run's limit: priced alone
    wider = prices.block_pricer(family, 512)  # a wider run gets its own pricer, and later ones share it
    assert isinstance(wider, BlockPricer) and wider is not wide
    capped = prices.block_pricer(family, 300 - 1)
    assert isinstance(capped, CappedPricer)
    part = capped.part(299)
    assert part is not None and part is wider.part(299)
    with pytest.raises(ValueError, match="max_count"):
        wide.capped(301)
