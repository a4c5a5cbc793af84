"""Block pricing (vectorised kernel-model calls over many token counts) gives the numbers of
count-by-count pricing: per step, per kernel row, in provenance and in the kernel breakdown."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from conftest import REPO

from sim.api import load_host_params, load_scenario, scenario_efficiency, step_graph
from sim.engine.block_pricing import BuiltNodes, PolynomialNodes, _Pending
from sim.engine.part_book import BLOCK_FROM_ASK
from sim.engine.part_prices import PartPrices
from sim.engine.pricer import StepKey, StepPricer
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, KernelWork
from sim.perf.efficiency import KernelColumns
from sim.perf.fitted import TABLE_KINDS, FittedEfficiency
from sim.perf.step import StepCostModel
from sim.specs.scenario import Scenario

REL = 1e-9
LLAMA70 = str(REPO / "scenarios" / "llama3_70b-h100-tp4.toml")
MIXTRAL = str(REPO / "scenarios" / "mixtral_8x7b-h100-tp2.toml")


def _pricers(sc: Scenario) -> tuple[StepPricer, StepPricer]:
    def make(block: bool) -> StepPricer:
        return StepPricer(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), load_host_params("vllm"),
                          block_pricing=block)
    return make(True), make(False)


def _keys(max_tokens: int) -> list[StepKey]:
    keys: list[StepKey] = [((), n, ctx) for n in (1, 2, 3, 63, 64, 65, 257, 1000) for ctx in (16, 1024)]
    keys += [(((t, 0, True),), 0, 0) for t in (*range(1, 300), *range(300, max_tokens + 1, 61), max_tokens)]
    keys += [(((t, 200, False), (17, 0, True)), n, 512) for t in range(1, max_tokens - 400, 397) for n in (1, 90)]
    return keys


def _compare(sc: Scenario, *, vectorised: bool) -> None:
    block, scalar = _pricers(sc)
    assert block._cost.prices_columns() is vectorised
    keys = _keys(sc.engine.max_num_batched_tokens or 0)
    for key in keys:
        assert block.step_s(key) == pytest.approx(scalar.step_s(key), rel=REL, abs=0.0), key
        block.counts[key] += 1
        scalar.counts[key] += 1
    assert block.worst_provenance == scalar.worst_provenance
    kinds_b, names_b, host_b, floor_b = block.breakdown()
    kinds_s, names_s, host_s, floor_s = scalar.breakdown()
    assert kinds_b.keys() == kinds_s.keys() and names_b.keys() == names_s.keys()
    for k in kinds_b:
        assert kinds_b[k] == pytest.approx(kinds_s[k], rel=REL)
    for k in names_b:
        assert names_b[k] == pytest.approx(names_s[k], rel=REL)
    assert (host_b, floor_b) == (host_s, floor_s)


@pytest.mark.parametrize("tier", ["roofline", "auto", "cross-generation"])
def test_block_priced_steps_equal_count_by_count_prices_llama70b_h100(tier: str) -> None:
    sc = load_scenario(LLAMA70, {"perf.tier": tier})
    if tier == "auto":
        assert isinstance(scenario_efficiency(sc), FittedEfficiency)  # the shipped h100_sxm calibration
    _compare(sc, vectorised=True)
    block, _ = _pricers(sc)
    for t in range(100, 100 + 2 * BLOCK_FROM_ASK):
        block.step_s((((t, 0, True),), t - 97, 64))
    assert block.parts.block_pricers is not None
    assert set(block.parts.block_pricers) == {("token",), ("sampling",), ("prefill", 0, 1), ("decode", 64)}
    assert all(p._template is not None for p in block.parts.block_pricers.values())


@pytest.mark.parametrize("overrides", [
    {"model.name": "nvidia/Llama-3.1-70B-Instruct-FP8"},
    {"model.name": "Qwen/Qwen3-32B", "engine.tensor_parallel_size": 2},
    {"engine.tensor_parallel_size": 2, "engine.pipeline_parallel_size": 2},
    {"engine.tensor_parallel_size": 4, "engine.pipeline_parallel_size": 4},  # one of three hops leaves the node
    {"model.name": "deepseek-ai/DeepSeek-R1", "hardware.name": "h200_sxm", "engine.tensor_parallel_size": 1,
     "engine.data_parallel_size": 8, "engine.enable_expert_parallel": True},
    {"model.name": "zai-org/GLM-5", "hardware.name": "h200_sxm", "engine.tensor_parallel_size": 8,
     "engine.quantization": "fp8"},
    {"model.name": "deepseek-ai/DeepSeek-R1", "hardware.name": "h200_sxm", "engine.tensor_parallel_size": 8,
     "engine.enable_expert_parallel": True},
    {"model.name": "Qwen/Qwen3.5-397B-A17B", "hardware.name": "h200_sxm", "engine.tensor_parallel_size": 8,
     "engine.quantization": "fp8_block"},
])
def test_block_pricing_other_models_and_parallelism(overrides: dict[str, Any]) -> None:
    _compare(load_scenario(LLAMA70, overrides), vectorised=True)


def test_moe_token_part_is_block_priced_with_the_moe_rows_rebuilt_per_count() -> None:
    sc = load_scenario(MIXTRAL)
    _compare(sc, vectorised=True)
    block, _ = _pricers(sc)
    for t in range(100, 100 + 2 * BLOCK_FROM_ASK):
        block.step_s((((t, 0, True),), t - 90, 64))
    assert block.parts.block_pricers is not None
    template = block.parts.block_pricers[("token",)]._template
    # The routed load (expected active experts) is no polynomial of the count: the fused MoE row is
    # rebuilt per count and priced only at the counts asked for; the other rows by window.
    assert isinstance(template, PolynomialNodes) and template.rebuilt and template.deferred
    assert {template.nodes[template.row_of.index(r)][0] for r in template.deferred} == {KernelKind.MOE}
    assert block.parts.block_pricers[("sampling",)]._template is not None


def test_sliding_window_prefill_is_built_per_count_and_full_attention_is_polynomial() -> None:
    sc = load_scenario(LLAMA70, {"model.name": "openai/gpt-oss-120b", "engine.tensor_parallel_size": 4})
    assert any(w > 0 for w in sc.model.layer_window_tokens) and any(w <= 0 for w in sc.model.layer_window_tokens)
    _compare(sc, vectorised=True)
    block, _ = _pricers(sc)
    for t in range(100, 100 + BLOCK_FROM_ASK):
        block.step_s((((t, 0, True),), 0, 0))
    assert block.parts.block_pricers is not None
    assert isinstance(block.parts.block_pricers[("prefill", 0, 1)]._template, BuiltNodes)
    llama, _ = _pricers(load_scenario(LLAMA70))
    for t in range(100, 100 + BLOCK_FROM_ASK):
        llama.step_s((((t, 300, False), (7, 0, True)), 0, 0))
    assert llama.parts.block_pricers is not None
    assert isinstance(llama.parts.block_pricers[("prefill", 300, 1)]._template, PolynomialNodes)


def test_gated_deltanet_families_are_polynomials_of_the_count() -> None:
    """Every Gated DeltaNet row of a hybrid model's prefill and decode parts is an exact polynomial
    of the count (whole-number FLOPs and bytes), so their families get a polynomial template, not
    nodes built count by count."""
    sc = load_scenario(LLAMA70, {"model.name": "Qwen/Qwen3.5-397B-A17B", "hardware.name": "h200_sxm",
                                 "engine.tensor_parallel_size": 8, "engine.quantization": "fp8_block"})
    block, _ = _pricers(sc)
    for t in range(100, 100 + BLOCK_FROM_ASK):
        block.step_s((((t, 300, False), (7, 0, True)), t - 90, 1024))
    assert block.parts.block_pricers is not None
    for family in (("prefill", 300, 1), ("decode", 1024)):
        assert isinstance(block.parts.block_pricers[family]._template, PolynomialNodes), family


def test_polynomial_check_rejects_a_second_piece_anywhere() -> None:
    sc = load_scenario(LLAMA70)
    base = _pricers(sc)[0].parts.prices.nodes.token
    top = 8192
    for breakpoint in (4, 6, 50, 700, 3000, 5000, 8000, top):
        def build(n: int, b: int = breakpoint) -> Any:
            nodes = base(n)
            if n >= b:  # a second linear piece from the breakpoint on
                work, repeat = nodes[0]
                nodes[0] = (dataclasses.replace(work, flops=work.flops + 2.0 * (n - b + 1)), repeat)
            return nodes
        assert PolynomialNodes.of(build, top) is None, breakpoint
    assert PolynomialNodes.of(base, top) is not None


class _ScalarOnly:
    """An efficiency model without the column entry point."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def efficiency(self, work: KernelWork, hw: Any) -> Any:
        return self._inner.efficiency(work, hw)


