"""MLA and DSA kernels, the fused MoE node's rank-0 load, MoE layouts, MLA memory: by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import scenario_dict

from sim.api import check_feasible, step_graph
from sim.dtypes import DType
from sim.errors import ConfigError, InfeasibleScenario
from sim.graph.batch import BatchShape, PrefillChunk
from sim.graph.kernels import KernelKind, KernelWork
from sim.graph.memory import kv_bytes_per_token, memory_breakdown, weight_bytes_per_gpu
from sim.graph.moe import rank0_load
from sim.graph.transformer import build_step_graph
from sim.perf.roofline import roofline
from sim.perf.table_kernels import work_columns
from sim.serde import FieldError
from sim.specs.engine import EngineParams
from sim.specs.scenario import Scenario, scenario_from_dict

R1 = "deepseek-ai/DeepSeek-R1"


def scenario(model: str = R1, hardware: str = "h200_sxm", **engine: Any) -> Scenario:
    d = scenario_dict(hardware={"name": hardware}, model={"name": model}, engine={"max_model_len": 8192, **engine})
    return scenario_from_dict(d, source="t.toml")


def node(sc: Scenario, batch: BatchShape, name: str) -> tuple[KernelWork, int]:
    n = next(n for n in step_graph(sc, batch).nodes if n.work.name == name)
    return n.work, n.repeat


def test_mla_decode_is_absorbed_against_the_latent_cache() -> None:
    sc = scenario(tensor_parallel_size=8)
    batch = BatchShape(decode_context_tokens=(99, 199))
    names = [n.work.name for n in step_graph(sc, batch).nodes]
    assert "mla_kv_b_proj" not in names and "mla_prefill" not in names
    pre, repeat = node(sc, batch, "mla_gen_pre")
    assert repeat == 61 and pre.kind is KernelKind.MLA_BMM and pre.variant == "mla_gen_pre"
    assert pre.shape == (2, 16, 512, 128)  # 2 tokens, 128 / TP8 heads, q_nope 128 -> latent 512
    assert pre.flops == 2 * 2 * 16 * 512 * 128
    post, _ = node(sc, batch, "mla_gen_post")
    assert post.shape == (2, 16, 128, 512)
    dec, _ = node(sc, batch, "mla_decode")
    assert dec.kind is KernelKind.MLA_DECODE
    assert dec.shape == (2, 150, 200, 16, 512, 64)  # kv tokens include the new one: 100 and 200
    assert dec.flops == 2 * 16 * (576 + 512) * 300
    assert dec.kv_read_bytes == 300 * 576 * 2  # bf16 latent rows, shared by the heads
    o_proj, _ = node(sc, batch, "o_proj")
    assert o_proj.shape == (2, 7168, 16 * 128)


def test_mla_prefill_decompresses_the_cached_context_and_new_tokens() -> None:
    sc = scenario(tensor_parallel_size=8)
    batch = BatchShape(prefills=(PrefillChunk(new_tokens=100, context_tokens=300),))
    kv_b, repeat = node(sc, batch, "mla_kv_b_proj")
    assert repeat == 61 and kv_b.kind is KernelKind.GEMM
    assert kv_b.shape == (400, 16 * (128 + 128), 512)
    assert kv_b.kv_read_bytes == 300 * 576 * 2
    attn, _ = node(sc, batch, "mla_prefill")
    assert attn.shape == (1, 100, 300, 16, 128, 64, 128)
    keys = sum(range(301, 401))
    assert attn.flops == 2 * 16 * (192 + 128) * keys
    assert attn.kv_write_bytes == 100 * 576 * 2
    qa, _ = node(sc, batch, "fused_qkv_a_proj")
    assert qa.shape == (100, 1536 + 576, 7168)  # replicated on every TP rank


def test_dsa_attends_to_at_most_index_topk_tokens_and_prices_the_indexer() -> None:
    sc = scenario("zai-org/GLM-5", tensor_parallel_size=8, quantization="fp8")
    batch = BatchShape(decode_context_tokens=(999, 9999))
    sparse, _ = node(sc, batch, "mla_sparse")
    assert sparse.kind is KernelKind.MLA_DECODE
    assert sparse.shape == (2, (1000 + 2048) // 2, 2048, 8, 512, 64)
    logits, _ = node(sc, batch, "dsa_indexer_logits")
    assert logits.flops == 2 * 32 * 128 * (1000 + 10000)  # every visible key is scored
    assert logits.kv_read_bytes == 10000 * 2 * (128 + 4)
    prefill = BatchShape(prefills=(PrefillChunk(new_tokens=4096),))
    sparse, _ = node(sc, prefill, "mla_sparse")
    # queries 1..2048 see themselves and what precedes; later ones the 2048 selected tokens
    assert sparse.flops == 2 * 8 * (576 + 512) * (sum(range(1, 2049)) + 2048 * 2048)
    names = {n.work.name for n in step_graph(sc, prefill).nodes}
    assert {"dsa_wq_b", "dsa_wk", "dsa_weights_proj", "dsa_topk"} <= names and "mla_kv_b_proj" not in names


def test_mla_kv_cache_is_one_latent_row_per_token_replicated_over_tp() -> None:
    for tp in (1, 8):
        sc = scenario(tensor_parallel_size=tp)
        assert kv_bytes_per_token(sc.model, sc.engine, sc.precision) == 61 * (512 + 64) * 2
    fp8 = scenario(tensor_parallel_size=8, kv_cache_dtype="fp8")
    assert kv_bytes_per_token(fp8.model, fp8.engine, fp8.precision) == 61 * 576
    glm = scenario("zai-org/GLM-5", tensor_parallel_size=8, kv_cache_dtype="fp8", quantization="fp8")
    # DSA's FP8 row is the sparse kernels' own layout (vLLM `fp8_ds_mla`): 512 FP8 values, four fp32
    # scales, the RoPE part in BF16 = 656 bytes (576 until 2026-12-02: 11% too many KV tokens), plus the
    # FP8 indexer key (128) and its scale (4).
    assert kv_bytes_per_token(glm.model, glm.engine, glm.precision) == 78 * (512 + 4 * 4 + 64 * 2 + 128 + 4)
    sparse = [n.work for n in step_graph(glm, BatchShape(decode_context_tokens=(100,) * 4)).nodes
              if n.work.name == "mla_sparse"]
    assert [w.kv_read_bytes for w in sparse] == [4 * 101 * 656.0]
    mem = memory_breakdown(fp8.model, fp8.engine, fp8.precision, fp8.hardware)
    assert mem.num_kv_blocks == mem.kv_cache_bytes // (61 * 576 * 16)


def test_experts_split_over_ep_ranks_and_attention_replicated_over_dp() -> None:
    tp8 = scenario(tensor_parallel_size=8)
    dp8 = scenario(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True)
    assert (tp8.engine.moe_tp_size(), tp8.engine.expert_parallel_size()) == (8, 1)
    assert (dp8.engine.moe_tp_size(), dp8.engine.expert_parallel_size()) == (1, 8)
    w_tp8 = weight_bytes_per_gpu(tp8.model, tp8.engine, tp8.precision)
    w_dp8 = weight_bytes_per_gpu(dp8.model, dp8.engine, dp8.precision)
    # Routed experts take the same bytes either way (1/8 of each, or 1/8 of them); the DP ranks hold
    # whole the TP-split weights: q_b, kv_b (FP8 plus vLLM's bf16 W_UK/W_UV copy), o_proj (61
    # layers), shared experts (58 MoE layers), dense MLPs (3 layers), bf16 embedding and LM head.
    split = 61 * (1536 * 128 * 192 + 512 * 128 * 256 * (1 + 2) + 128 * 128 * 7168) + 58 * 3 * 7168 * 2048 \
        + 3 * 3 * 7168 * 18432 + 2 * 129280 * 7168 * 2
    assert w_dp8 - w_tp8 == pytest.approx(split * 7 / 8, rel=1e-6)


def test_moe_layout_factorisations() -> None:
    e = EngineParams(tensor_parallel_size=4, moe_tensor_parallel_size=2, moe_expert_parallel_size=2)
    assert (e.moe_tp_size(), e.expert_parallel_size()) == (2, 2)
    e = EngineParams(tensor_parallel_size=1, data_parallel_size=16, enable_expert_parallel=True)
    assert (e.moe_tp_size(), e.expert_parallel_size()) == (1, 16)
    assert EngineParams(tensor_parallel_size=4, moe_expert_parallel_size=4).moe_tp_size() == 1
    with pytest.raises(FieldError) as err:
        EngineParams(tensor_parallel_size=4, moe_tensor_parallel_size=2, moe_expert_parallel_size=4)
    assert "must equal tensor_parallel_size x data_parallel_size = 4" in str(err.value)
    with pytest.raises(FieldError):
        EngineParams(moe_routing="zipf")
    sc = scenario(tensor_parallel_size=4, moe_tensor_parallel_size=2, moe_expert_parallel_size=2,
                  moe_routing="balanced")
    moe, _ = node(sc, BatchShape(decode_context_tokens=(10,) * 8), "moe_experts")
    assert moe.shape == (8, 7168, 2048, 8, 256, 2, 2)
    assert moe.flops == 2 * 3 * (8 * 8 / 2) * 7168 * (2048 / 2)
    names = [n.work.name for n in step_graph(sc, BatchShape(decode_context_tokens=(10,) * 8)).nodes]
    # DP 1: every rank holds the batch; the TP all-reduce sums the MoE-TP and EP partial outputs.
    assert "moe_tp_all_reduce" not in names and "moe_all_to_all" not in names and "mlp_all_reduce" in names
    dp = scenario(tensor_parallel_size=2, data_parallel_size=2, moe_tensor_parallel_size=2,
                  moe_expert_parallel_size=2, moe_routing="balanced")
    names = [n.work.name for n in step_graph(dp, BatchShape(decode_context_tokens=(10,) * 8)).nodes]
    assert "moe_tp_all_reduce" in names and "moe_all_to_all" in names


@pytest.mark.parametrize(("model", "hardware", "engine", "weights", "table_dtype"), [
    ("openai/gpt-oss-120b", "h200_sxm", {"backend": "trtllm"}, DType.MXFP4, "w4a16_mxfp4"),
    ("openai/gpt-oss-120b", "b200_sxm", {"backend": "trtllm"}, DType.MXFP4, "w4a16_mxfp4"),
    ("moonshotai/Kimi-K2.5", "h200_sxm", {"tensor_parallel_size": 8}, DType.INT4_WO, "int4_wo"),
])
def test_the_fused_moe_node_is_keyed_by_the_expert_weight_format(model: str, hardware: str, engine: dict[str, Any],
                                                                  weights: DType, table_dtype: str) -> None:
    # Hopper has no FP4 tensor cores and no GPU has INT4 ones: these experts run weight-only kernels
    # (W4A16), which the measured tables key by their weight format, not as a bf16 MoE (4x the bytes).
    sc = scenario(model, hardware, **engine)
    moe, _ = node(sc, BatchShape(decode_context_tokens=(1000,) * 16), "moe_experts")
    assert moe.dtype is weights
    assert work_columns([moe])["moe_dtype"].tolist() == [table_dtype]
    hw = sc.hardware
    # The roofline computes them at the 16-bit rate where the tensor cores lack the format.
    assert roofline(moe, hw).compute_s == pytest.approx(
        moe.flops / hw.peak_flops_for(DType.MXFP4 if hw.supports(DType.MXFP4) and weights is DType.MXFP4
                                      else DType.BFLOAT16))


@pytest.mark.parametrize(("kv_cache_dtype", "dtype", "label"), [("fp8", DType.FP8, "fp8"),
                                                                ("auto", DType.BFLOAT16, "bfloat16")])
def test_mla_attention_is_keyed_by_the_kv_cache_format(kv_cache_dtype: str, dtype: DType, label: str) -> None:
    # The measured MLA tables key the kernel by kv_cache_dtype (FP8-cache kernels are other kernels).
    sc = scenario(tensor_parallel_size=8, kv_cache_dtype=kv_cache_dtype)
    for batch, name in ((BatchShape(decode_context_tokens=(999,) * 4), "mla_decode"),
                        (BatchShape(prefills=(PrefillChunk(new_tokens=100, context_tokens=300),)), "mla_prefill")):
        work, _ = node(sc, batch, name)
        assert work.dtype is dtype
        assert work_columns([work])["kv_cache_dtype"].tolist() == [label]


def test_attention_dp_gathers_every_rank_tokens_at_the_moe_layer() -> None:
    sc = scenario(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True, moe_routing="balanced")
    batch = BatchShape(decode_context_tokens=(10,) * 4)
    moe, _ = node(sc, batch, "moe_experts")
    assert moe.shape[0] == 32  # 4 tokens on each of the 8 DP ranks
    assert moe.flops == 2 * 3 * (32 * 8 / 8) * 7168 * 2048
    a2a, _ = node(sc, batch, "moe_all_to_all")
    assert a2a.shape == (4, 7168, 8, 256, 8, 1) and a2a.group_size == 8


def test_power_law_routing_loads_rank0_more_than_balanced() -> None:
    balanced = rank0_load(num_tokens=4096, num_experts=256, topk=8, ep=8, routing="balanced")
    assert balanced.routed_pairs == 4096 * 8 / 8 and balanced.active_experts == 32
    skewed = rank0_load(num_tokens=4096, num_experts=256, topk=8, ep=8, routing="power_law_1.2")
    assert skewed.routed_pairs > 1.2 * balanced.routed_pairs
    assert skewed == rank0_load(num_tokens=4096, num_experts=256, topk=8, ep=8, routing="power_law_1.2")
    whole = rank0_load(num_tokens=100, num_experts=64, topk=4, ep=1, routing="power_law_1.01")
    assert whole.routed_pairs == pytest.approx(400)  # one rank computes every pair
    assert whole.active_experts <= 64


@pytest.mark.parametrize(("engine", "key", "words"), [
    ({"tensor_parallel_size": 3}, "engine.tensor_parallel_size", "num_attention_heads=128"),
    # An EP size that does not divide the experts is vLLM's uneven expert map (accepted); more EP ranks
    # than experts leave a rank without one.
    ({"tensor_parallel_size": 1, "data_parallel_size": 512, "enable_expert_parallel": True},
     "engine.enable_expert_parallel", "expert-parallel size 512"),
    ({"tensor_parallel_size": 1, "data_parallel_size": 6}, "engine.moe_tensor_parallel_size",
     "expert intermediate size 2048"),
])
def test_layouts_that_do_not_divide_are_rejected_naming_the_numbers(engine: dict[str, Any], key: str,
                                                                     words: str) -> None:
    with pytest.raises(ConfigError) as err:
        scenario(**engine)
    assert err.value.key == key and words in err.value.rule


def test_deepseek_r1_fp8_does_not_fit_eight_h100() -> None:
    with pytest.raises(InfeasibleScenario) as err:
        check_feasible(scenario(hardware="h100_sxm", tensor_parallel_size=8))
    rule = err.value.rule
    # 79.5 GiB of FP8 weights per GPU: 683 GB over 8 GPUs (671B parameters, mostly one byte each)
    assert "79.51 GiB of weights per GPU" in rule and "683 GB over the 8 GPUs" in rule
    assert check_feasible(scenario(hardware="h200_sxm", tensor_parallel_size=8)).num_kv_blocks > 0


def test_rank0_load_is_kept_per_shape_and_equals_a_fresh_draw() -> None:
    from sim.graph import moe_routing
    from sim.graph.moe_routing import moe_rank0_load

    args = (777, 256, 8, 8, "power_law_1.01")
    first = moe_rank0_load(*args)
    assert moe_routing._LOADS[args] == first
    assert moe_rank0_load(*args) == first
    moe_routing._LOADS.clear()
    assert moe_rank0_load(*args) == first  # seeded by the shape: the same draws afresh


def _one_power_law_draw(tokens: int, experts: int, topk: int, ep: int, alpha: float,
                        rng: np.random.Generator) -> np.ndarray:
    """The collector's power-law draw written out one draw at a time (the reference the
    vectorised `_power_law_counts` must equal, draw for draw)."""
    lo, hi = (1.0, tokens * 0.8) if tokens * topk > experts else (0.01, 2.0)
    u = rng.random(experts)
    if abs(1.0 - alpha) < 1e-9:
        x = lo * (hi / lo) ** u
    else:
        x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
    target = tokens * topk
    counts = np.round(x / x.sum() * target).astype(np.int64)
    delta = int(target - counts.sum())
    order = np.argsort(-counts, kind="stable")
    if delta > 0:
        counts += delta // experts
        counts[order[: delta % experts]] += 1
    for i in range(-delta if delta < 0 else 0):
        k = order[-(i % experts) - 1]
        if counts[k] > 0:
            counts[k] -= 1
        else:
            counts[int(np.argmax(counts))] -= 1
    group = max(experts // max(ep, 1), 1)
    usable = group * (experts // group)
    sums = counts[:usable].reshape(-1, group).sum(1)
    heavy = int(np.argmax(sums))
    if heavy:
        g = counts[:usable].reshape(-1, group).copy()
        g[[0, heavy]] = g[[heavy, 0]]
        counts[:usable] = g.ravel()
    return counts.astype(float)


@pytest.mark.parametrize("experts,topk,ep,alpha", [
    (256, 8, 8, 1.01), (128, 8, 4, 1.2), (64, 6, 1, 1.01), (8, 2, 2, 1.5), (160, 6, 16, 1.0), (384, 8, 64, 1.01),
])
def test_power_law_draws_run_as_one_array_equal_one_at_a_time(experts: int, topk: int, ep: int,
                                                              alpha: float) -> None:
    from sim.graph.moe_routing import POWER_LAW_DRAWS, _power_law_counts

    for tokens in (*range(1, 40), 100, 257, 1000, 4096, 30000):
        fast = _power_law_counts(tokens, experts, topk, ep, alpha, np.random.default_rng(tokens), POWER_LAW_DRAWS)
        rng = np.random.default_rng(tokens)
        slow = [_one_power_law_draw(tokens, experts, topk, ep, alpha, rng) for _ in range(POWER_LAW_DRAWS)]
        assert fast.tolist() == [d.tolist() for d in slow], tokens


def _reference_load(tokens: int, experts: int, topk: int, ep: int, distribution: str) -> tuple[float, float, float]:
    """`moe_rank0_load` from the one-draw-at-a-time reference above (power-law distributions)."""
    import zlib

    from sim.graph.moe_routing import POWER_LAW_DRAWS

    local = max(experts // max(ep, 1), 1)
    alpha = float(distribution.removeprefix("power_law_").removesuffix("_eplb"))
    rng = np.random.default_rng(zlib.crc32(f"{tokens}/{experts}/{topk}/{ep}/{distribution}".encode()))
    draws = np.stack([_one_power_law_draw(tokens, experts, topk, ep, alpha, rng)
                      for _ in range(POWER_LAW_DRAWS)])[:, :local]
    return float(draws.sum(1).mean()), float((draws > 0).sum(1).mean()), float(draws.max(1).mean())


@pytest.mark.parametrize("experts,topk,ep,distribution", [
    (256, 8, 1, "power_law_1.01"), (256, 8, 8, "power_law_1.01"), (128, 8, 4, "power_law_1.2"),
    (8, 2, 2, "power_law_1.5"), (160, 6, 16, "power_law_1.0"), (384, 8, 64, "power_law_1.01_eplb"),
    (512, 10, 8, "power_law_0.5"),
])
def test_rank0_loads_drawn_together_equal_each_drawn_alone(experts: int, topk: int, ep: int,
                                                           distribution: str) -> None:
    """`moe_rank0_loads` draws many token counts in arrays (the rounding repair in one operation where
    no expert is empty, the collector's loop where one is): every load is bitwise the reference's,
    whatever the other counts drawn with it, and `moe_rank0_load` then finds it kept."""
    from sim.graph import moe_routing

    tokens = [*range(1, 70), 100, 255, 256, 257, 1000, 1023, 4096, 5000, 8191, 30000]
    keys = [(t, experts, topk, ep, distribution) for t in tokens]
    moe_routing._LOADS.clear()
    together = moe_routing.moe_rank0_loads(keys[::-1] + keys[:5])  # repeats and any order
    assert together == [_reference_load(*k) for k in keys[::-1] + keys[:5]]
    assert [moe_routing.moe_rank0_load(*k) for k in keys] == together[len(keys) - 1::-1]


def test_rank0_loads_in_small_batches_and_a_full_memo_keep_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """Counts drawn `_BATCH` at a time, and a memo cleared while a call's loads are found, change no
    value and lose none of the call's loads."""
    from sim.graph import moe_routing

    keys = [(t, 256, 8, 8, "power_law_1.01") for t in range(1, 40)] + [(5, 256, 8, 8, "balanced")]
    expected = [_reference_load(*k) for k in keys[:-1]] + [moe_routing.moe_rank0_load(*keys[-1])]
    monkeypatch.setattr(moe_routing, "_BATCH", 7)
    monkeypatch.setattr(moe_routing, "_LOADS_MAX", 10)
    moe_routing._LOADS.clear()
    assert moe_routing.moe_rank0_loads(keys[:20]) == expected[:20]
    assert moe_routing.moe_rank0_loads(keys) == expected  # the memo is over its bound: cleared, refilled
    assert moe_routing.moe_rank0_load(*keys[30]) == expected[30]


def _collectors_loop(values: list[int], order: list[int], surplus: int) -> list[int]:
    """The collector's rounding repair when over by `surplus`, as written (`order`: heaviest first)."""
    values = list(values)
    for i in range(surplus):
        k = order[-(i % len(values)) - 1]
        if values[k] > 0:
            values[k] -= 1
        else:
            values[values.index(max(values))] -= 1
    return values


@pytest.mark.parametrize("experts", [4, 8, 64, 256])
def test_take_surpluses_in_arrays_equal_the_collectors_loop(experts: int) -> None:
    """`_take_surpluses` levels the heaviest experts in closed form for many draws at once: every
    draw equals the collector's loop, those where the takes interact (run by the loop) included."""
    from sim.graph.moe_routing import _take_surpluses

    rng = np.random.default_rng(experts)
    draws = 400
    counts = rng.integers(0, 6, size=(1, draws, experts)) * rng.integers(0, 2, size=(1, draws, experts))
    counts[0, :, 0] += rng.integers(1, 4, size=draws)  # some heavy expert; ties are common
    counts[0, :, -1] = 0  # an empty expert in every draw
    surplus = rng.integers(1, experts, size=(1, draws))
    keys = -counts * experts + np.arange(experts)
    orders = np.argsort(keys, axis=2)
    expected = [_collectors_loop(counts[0, j].tolist(), orders[0, j].tolist(), int(surplus[0, j]))
                for j in range(draws)]
    looped = np.ones((1, draws), dtype=bool)
    got = counts.copy()
    _take_surpluses(got, keys, orders, surplus, looped, experts)
    assert got[0].tolist() == expected
    # Both paths ran: some draws' takes from the heaviest reach a light expert, most do not.
    hit_light = sum(_collectors_loop(counts[0, j].tolist(), orders[0, j].tolist(), int(surplus[0, j]))
                    != _two_batches(counts[0, j].tolist(), orders[0, j].tolist(), int(surplus[0, j]))
                    for j in range(draws))
    assert 0 < hit_light < draws


def _two_batches(values: list[int], order: list[int], surplus: int) -> list[int]:
    """The loop's takes as two batches (the empty experts' from the first heaviest, then one from
    each non-empty light expert): what the closed form computes where the takes do not interact."""
    light = order[::-1][:surplus]
    zeros = sum(1 for k in light if values[k] == 0)
    values = list(values)
    for _ in range(zeros):
        values[values.index(max(values))] -= 1
    for k in light[zeros:]:
        values[k] -= 1
    return values


def test_take_surplus_runs_the_collectors_loop_where_the_takes_interact() -> None:
    """Over by 3 with two empty experts: their takes fall on the heaviest (experts 0 and 2), and
    expert 2 is also the third light expert, empty by its turn, so the loop takes from the first
    heaviest again; taking in two batches would give [0, 0, -1, 0]. Both a case where the batches
    are exact and this one equal the collector's loop."""
    from sim.graph.moe_routing import _take_surplus

    for values, surplus, expected in (([1, 0, 1, 0], 3, [-1, 0, 0, 0]), ([1, 0, 1, 0, 1], 3, [0, 0, 0, 0, 0]),
                                      ([5, 0, 3, 1, 0, 2], 4, [3, 0, 3, 0, 0, 1])):
        counts = np.array(values, dtype=np.int64)
        order = np.argsort(-counts, kind="stable")
        _take_surplus(counts, order, surplus, len(values))
        assert counts.tolist() == _collectors_loop(values, order.tolist(), surplus) == expected


def test_llama4_maverick_interleaves_dense_and_moe_layers_with_a_shared_expert() -> None:
    """Maverick at TP8: 24 dense layers of width 16,384 / 8, 24 MoE layers with one routed expert and
    one shared expert of 8,192 / 8; every layer attends the whole context (chunked attention priced
    as full attention)."""
    sc = scenario_from_dict(scenario_dict(
        hardware={"name": "h200_sxm"}, model={"name": "meta-llama/Llama-4-Maverick-17B-128E-Instruct"},
        engine={"tensor_parallel_size": 8, "quantization": "fp8", "max_model_len": 8192, "backend": "trtllm"}),
        source="t")
    graph = build_step_graph(sc.model, sc.engine, sc.precision, sc.hardware,
                             BatchShape(decode_context_tokens=(1024,) * 16))
    nodes = {n.work.name: n for n in graph.nodes}
    assert nodes["mlp_gate_up_proj"].repeat == nodes["mlp_down_proj"].repeat == 24
    assert nodes["moe_experts"].repeat == nodes["moe_router"].repeat == 24
    assert nodes["shared_expert_gate_up_proj"].repeat == nodes["shared_expert_down_proj"].repeat == 24
    m = 16  # decode tokens
    assert nodes["mlp_gate_up_proj"].work.flops == 2 * m * 5120 * 2 * 16384 // 8
    assert nodes["shared_expert_gate_up_proj"].work.flops == 2 * m * 5120 * 2 * 8192 // 8
    assert nodes["attn_decode"].repeat == 48 and "attn_decode_swa" not in nodes


def test_vllm_sequence_parallel_moe_gathers_instead_of_reducing_over_tp() -> None:
    # vLLM `use_sequence_parallel_moe` (EP, TP > 1, DP > 1): each TP rank dispatches its 1/TP token slice
    # and the MoE layer ends with `tensor_model_parallel_all_gather`, not the TP all-reduce; the dense
    # layers (DeepSeek-R1's first 3) keep theirs.
    batch = BatchShape(decode_context_tokens=(10,) * 8)
    sp = scenario(tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True)
    nodes = {n.work.name: n for n in step_graph(sp, batch).nodes}
    gather, reduce = nodes["moe_tp_all_gather"], nodes["mlp_all_reduce"]
    assert (gather.work.kind, gather.work.comm_bytes, gather.work.group_size, gather.repeat) == (
        KernelKind.ALL_GATHER, 8 * 7168 * 2, 2, 58)
    assert (reduce.work.kind, reduce.repeat) == (KernelKind.ALL_REDUCE, 3)
    assert nodes["attn_all_reduce"].repeat == 61
    for other in (scenario(tensor_parallel_size=2, data_parallel_size=4, enable_expert_parallel=True, backend="sglang"),
                  scenario(tensor_parallel_size=8, enable_expert_parallel=True),
                  scenario(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True)):
        names = {n.work.name for n in step_graph(other, batch).nodes}
        assert "moe_tp_all_gather" not in names


def test_trtllm_attention_dp_gathers_expert_tokens_instead_of_an_all_to_all() -> None:
    # TensorRT-LLM's CutlassFusedMoE enables an all-to-all only for moe_ep_size > top_k with MNNVL
    # (select_alltoall_method_type); DeepSeek-R1's EP 8 at top-8 on H200 runs its post-quant
    # allgather of every DP rank's tokens and a reducescatter after the experts.
    sc = scenario(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True, backend="trtllm",
                  moe_routing="balanced")
    for batch in (BatchShape(decode_context_tokens=(100,) * 16), BatchShape(prefills=(PrefillChunk(new_tokens=16),))):
        nodes = {n.work.name: n for n in step_graph(sc, batch).nodes}
        assert "moe_all_to_all" not in nodes
        gather, scatter = nodes["moe_ep_all_gather"], nodes["moe_ep_reduce_scatter"]
        assert gather.repeat == scatter.repeat == 58
        assert gather.work.kind is KernelKind.ALL_GATHER and gather.work.group_size == 8
        # BF16 activations (FP8 block-scaled experts gather unquantized) plus int32 ids and fp32 weights
        assert gather.work.comm_bytes == 8 * 16 * (7168 * 2 + 8 * 8)
        assert scatter.work.kind is KernelKind.REDUCE_SCATTER and scatter.work.comm_bytes == 8 * 16 * 7168 * 2
        assert nodes["moe_experts"].work.shape[0] == 8 * 16  # every rank's experts see every rank's tokens
    # Other engines keep the DeepEP exchange at the same layout.
    for backend in ("vllm", "sglang"):
        other = scenario(tensor_parallel_size=1, data_parallel_size=8, enable_expert_parallel=True, backend=backend)
        names = {n.work.name for n in step_graph(other, BatchShape(decode_context_tokens=(100,) * 16)).nodes}
        assert "moe_all_to_all" in names and "moe_ep_all_gather" not in names


def test_trtllm_all_to_all_needs_more_ep_ranks_than_top_k_and_multi_node_nvlink() -> None:
    from sim.graph.moe import trtllm_gathers_expert_tokens

    e = EngineParams(tensor_parallel_size=1, data_parallel_size=16, enable_expert_parallel=True, backend="trtllm")
    assert trtllm_gathers_expert_tokens(e, topk=8, ep=16, multi_node_nvlink=False)
    assert trtllm_gathers_expert_tokens(e, topk=8, ep=8, multi_node_nvlink=True)
    assert not trtllm_gathers_expert_tokens(e, topk=8, ep=16, multi_node_nvlink=True)
    # Without attention DP nothing moves at all (the layer's TP all-reduce sums the experts' outputs).
    tp = EngineParams(tensor_parallel_size=8, enable_expert_parallel=True, backend="trtllm")
    assert not trtllm_gathers_expert_tokens(tp, topk=8, ep=8, multi_node_nvlink=False)
