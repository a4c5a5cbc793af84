"""Hardware and model catalogs, scenario loading and its error messages."""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path

import pytest
from conftest import MEASURED_DATA, scenario_dict

from sim.errors import ConfigError
from sim.measured import open_text
from sim.serde import apply_overrides, config_hash, parse_override
from sim.specs.catalog import _data_dir, list_hardware, list_models, load_hardware, load_model
from sim.specs.model import model_from_hf_config
from sim.specs.scenario import scenario_from_dict, stable_identity

DEVICE_REPORTED_MIB = {"l4": 23034}
"""GPUs whose memory is what the card reports (ECC on), not the CSV's label (sim/data/hardware/l4.toml)."""


def test_every_gpu_spec_row_has_a_hardware_file_with_the_csv_numbers() -> None:
    with open_text(MEASURED_DATA / "aiconfigurator" / "gpu_specs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 14
    for row in rows:
        hw = load_hardware(row["system"])
        assert hw.hbm_bandwidth_bytes_per_s == float(row["mem_bw_bytes_per_s"])
        assert hw.hbm_capacity_bytes == DEVICE_REPORTED_MIB.get(row["system"], int(row["mem_capacity_bytes"]) >> 20) << 20
        assert hw.peak_flops_per_s["bf16"] == float(row["bf16_tc_flops"])
        assert hw.intra_node_link.bandwidth_bytes_per_s == float(row["intra_node_bw_bytes_per_s"])
        assert hw.num_sms > 0 and hw.l2_cache_bytes > 0 and hw.source
    assert "rtx_4090" in list_hardware()
    assert len(list_hardware()) == 16


def test_shipped_models_load_by_hf_id_and_alias() -> None:
    assert load_model("meta-llama/Llama-3.1-70B").num_layers == 80
    assert load_model("meta-llama/Meta-Llama-3.1-70B").hidden_size == 8192
    assert len(list_models()) == 25
    # Qwen's FP8 release is the same architecture with 128 x 128 block-scaled FP8 weights.
    fp8 = load_model("Qwen/Qwen3-235B-A22B-FP8")
    assert fp8.weight_quantization == "fp8_block" and load_model("Qwen/Qwen3-235B-A22B").weight_quantization is None
    assert fp8.num_layers == 94


def test_qwen35_hybrid_loads_with_its_published_sizes_and_layer_pattern() -> None:
    spec = load_model("Qwen/Qwen3.5-397B-A17B")
    la = spec.linear_attention
    assert la is not None and (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.conv_kernel_dim) == (16, 64, 128, 4)
    # full_attention_interval = 4: layers 3, 7, ... are gated softmax attention, the rest Gated DeltaNet.
    assert spec.num_linear_layers() == 45 and spec.num_attention_layers() == 15
    assert 3 not in spec.linear_layers and 0 in spec.linear_layers and spec.attn_output_gate and spec.qk_norm
    assert la.state_dtype.value == "float32"
    # The model card: 397B parameters, 17B active (language model; the vision tower is not counted).
    assert spec.num_params() == pytest.approx(397e9, rel=0.01)
    assert spec.num_active_params() == pytest.approx(17e9, rel=0.03)


def test_qwen3_next_parameter_count_matches_its_checkpoint() -> None:
    """Qwen3-Coder-Next (model_type qwen3_next, Qwen3-Next-80B-A3B's shapes): 79,674,391,296
    parameters in its checkpoint, 3,874,929,408 active (as an independent public model-size
    calculator's test reads its safetensors), every tensor counted, the shared expert's sigmoid
    gate (hidden -> 1 per layer) included."""
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "vocab_size": 151936,
           "head_dim": 256, "num_attention_heads": 16, "num_key_value_heads": 2, "num_experts": 512,
           "num_experts_per_tok": 10, "intermediate_size": 5120, "moe_intermediate_size": 512,
           "shared_expert_intermediate_size": 512, "linear_num_key_heads": 16, "linear_key_head_dim": 128,
           "linear_num_value_heads": 32, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
           "full_attention_interval": 4, "tie_word_embeddings": False, "max_position_embeddings": 262144}
    spec = model_from_hf_config(cfg, name="qwen3-next", source="config.json")
    assert spec.num_linear_layers() == 36 and spec.num_attention_layers() == 12
    assert spec.shared_expert_gate
    assert spec.num_params() == 79_674_391_296
    assert spec.num_active_params() == 3_874_929_408