def test_models_without_columns_price_count_by_count() -> None:
    sc = load_scenario(LLAMA70)
    cost = StepCostModel(sc.hardware, _ScalarOnly(scenario_efficiency(sc)))
    assert not cost.prices_columns()
    pricer = StepPricer(sc, cost, load_host_params("vllm"))
    _, scalar = _pricers(sc)
    key: StepKey = (((300, 0, True),), 5, 128)
    assert pricer.step_s(key) == pytest.approx(scalar.step_s(key), rel=REL)
    assert not pricer.parts.prices_in_blocks


@pytest.mark.parametrize("tier", ["auto", "cross-generation"])
def test_efficiency_columns_equal_one_kernel_calls(tier: str) -> None:
    """Every kernel kind of several graphs (attention with context, windows, fp8 KV, MoE)."""
    works: dict[tuple[Any, ...], list[KernelWork]] = {}
    for path, overrides in ((LLAMA70, {}), (MIXTRAL, {}), (LLAMA70, {"model.name": "nvidia/Llama-3.1-70B-Instruct-FP8"}),
                            (LLAMA70, {"engine.pipeline_parallel_size": 2, "engine.tensor_parallel_size": 2})):
        sc = load_scenario(path, {**overrides, "perf.tier": tier})
        for t in (1, 2, 3, 17, 100, 513, 2048, 8000):
            for ctx in (0, 300):
                for decodes in ((), (5,) * 7, (40_000,)):
                    batch = BatchShape(prefills=(PrefillChunk(new_tokens=t, context_tokens=ctx),),
                                       decode_context_tokens=decodes)
                    for node in step_graph(sc, batch).nodes:
                        w = node.work
                        works.setdefault((w.kind, w.dtype, w.group_size, len(w.shape)), []).append(w)
    model = scenario_efficiency(sc)
    assert isinstance(model, FittedEfficiency)
    for ws in works.values():
        values, provenance = model.efficiency_columns(KernelColumns.of(ws), sc.hardware)
        for w, value, prov in zip(ws, values.tolist(), provenance.tolist(), strict=True):
            one = model.efficiency(w, sc.hardware)
            assert value == pytest.approx(one.value, rel=REL, abs=0.0), w
            assert prov == int(one.provenance), w


DEEPSEEK_DP8 = str(REPO / "scenarios" / "deepseek_r1-h200-dp8ep8.toml")
_MOE_MLA = [
    (DEEPSEEK_DP8, {}),
    (DEEPSEEK_DP8, {"engine.moe_routing": "balanced", "engine.enable_eplb": True}),
    (str(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml"), {}),
    (LLAMA70, {"model.name": "Qwen/Qwen3-235B-A22B", "engine.tensor_parallel_size": 8}),
    (LLAMA70, {"model.name": "openai/gpt-oss-120b", "engine.tensor_parallel_size": 4}),
    (LLAMA70, {"model.name": "Qwen/Qwen3.5-397B-A17B", "hardware.name": "h200_sxm", "engine.tensor_parallel_size": 8,
               "engine.quantization": "fp8_block"}),
]


@pytest.mark.parametrize(("path", "overrides"), _MOE_MLA)
def test_moe_and_mla_parts_by_block_equal_count_by_count(path: str, overrides: dict[str, Any]) -> None:
    """MoE / MLA / MLA-BMM / expert all-to-all rows are priced by the same column code either way, so
    their per-node seconds are bitwise equal; the parts' totals differ only by the dense rows' float
    rounding (1e-16 to 1e-14 relative)."""
    sc = load_scenario(path, {**overrides, "perf.tier": "auto"})
    block, scalar = _pricers(sc)
    assert block._cost.prices_columns()
    nodes = block.parts.prices.nodes
    top = sc.engine.max_num_batched_tokens or 8192
    families = [(("token",), nodes.token, range(1, top + 1, 37)),
                (("token", "decode_only"), nodes.decode_only_token, range(1, 600, 7)),
                (("decode", 1024), lambda n: nodes.decode(n, 1024), range(1, 257, 5)),
                (("prefill", 300, 1), lambda n: nodes.prefill(n, 300, 1), range(1, 2000, 41))]
    table_rows = 0
    for family, build, counts in families:
        pricer = block.parts.prices.block_pricer(family, top)
        assert pricer is not None
        for n in counts:
            by_block = pricer.part(n)
            assert by_block is not None, (family, n)
            alone = scalar.parts.prices.alone_part(family, n, build)
            assert by_block.labels == alone.labels
            assert by_block.worst_provenance == alone.worst_provenance
            for (kind, _), b, a in zip(by_block.labels, list(by_block.seconds), alone.seconds, strict=True):
                if KernelKind(kind) in TABLE_KINDS:
                    assert b == a, (family, n, kind)
                    table_rows += 1
                else:
                    assert b == pytest.approx(a, rel=1e-12, abs=0.0), (family, n, kind)
            for x, y in ((by_block.gpu_s, alone.gpu_s), (by_block.comm_s, alone.comm_s),
                         (by_block.short_kernel_gap_s, alone.short_kernel_gap_s)):
                assert x == pytest.approx(y, rel=1e-12, abs=1e-30), (family, n)
    assert table_rows > 0


def test_table_efficiency_from_columns_equals_the_per_kernel_path() -> None:
    """`_table_efficiency_columns` (no `KernelWork` per row) gives `_table_efficiency`'s numbers bitwise,
    for every table-keyed kind, mixed DeepEP modes in one call included."""
    works: dict[tuple[Any, ...], list[KernelWork]] = {}
    for path, overrides in _MOE_MLA:
        sc = load_scenario(path, {**overrides, "perf.tier": "auto"})
        for t in (1, 3, 17, 100, 513, 2048):
            for decodes in ((), (5,) * 7, (40_000,)):
                batch = BatchShape(prefills=(PrefillChunk(new_tokens=t, context_tokens=300),) if t > 1 else (),
                                   decode_context_tokens=decodes or (64,))
                for node in step_graph(sc, batch).nodes:
                    w = node.work
                    if w.kind in TABLE_KINDS:
                        works.setdefault((id(sc), w.kind, w.dtype, w.group_size), []).append(w)
        model = scenario_efficiency(sc)
        assert isinstance(model, FittedEfficiency)
        for (sid, *_), ws in works.items():
            if sid != id(sc):
                continue
            # The expert all-to-all's decode-only (low-latency) mode too.
            ws = ws + [dataclasses.replace(w, variant="low_latency") for w in ws if w.kind is KernelKind.EP_ALL_TO_ALL]
            values, codes = model._table_efficiency_columns(KernelColumns.of(ws), sc.hardware)
            old_values, old_codes = model._table_efficiency(ws, sc.hardware)
            assert values.tolist() == old_values.tolist() and codes.tolist() == old_codes.tolist()
    assert {k[1] for k in works} == set(TABLE_KINDS)


def test_a_rebuild_that_departs_from_the_real_nodes_is_refused() -> None:
    sc = load_scenario(MIXTRAL)
    nodes = _pricers(sc)[0].parts.prices.nodes
    top = 8192
    assert PolynomialNodes.of(nodes.token, top) is None  # the MoE row alone is no polynomial
    good = {KernelKind.MOE: nodes._moe_at}
    assert PolynomialNodes.of(nodes.token, top, good) is not None

    def off(first: KernelWork, shapes: Sequence[tuple[int, ...]]) -> list[KernelWork]:
        return [dataclasses.replace(work, flops=work.flops * (1.0 + 1e-15 * (shape[0] > 700)))
                for work, shape in zip(nodes._moe_at(first, shapes), shapes, strict=True)]
    assert PolynomialNodes.of(nodes.token, top, {KernelKind.MOE: off}) is None


@pytest.mark.parametrize("moe_tp", [None, 2])
def test_rows_of_one_tp_ranks_tokens_are_polynomials_of_the_quotient(moe_tp: int | None) -> None:
    """With attention TP 4 over 2 attention-DP ranks and expert parallelism, the expert all-to-all
    (and with MoE-TP the MoE-TP all-reduce) moves ceil(t / 4) tokens: no polynomial of t, one of
    ceil(t / 4). The token family is block priced with those rows in the quotient, not priced count
    by count."""
    overrides: dict[str, Any] = {"model.name": "deepseek-ai/DeepSeek-R1", "hardware.name": "h200_sxm",
                                 "engine.tensor_parallel_size": 4, "engine.data_parallel_size": 2,
                                 "engine.enable_expert_parallel": True}
    if moe_tp is not None:
        overrides["engine.moe_tensor_parallel_size"] = moe_tp
        overrides["engine.moe_expert_parallel_size"] = 8 // moe_tp
    sc = load_scenario(LLAMA70, overrides)
    nodes = _pricers(sc)[0].parts.prices.nodes
    top = 8192
    rebuild = {KernelKind.MOE: nodes._moe_at}
    assert PolynomialNodes.of(nodes.token, top, rebuild) is None  # in t alone: no form
    template = PolynomialNodes.of(nodes.token, top, rebuild, divisor=4)
    assert template is not None
    quotient = {template.nodes[template.row_of.index(r)][1] for r in range(template.num_rows)
                if template.in_quotient[r]}
    assert quotient == ({"moe_all_to_all"} if moe_tp is None else {"moe_all_to_all", "moe_tp_all_reduce"})
    # A row whose shape is ceil(t / 8) everywhere but one count is refused.
    def off(n: int) -> Any:
        out = nodes.token(n)
        if n == 4096:
            out = [(dataclasses.replace(w, comm_bytes=w.comm_bytes + 1.0) if w.name == "moe_all_to_all" else w, r)
                   for w, r in out]
        return out
    assert PolynomialNodes.of(off, top, rebuild, divisor=4) is None
    block, _ = _pricers(sc)
    for t in (*range(100, 100 + BLOCK_FROM_ASK), 5000):
        block.step_s((((t, 0, True),), 0, 0))
    assert block.parts.block_pricers is not None
    assert isinstance(block.parts.block_pricers[("token",)]._template, PolynomialNodes)
    _compare(sc, vectorised=True)


def test_one_column_sums_equal_a_windows_sums_bitwise() -> None:
    """A count completed alone (`BlockPricer._one`, Python floats) sums its nodes exactly as a window's
    columns are summed (`_sums`, numpy): same operations, same order."""
    sc = load_scenario(MIXTRAL)
    prices = _pricers(sc)[0].parts.prices
    pricer = prices.nodes.block_pricer(("token",), prices.cost, 5e-6, 8192)
    assert pricer.has_template() and pricer._template is not None
    rows = pricer._template.num_rows
    rng = np.random.default_rng(7)
    for _ in range(20):
        times = rng.uniform(1e-7, 1e-4, size=(rows, 3)) * rng.choice([1e-3, 1.0, 10.0], size=(rows, 3))
        provs = rng.integers(0, 5, size=(rows, 3))
        block = pricer._sums(times, provs)
        for j in range(3):
            one = pricer._one(times[:, j].copy(), provs[:, j].copy())
            assert np.asarray(one.seconds).tolist() == block.seconds[:, j].tolist()
            assert (one.gpu_s, one.comm_s, one.short_kernel_gap_s, one.worst_provenance) == \
                (block.gpu_s[j], block.comm_s[j], block.short_kernel_gap_s[j], block.worst[j])


@pytest.mark.parametrize("path,overrides", [
    (LLAMA70, {}),
    (MIXTRAL, {}),
    (LLAMA70, {"model.name": "openai/gpt-oss-120b"}),  # sliding-window prefill: nodes built per count
    (LLAMA70, {"model.name": "deepseek-ai/DeepSeek-R1", "hardware.name": "h200_sxm",
               "engine.tensor_parallel_size": 8, "engine.enable_expert_parallel": True}),
])
def test_a_part_priced_alone_is_bitwise_its_block_price(path: str, overrides: dict[str, Any]) -> None:
    """With a column kernel model, a count priced alone (`PartPrices.priced`) runs the arithmetic
    block pricing runs, so which counts a run prices alone changes no bit of any result."""
    sc = load_scenario(path, overrides)
    prices = PartPrices(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), 5e-6)
    nodes = prices.nodes
    families = [
        (("prefill", 1000, 1), lambda n: nodes.prefill(n, 1000, 1), 8192),
        (("prefill", 0, 2), lambda n: nodes.prefill(n, 0, 2), 8192),
        (("token",), nodes.token, 8192),
        (("decode", 512), lambda n: nodes.decode(n, 512), 256),
        (("decode_at", 64, 16), lambda b: nodes.decode(64, b * 16), 1024),  # along the context
        (("prefill_at", 700, 1, 32), lambda k: nodes.prefill(700, k * 32, 1), 256),
        (("prefill_at", 333, 2, 1), lambda c: nodes.prefill(333, c, 2), 4096),
        (("sampling",), nodes.sampling, 256),
    ]
    checked = 0
    for family, build, top in families:
        pricer = prices.block_pricer(family, top)
        assert pricer is not None
        for n in (*range(1, 20), 100, 255, 1000, 4095):
            block = pricer.part(n) if n <= top else None
            if block is None:
                continue
            alone = prices.priced(build(n))
            assert list(np.asarray(block.seconds)) == list(alone.seconds), (family, n)
            assert (block.gpu_s, block.comm_s, block.short_kernel_gap_s, block.worst_provenance) == \
                (alone.gpu_s, alone.comm_s, alone.short_kernel_gap_s, alone.worst_provenance), (family, n)
            checked += 1
    assert checked > 80


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-70B", "deepseek-ai/DeepSeek-R1", "openai/gpt-oss-120b"])
def test_decode_parts_are_block_priced_along_the_axis_the_run_moves_on(model: str) -> None:
    """A run whose batch holds while the mean context sweeps (a closed loop) block prices its decode
    parts per batch size along the context; one whose mean context holds while the batch moves
    prices them per context along the batch; either way every step is the count-by-count price.
    A sliding window makes the context axis no polynomial: such a model stays on the batch axis.
    Asked in another order, a pricer picks other axes for the same parts: the same bits."""
    overrides: dict[str, Any] = {"model.name": model}
    if "DeepSeek" in model:
        overrides |= {"hardware.name": "h200_sxm", "engine.tensor_parallel_size": 8}
    sc = load_scenario(LLAMA70, overrides)
    block, scalar = _pricers(sc)
    sweep: list[StepKey] = [((), n, ctx) for n in (64, 63) for ctx in range(512, 4096, 16 * 7)]
    held: list[StepKey] = [((), n, 2048) for n in range(40, 200, 3)]
    shuffled, _ = _pricers(sc)
    for key in held[::-1] + sweep[::-2] + sweep:
        shuffled.step_s(key)
    for key in sweep + held:
        assert block.step_s(key) == pytest.approx(scalar.step_s(key), rel=REL, abs=0.0), key
        assert block.step_s(key) == shuffled.step_s(key), key
    blocks = block.parts.block_pricers
    assert blocks is not None
    along_context = [f for f, pricer in blocks.items() if f[0] == "decode_at" and pricer is not None
                     and pricer.part(1) is not None]
    along_batch = [f for f, pricer in blocks.items() if f[0] == "decode" and pricer is not None]
    assert ("decode", 2048) in along_batch
    if "gpt-oss" in model:
        assert not along_context  # windowed layers: the context axis has no polynomial form
    else:
        assert {f[1] for f in along_context} == {63, 64}
        assert len(along_batch) <= 3  # the sweep's first contexts, before a batch size was asked twice


def test_prompt_chunks_of_one_size_at_many_contexts_are_block_priced_along_the_context() -> None:
    """An offline run's chunks take what the decodes leave of the budget, so one chunk size recurs
    at many contexts (on 32-token blocks under TensorRT-LLM): after `BLOCK_FROM_ASK` asks the chunk
    size gets a family along the context; prices are the count-by-count ones, in any order."""
    sc = load_scenario(LLAMA70)
    block, scalar = _pricers(sc)
    shuffled, _ = _pricers(sc)
    keys: list[StepKey] = [(((new, ctx, False),), 40, 1024) for new in (2016, 4064) for ctx in range(2048, 40000, 32 * 9)]
    keys += [(((1000, ctx, False),), 0, 0) for ctx in range(1, 3000, 77)]  # contexts off the 32-token steps
    for key in keys[::-3] + keys:
        shuffled.step_s(key)
    for key in keys:
        assert block.step_s(key) == pytest.approx(scalar.step_s(key), rel=REL, abs=0.0), key
        assert block.step_s(key) == shuffled.step_s(key), key
    assert block.parts.block_pricers is not None
    along_context = {f for f, pricer in block.parts.block_pricers.items() if f[0] == "prefill_at" and pricer is not None}
    assert along_context == {("prefill_at", 2016, 1, 32), ("prefill_at", 4064, 1, 32), ("prefill_at", 1000, 1, 1)}


def test_a_form_whose_float_fields_are_not_dyadic_is_refused() -> None:
    """GLM-5's `dsa_topk` FLOPs (keys x log2(span)) are linear in the decode count but not whole
    numbers: the Newton form's sum rounds differently from the node in the last bit at some counts,
    so its decode families get no template (priced alone); Llama's whole-number fields keep theirs."""
    glm = load_scenario(LLAMA70, {"model.name": "zai-org/GLM-5", "hardware.name": "h200_sxm",
                                  "engine.tensor_parallel_size": 8, "engine.pipeline_parallel_size": 2})
    llama = load_scenario(LLAMA70)
    for sc, templated in ((glm, False), (llama, True)):
        nodes = PartPrices(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), 5e-6).nodes
        poly = PolynomialNodes.of(lambda n, nodes=nodes: nodes.decode(n, 3696), 256, divisor=1)
        assert (poly is not None) is templated