def _tiny_config(**extra: object) -> dict[str, object]:
    return {"model_type": "qwen3_next", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 100,
            "max_position_embeddings": 256, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, **extra}


def test_full_attention_interval_sets_the_linear_layers_without_layer_types() -> None:
    spec = model_from_hf_config(_tiny_config(full_attention_interval=4), name="tiny", source="tiny.json")
    assert spec.linear_layers == (0, 1, 2, 4, 5, 6)
    assert spec.attention_layer_windows() == (0, 0)


@pytest.mark.parametrize(("extra", "key"), [
    ({"model_type": "llama"}, "linear_num_value_heads"),
    ({"full_attention_interval": 4, "linear_num_value_heads": 3}, "linear_num_value_heads"),
    ({"full_attention_interval": 4, "mamba_ssm_dtype": "int8"}, "mamba_ssm_dtype"),
    ({}, "full_attention_interval"),
])
def test_unmodelled_linear_attention_names_the_config_key(extra: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(_tiny_config(**extra), name="tiny", source="tiny.json")
    assert err.value.key == key and err.value.source == "tiny.json"


@pytest.mark.parametrize(("model", "params", "window"), [
    ("mistralai/Mistral-7B-v0.1", 7.24e9, 4096),  # published sizes: 7.24B, 6.74B, 68.98B
    ("meta-llama/Llama-2-7b-hf", 6.74e9, 0),
    ("meta-llama/Llama-2-70b-chat-hf", 68.98e9, 0),
])
def test_older_dense_checkpoints_ship_with_their_published_sizes(model: str, params: float, window: int) -> None:
    spec = load_model(model)
    assert spec.num_params() == pytest.approx(params, rel=0.002)
    assert set(spec.layer_window_tokens) == {window}


def test_moe_configs_parse() -> None:
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert mixtral.moe is not None and mixtral.moe.num_experts == 8
    assert mixtral.num_params() == pytest.approx(46.7e9, rel=0.005)
    oss = load_model("openai/gpt-oss-120b")
    assert oss.weight_quantization == "mxfp4" and oss.quantize_experts_only
    assert set(oss.layer_window_tokens) == {0, 128}
    qwen = load_model("Qwen/Qwen3-30B-A3B")
    assert qwen.qk_norm and qwen.num_active_params() == pytest.approx(3.3e9, rel=0.05)


@pytest.mark.parametrize(("model", "total", "moe_layers"), [
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 107.8e9, tuple(range(48))),
    ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400.7e9, tuple(range(1, 48, 2))),
])
def test_llama4_language_models_match_their_published_sizes(model: str, total: float,
                                                            moe_layers: tuple[int, ...]) -> None:
    """Meta publishes 17B active of 109B (Scout, vision tower included) and of 400B (Maverick): one
    routed expert of 8,192 plus one shared expert of 8,192 per MoE layer, the other layers a dense
    MLP of `intermediate_size_mlp` (16,384); chunked attention is priced as full attention."""
    spec = load_model(model)
    assert spec.moe is not None and spec.moe.num_experts_per_token == 1
    assert spec.moe.moe_layer_indices == moe_layers
    assert spec.moe.expert_intermediate_size == spec.moe.shared_expert_intermediate_size == 8192
    assert spec.intermediate_size == 16384
    assert spec.num_params() == pytest.approx(total, rel=0.002)
    assert spec.num_active_params() == pytest.approx(17.2e9, rel=0.01)
    assert set(spec.layer_window_tokens) == {0}
    assert spec.qk_norm == (spec.moe.num_experts == 16)  # Scout normalises q and k, Maverick does not
    assert load_model("nvidia/Llama-4-Maverick-17B-128E-Instruct-FP8").weight_quantization == "fp8"