def test_a_family_asked_for_a_few_counts_gets_no_block_pricer() -> None:
    sc = load_scenario(LLAMA70)
    block, _ = _pricers(sc)
    for t in range(1, BLOCK_FROM_ASK):
        block.step_s((((t, 777, False),), 0, 0))
    assert block.parts.block_pricers is not None and ("prefill", 777, 1) not in block.parts.block_pricers
    block.step_s((((BLOCK_FROM_ASK, 777, False),), 0, 0))
    assert ("prefill", 777, 1) in block.parts.block_pricers


def test_deferred_moe_rows_are_priced_alone_then_by_chunk() -> None:
    """A window's deferred MoE rows: the first two counts asked in a chunk of 128 columns are priced
    alone, the third prices the rest of the chunk at once (their routing drawn together), and every
    count's part is bitwise the part priced alone."""
    sc = load_scenario(str(REPO / "scenarios" / "deepseek_r1-h200-tp8.toml"), {"perf.tier": "auto"})
    prices = PartPrices(sc, StepCostModel(sc.hardware, scenario_efficiency(sc)), 5e-6)
    pricer = prices.block_pricer(("token",), 8192)
    assert pricer is not None
    asked = [300, 301, 330, 257, 384]  # columns 43, 44, 73, 0 and 127 of the window 257..384
    done = []
    for n in asked:
        part = pricer.part(n)
        assert part is not None
        pending = pricer._where[n][0]
        assert isinstance(pending, _Pending) and pending.counts[0] == 257 and len(pending.counts) == 128
        done.append(int(pending.done.sum()))
        alone = prices.priced(prices.nodes.token(n))
        assert list(np.asarray(part.seconds)) == list(alone.seconds), n
        assert (part.gpu_s, part.comm_s, part.worst_provenance) == (alone.gpu_s, alone.comm_s, alone.worst_provenance)
    assert done == [1, 2, 128, 128, 128]