def test_llama4_layer_lists_are_derived_without_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Without `moe_layers` the MoE layers follow Hugging Face's Llama4TextConfig (every
    `interleave_moe_layer_step`-th layer from step - 1); `use_qk_norm` defaults to true as there; a
    malformed `no_rope_layers` names its key."""
    text = {"model_type": "llama4_text", "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 32, "intermediate_size_mlp": 128,
            "vocab_size": 100, "max_position_embeddings": 4096, "num_local_experts": 4, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 3, "no_rope_layer_interval": 2, "attention_chunk_size": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "llama4", "text_config": text}))
    spec = load_model(str(path))
    assert spec.moe is not None and spec.moe.moe_layer_indices == (2, 5)
    assert spec.layer_window_tokens == (0,) * 6 and spec.qk_norm
    assert spec.intermediate_size == 128 and spec.moe.expert_intermediate_size == 32
    path.write_text(json.dumps({"model_type": "llama4", "text_config": {**text, "no_rope_layers": [1, 0]}}))
    with pytest.raises(ConfigError, match=r"text_config\.no_rope_layers"):
        load_model(str(path))


def test_any_config_json_path_loads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    model = load_model(str(path))
    assert model.head_dim == 16 and model.num_params() == 2 * (64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 128) + 2 * 6400 + 64


def test_deepseek_style_shared_experts_and_dense_first_layers() -> None:
    cfg = {"model_type": "deepseek", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "intermediate_size": 256, "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 2,
           "num_experts_per_tok": 2, "first_k_dense_replace": 1, "vocab_size": 100, "max_position_embeddings": 256}
    model = model_from_hf_config(cfg, name="x", source="x")
    assert model.moe is not None
    assert model.moe.moe_layer_indices == (1, 2, 3)
    assert model.moe.shared_expert_intermediate_size == 64


def test_scenario_resolves_vllm_device_defaults() -> None:
    h100 = scenario_from_dict(scenario_dict(), source="t")
    assert (h100.engine.max_num_seqs, h100.engine.max_num_batched_tokens) == (1024, 8192)
    a100 = scenario_from_dict(scenario_dict(hardware={"name": "a100_sxm"}), source="t")
    assert (a100.engine.max_num_seqs, a100.engine.max_num_batched_tokens) == (256, 2048)


@pytest.mark.parametrize(
    ("sections", "key"),
    [
        ({"engine": {"max_num_seq": 4}}, "engine.max_num_seq"),
        ({"engine": {"max_num_seqs": "many"}}, "engine.max_num_seqs"),
        ({"engine": {"tensor_parallel_size": 3}}, "engine.tensor_parallel_size"),
        ({"engine": {"gpu_memory_utilization": 1.5}}, "engine.gpu_memory_utilization"),
        ({"workload": {"random_input_len": 9000}}, "workload.random_input_len"),
        ({"hardware": {"name": "tpu_v5"}}, "hardware.name"),
        ({"hardware": {"name": "l40s", "pcie_peer_group_size": 3}}, "hardware.pcie_peer_group_size"),
        ({"hardware": {"name": "h100_sxm", "pcie_peer_group_size": 4}}, "hardware.pcie_peer_group_size"),
        ({"hardware": {"name": "l40s", "pcie_peer_group_size": 0}}, "hardware.pcie_peer_group_size"),
        ({"engine": {"enable_chunked_prefill": False, "max_num_batched_tokens": 1024}}, "engine.max_num_batched_tokens"),
    ],
)
def test_bad_scenarios_name_the_key(sections: dict[str, dict[str, object]], key: str) -> None:
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(scenario_dict(**sections), source="bad.toml")
    assert err.value.key == key
    assert "bad.toml" in str(err.value)


def test_hardware_section_sets_the_pcie_peer_groups_of_the_host(tmp_path: Path) -> None:
    paired = scenario_from_dict(scenario_dict(hardware={"name": "l40s"}), source="t")
    flat = scenario_from_dict(scenario_dict(hardware={"name": "l40s", "pcie_peer_group_size": 8}), source="t")
    assert (paired.hardware.pcie_peer_group_size, flat.hardware.pcie_peer_group_size) == (2, 8)
    # The host the l40s tables were measured on stays the reference of its fitted collectives.
    assert flat.hardware.tables_pcie_peer_group_size == 2
    assert paired.scenario_hash() != flat.scenario_hash()
    # Wired as its tables' host (or across the node): hashed as before the keys existed.
    for same in (paired, scenario_from_dict(scenario_dict(), source="t")):
        identity = stable_identity("hardware", same.hardware)
        assert "pcie_peer_group_size" not in identity and "tables_pcie_peer_group_size" not in identity
    assert stable_identity("hardware", flat.hardware)["pcie_peer_group_size"] == 8
    # A spec that does not say which wiring its fitted collectives describe cannot be moved off the node.
    text = (_data_dir() / "hardware" / "a100_pcie.toml").read_text()
    own = tmp_path / "my_pcie.toml"
    own.write_text("\n".join(line for line in text.splitlines() if "peer_group_size =" not in line) + "\n")
    assert scenario_from_dict(scenario_dict(hardware={"name": str(own)}), source="t").hardware.pcie_peer_group_size == 8
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(scenario_dict(hardware={"name": str(own), "pcie_peer_group_size": 2}), source="t")
    assert err.value.key == "hardware.pcie_peer_group_size" and "tables_pcie_peer_group_size" in str(err.value)
    # The catalog's PCIe GPUs say it: those at 32 GB/s share the l40s host's collectives (pairs).
    assert {(g, load_hardware(g).pcie_peer_group_size) for g in ("a100_pcie", "l4", "h100_pcie")} == {
        ("a100_pcie", 2), ("l4", 2), ("h100_pcie", 8)}


def test_disaggregated_pools_keep_or_set_their_pcie_peer_groups() -> None:
    base = scenario_dict(hardware={"name": "l40s", "pcie_peer_group_size": 8},
                         engine={"max_model_len": 8192, "tensor_parallel_size": 4})
    base["disaggregation"] = {"prefill": {"num_workers": 1, "hardware": "l40s"},
                              "decode": {"num_workers": 1, "pcie_peer_group_size": 4}}
    sc = scenario_from_dict(base, source="t")
    assert sc.disaggregation is not None
    prefill, decode = (pool.scenario.hardware for pool in sc.disaggregation.pools())
    assert (prefill.pcie_peer_group_size, decode.pcie_peer_group_size) == (8, 4)
    base["disaggregation"]["prefill"] = {"num_workers": 1, "hardware": "rtx_pro_6000_server"}
    other = scenario_from_dict(base, source="t").disaggregation
    assert other is not None and other.prefill.scenario.hardware.pcie_peer_group_size == 8  # its spec's
    base["disaggregation"]["decode"]["pcie_peer_group_size"] = 3
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(base, source="t")
    assert err.value.key == "disaggregation.decode.pcie_peer_group_size"


def test_overrides_rebuild_and_change_the_hash() -> None:
    base = scenario_from_dict(scenario_dict(), source="t")
    bigger = base.with_overrides({"engine.max_num_seqs": 64})
    assert bigger.engine.max_num_seqs == 64
    assert bigger.scenario_hash() != base.scenario_hash()
    assert base.with_overrides({}).scenario_hash() == base.scenario_hash()


def test_parse_override_reads_toml_literals() -> None:
    assert parse_override("engine.max_num_seqs=256") == ("engine.max_num_seqs", 256)
    assert parse_override("engine.enable_prefix_caching=false") == ("engine.enable_prefix_caching", False)
    assert parse_override("hardware.name=h200_sxm") == ("hardware.name", "h200_sxm")
    assert parse_override("workload.request_rate=inf")[1] == float("inf")
    assert apply_overrides({"a": {"b": 1}}, {"a.c": 2}) == {"a": {"b": 1, "c": 2}}


def test_config_hash_is_canonical() -> None:
    assert config_hash({"a": 1.0, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1.0})
    assert config_hash({"a": 0.1}) != config_hash({"a": 0.1000001})


# Published sizes: DeepSeek-V3/R1 671B main model + 14B MTP module = 685B on the Hub, 37B active;
# Kimi-K2/K2.5 "1T total, 32B activated" (model card; 1.04T in secondary sources); GLM-5 744B
# total, 40B active (GLM-5 technical report, arXiv 2602.15763), its MTP layer not included.
@pytest.mark.parametrize(("model", "total", "active", "mtp", "rel_total"), [
    ("deepseek-ai/DeepSeek-V3", 671e9, 37e9, 685e9, 0.01),
    ("deepseek-ai/DeepSeek-R1", 671e9, 37e9, 685e9, 0.01),
    ("moonshotai/Kimi-K2.5", 1.04e12, 32.6e9, None, 0.02),
    ("zai-org/GLM-5", 744e9, 40e9, None, 0.01),
])
def test_mla_models_match_published_parameter_counts(model: str, total: float, active: float, mtp: float | None,
                                                     rel_total: float) -> None:
    spec = load_model(model)
    assert spec.mla is not None
    assert spec.num_params() == pytest.approx(total, rel=rel_total)
    assert spec.num_active_params() == pytest.approx(active, rel=0.05)
    if mtp is not None:
        assert spec.num_params() + spec.mtp_params() == pytest.approx(mtp, rel=0.01)


def test_mla_attention_parameters_by_hand() -> None:
    spec = load_model("deepseek-ai/DeepSeek-V3")
    assert spec.mla is not None and spec.dsa is None and spec.num_nextn_predict_layers == 1
    h, heads = 7168, 128
    q = h * 1536 + 1536 + 1536 * heads * (128 + 64)  # q_a_proj, q_a_layernorm, q_b_proj
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
    o = heads * 128 * h
    assert spec.attention_params() == q + kv + o
    assert spec.moe is not None and spec.moe.moe_layer_indices[0] == 3  # first_k_dense_replace
    assert spec.moe.shared_expert_intermediate_size == 2048


def test_glm5_dsa_indexer_and_kimi_int4_experts() -> None:
    glm = load_model("zai-org/GLM-5")
    assert glm.dsa is not None and (glm.dsa.index_topk, glm.dsa.index_n_heads, glm.dsa.index_head_dim) == (2048, 32, 128)
    # wq_b from the 2048-wide query latent, wk, k_norm (weight + bias), weights_proj
    assert glm.indexer_params() == 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32
    kimi = load_model("moonshotai/Kimi-K2.5")
    assert kimi.weight_quantization == "int4_wo" and kimi.quantize_experts_only
    assert kimi.moe is not None and kimi.moe.num_experts == 384


def test_mla_model_without_query_bottleneck_uses_q_proj() -> None:
    cfg = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 1024, "kv_lora_rank": 16,
           "q_lora_rank": None, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    spec = model_from_hf_config(cfg, name="tiny", source="tiny.json")
    assert spec.mla is not None and spec.mla.q_lora_rank is None
    assert spec.attention_params() == 64 * 4 * 12 + 64 * 20 + 16 + 16 * 4 * 16 + 4 * 8 * 64


def test_nvl72_racks_are_one_nvlink_domain() -> None:
    from conftest import toy_hardware

    from sim.dtypes import DType
    from sim.graph.moe import ep_all_to_all_work
    from sim.serde import FieldError

    gb200 = load_hardware("gb200")
    assert (gb200.num_gpus_per_node, gb200.nvlink_domain_size) == (4, 72)
    assert gb200.link_for_group(72) is gb200.intra_node_link
    assert gb200.link_for_group(73) is gb200.inter_node_link
    # What leaves the rack goes over the network (the source YAML's inter_rack_bw), not NVLink:
    # until 2026-12-02 a 144-GPU all-reduce on GB200 was priced ~9x too fast.
    for name in ("gb200", "gb300"):
        out = load_hardware(name).link_for_group(144)
        assert (out.kind, out.bandwidth_bytes_per_s) == ("infiniband", 100e9)
    h100 = load_hardware("h100_sxm")
    assert h100.nvlink_domain_size == h100.num_gpus_per_node == 8  # default: one node
    assert h100.link_for_group(16) is h100.inter_node_link
    rack = toy_hardware(nvlink_domain_size=32)
    assert rack.link_for_group(32) is rack.intra_node_link and rack.link_for_group(33) is rack.inter_node_link
    # EP 32 inside one domain is one "node" for DeepEP; EP 64 spans two.
    for ep, nodes in ((32, 1), (64, 2)):
        work = ep_all_to_all_work(tokens_per_rank=8, hidden=7168, topk=8, num_experts=256, ep=ep,
                                  nvlink_domain=rack.nvlink_domain(), fp8_dispatch=rack.supports(DType.FP8),
                                  decode_only=True)
        assert work.shape[-1] == nodes
    with pytest.raises(FieldError) as err:
        toy_hardware(nvlink_domain_size=12)
    assert err.value.key == "nvlink_domain_size"


def test_catalog_files_are_parsed_once_per_version(tmp_path: Path) -> None:
    """Hardware and model files are kept parsed while unchanged (a sweep builds a scenario per trial),
    read again once edited, and a broken file fails on every load (nothing is kept for it)."""
    assert load_hardware("h100_sxm") is load_hardware("h100_sxm")
    assert load_model("meta-llama/Llama-3.1-8B") is load_model("meta-llama/Llama-3.1-8B")
    shipped = Path(str(resources.files("sim") / "data" / "hardware" / "h100_sxm.toml")).read_text()
    path = tmp_path / "my_gpu.toml"
    path.write_text(shipped)
    first = load_hardware(str(path))
    assert load_hardware(str(path)) is first
    path.write_text(shipped.replace('name = "h100_sxm"', 'name = "my_gpu"  # renamed'))
    assert load_hardware(str(path)).name == "my_gpu"
    path.write_text("[broken")
    for _ in range(2):
        with pytest.raises(ConfigError, match="invalid TOML"):
            load_hardware(str(path))
    config = tmp_path / "config.json"
    hf = json.loads(Path(str(resources.files("sim") / "data" / "models" / "meta-llama--Meta-Llama-3.1-8B_config.json")).read_text())
    config.write_text(json.dumps(hf))
    assert load_model(str(config)).num_layers == hf["num_hidden_layers"]
    config.write_text(json.dumps({**hf, "num_hidden_layers": 7}))
    assert load_model(str(config)).num_layers == 7


def test_a_scenario_hash_holds_its_files_by_content(tmp_path: Path) -> None:
    """A trace (or rate profile, or calibration) enters the hash by its bytes: the same file in two
    directories hashes the same, an edited one differently (before 2026-12-02 the hash held the path,
    so `--resume` and the sweep cache took results of an edited trace)."""
    from sim.specs.scenario import load_scenario_file

    def scenario(directory: Path, rows: str) -> Path:
        directory.mkdir(exist_ok=True)
        (directory / "t.csv").write_text("input_tokens,output_tokens\n" + rows)
        path = directory / "s.toml"
        path.write_text('seed = 0\n[hardware]\nname = "h100_sxm"\n[model]\nname = "meta-llama/Llama-3.1-8B"\n'
                        '[engine]\nmax_model_len = 8192\n[workload]\ndataset_name = "custom"\ndataset_path = "t.csv"\n'
                        'num_prompts = 2\n')
        return path

    a = load_scenario_file(scenario(tmp_path / "a", "100,10\n200,20\n")).scenario_hash()
    b = load_scenario_file(scenario(tmp_path / "b", "100,10\n200,20\n")).scenario_hash()
    edited = load_scenario_file(scenario(tmp_path / "a", "4000,500\n4000,500\n")).scenario_hash()
    assert a == b and edited != a


def test_specs_pickle_for_worker_processes() -> None:
    """Specs hold their tables as read-only mapping proxies; worker processes receive them (validate's
    pool, `--fit-profiles`' candidate profiles: before 2026-12-02 `validate --fit-profiles --jobs 2`
    failed with "cannot pickle 'mappingproxy' object")."""
    import pickle

    from conftest import REPO

    from sim.api import load_engine_profile, load_scenario

    profile = load_engine_profile("sglang")
    assert pickle.loads(pickle.dumps(profile)) == profile
    scenario = load_scenario(REPO / "scenarios" / "llama3_8b-h100-disagg-1p1d.toml")
    again = pickle.loads(pickle.dumps(scenario))
    assert again == scenario and again.scenario_hash() == scenario.scenario_hash()


def test_concurrent_partial_prefill_is_refused_as_vllm_v1_refuses_it() -> None:
    """vLLM v1: "Concurrent Partial Prefill is not supported"; the simulator accepted 2 and ignored it."""
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(scenario_dict(engine={"max_num_partial_prefills": 2}), source="t.toml")
    assert info.value.key == "engine.max_num_partial_prefills"
    scenario_from_dict(scenario_dict(engine={"max_num_partial_prefills": 1}), source="t.toml")


def test_default_cuda_graph_capture_size_follows_vllm_with_speculation_and_token_budget() -> None:
    # vLLM `_set_cudagraph_sizes`: min(max_num_seqs x (1 + k) x 2, 512), then at most max_num_batched_tokens.
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}

    def capture(**engine: object) -> int | None:
        return scenario_from_dict(scenario_dict(engine={"max_num_seqs": 48, **engine}), source="t").engine \
            .max_cudagraph_capture_size

    assert capture() == 96
    assert capture(speculative_config=eagle3) == 384  # 48 x 4 x 2
    assert capture(max_num_batched_tokens=64) == 64
    assert capture(max_num_seqs=1024, speculative_config=eagle3) == 512
    # SGLang and TensorRT-LLM count requests: their cap does not grow with the drafts.
    assert capture(backend="sglang", speculative_config=eagle3) == 96
    assert capture(max_cudagraph_capture_size=200, speculative_config=eagle3) == 200
