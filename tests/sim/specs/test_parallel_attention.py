"""GPT-J and Falcon: attention beside an ungated GELU MLP, their configs' own key names, and a
scenario that serves past the config's positions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import scenario_dict

from sim.api import step_graph
from sim.errors import ConfigError
from sim.graph.batch import BatchShape
from sim.graph.kernels import KernelKind
from sim.graph.memory import weight_bytes_per_gpu
from sim.specs.catalog import load_model
from sim.specs.model import model_from_hf_config
from sim.specs.scenario import scenario_from_dict


def test_shipped_configs_give_the_published_sizes() -> None:
    gptj = load_model("EleutherAI/gpt-j-6b")
    assert (gptj.hidden_size, gptj.num_layers, gptj.num_attention_heads, gptj.head_dim) == (4096, 28, 16, 256)
    assert gptj.intermediate_size == 4 * 4096 and gptj.num_kv_heads == 16  # n_inner null: 4 x n_embd
    assert (gptj.mlp_gated, gptj.mlp_bias, gptj.parallel_attention, gptj.layer_norms_per_layer) == (
        False, True, True, 1)
    assert gptj.num_params() == pytest.approx(6.05e9, rel=0.002)  # EleutherAI's 6,053,381,344
    falcon = load_model("tiiuae/falcon-180B")
    assert (falcon.num_attention_heads, falcon.num_kv_heads, falcon.head_dim) == (232, 8, 64)
    assert falcon.layer_norms_per_layer == 2 and falcon.tie_word_embeddings  # new decoder architecture
    assert falcon.num_params() == pytest.approx(178.6e9, rel=0.002)


def _falcon(**keys: Any) -> dict[str, Any]:
    return {"model_type": "falcon", "hidden_size": 4544, "num_hidden_layers": 32, "num_attention_heads": 71,
            "vocab_size": 65024, "max_position_embeddings": 2048, **keys}


def test_falcon_7b_layout_is_multi_query_with_one_norm() -> None:
    spec = model_from_hf_config(_falcon(parallel_attn=True, multi_query=True), name="f7", source="c.json")
    assert spec.num_kv_heads == 1 and spec.layer_norms_per_layer == 1 and spec.intermediate_size == 4 * 4544
    # A re-saved config writes num_kv_heads = num_attention_heads; the old layer still has one KV head.
    resaved = model_from_hf_config(_falcon(multi_query=True, num_kv_heads=71), name="f7", source="c.json")
    assert resaved.num_kv_heads == 1
    # FalconConfig's default context where the file leaves it out.
    bare = {k: v for k, v in _falcon().items() if k != "max_position_embeddings"}
    assert model_from_hf_config(bare, name="f7", source="c.json").max_position_embeddings == 2048
    new = model_from_hf_config(_falcon(new_decoder_architecture=True, num_attention_heads=128, hidden_size=8192,
                                       num_kv_heads=8), name="f40", source="c.json")
    assert new.num_kv_heads == 8 and new.layer_norms_per_layer == 2  # Falcon-40B's layer


@pytest.mark.parametrize(("config", "key", "words"), [
    (_falcon(alibi=True), "alibi", "ALiBi"),
    (_falcon(parallel_attn=False), "parallel_attn", "sequential"),
    (_falcon(activation="relu"), "activation", "gelu"),
    ({"model_type": "gptj", "n_embd": 4096, "n_layer": 28, "n_head": 16, "n_positions": 2048, "vocab_size": 50400,
      "activation_function": "relu"}, "activation_function", "gelu"),
    ({"model_type": "gptj", "n_layer": 28, "n_head": 16, "n_positions": 2048, "vocab_size": 50400}, "n_embd",
     "required"),
    # The spec's own checks name the architecture's keys too.
    ({"model_type": "gptj", "n_embd": 4096, "n_layer": 0, "n_head": 16, "vocab_size": 50400}, "n_layer", "> 0"),
    (_falcon(ffn_hidden_size=0), "ffn_hidden_size", "> 0"),
])
def test_config_errors_name_the_architectures_own_key(config: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        model_from_hf_config(config, name="x", source="c.json")
    assert err.value.key == key and words in err.value.rule and err.value.source == "c.json"


def _nodes(model: str, tp: int, batch: BatchShape, **model_keys: Any) -> dict[str, tuple[Any, int]]:
    sc = scenario_from_dict(scenario_dict(model={"name": model, **model_keys},
                                          engine={"tensor_parallel_size": tp, "max_model_len": 2048}), source="t")
    return {n.work.name: (n.work, n.repeat) for n in step_graph(sc, batch).nodes}


def test_parallel_layer_reduces_once_and_runs_an_ungated_mlp() -> None:
    nodes = _nodes("tiiuae/falcon-180B", 8, BatchShape(decode_context_tokens=(1000,) * 8),
                   max_position_embeddings=4096)
    names = set(nodes)
    assert "attn_all_reduce" not in names and "mlp_all_reduce" not in names
    work, repeat = nodes["layer_all_reduce"]
    assert work.kind is KernelKind.ALL_REDUCE and repeat == 80  # one per layer: attention + MLP summed first
    assert {"mlp_up_proj", "mlp_gelu", "mlp_down_proj"} <= names and "mlp_gate_up_proj" not in names
    up, _ = nodes["mlp_up_proj"]
    assert up.flops == 2 * 8 * (4 * 14848 // 8) * 14848  # one matrix, 4 x hidden wide, sharded over TP 8
    assert nodes["post_attention_layernorm"][1] == 80  # Falcon-180B: one norm per branch
    gptj = _nodes("EleutherAI/gpt-j-6b", 1, BatchShape(decode_context_tokens=(100,)))
    assert "post_attention_layernorm" not in gptj and "layer_all_reduce" not in gptj  # one norm, one GPU


def test_llama_layer_is_unchanged() -> None:
    nodes = _nodes("meta-llama/Llama-3.1-8B", 2, BatchShape(decode_context_tokens=(100,)))
    assert nodes["attn_all_reduce"][1] == nodes["mlp_all_reduce"][1] == 32
    assert "mlp_gate_up_proj" in nodes and "mlp_silu_and_mul" in nodes and "layer_all_reduce" not in nodes


def test_weights_per_gpu_follow_the_parameter_count() -> None:
    sc = scenario_from_dict(scenario_dict(model={"name": "EleutherAI/gpt-j-6b"}, engine={"max_model_len": 2048}),
                            source="t")
    assert weight_bytes_per_gpu(sc.model, sc.engine, sc.precision) == pytest.approx(2 * sc.model.num_params(),
                                                                                     rel=0.01)


def test_a_scenario_serves_past_the_configs_positions_only_when_asked(tmp_path: Path) -> None:
    asked = scenario_dict(model={"name": "EleutherAI/gpt-j-6b"}, engine={"max_model_len": 4096})
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(asked, source="s.toml")
    assert err.value.key == "engine.max_model_len" and "max_position_embeddings=2048" in err.value.rule
    longer = scenario_from_dict(scenario_dict(model={"name": "EleutherAI/gpt-j-6b", "max_position_embeddings": 4096},
                                              engine={"max_model_len": 4096}), source="s.toml")
    assert longer.model.max_position_embeddings == 4096 and longer.engine.max_model_len == 4096
    with pytest.raises(ConfigError) as err:
        scenario_from_dict(scenario_dict(model={"name": "EleutherAI/gpt-j-6b", "max_position_embeddings": 0}),
                           source="s.toml")
    assert err.value.key == "model.max_position_embeddings"


def test_an_eagle_head_of_a_parallel_model_is_a_llama_layer() -> None:
    from sim.specs.speculative import SpeculativeConfig, draft_model_spec

    head = draft_model_spec(load_model("EleutherAI/gpt-j-6b"), SpeculativeConfig(method="eagle",
                            num_speculative_tokens=3), load_model)
    assert head is not None and head.num_layers == 1
    assert (head.mlp_gated, head.mlp_bias, head.parallel_attention, head.layer_norms_per_layer) == (
        True, False, False, 2)


def test_the_vllm_line_allows_the_longer_context(tmp_path: Path) -> None:
    from orchestrator.sweep.vllm_command import vllm_serve_command

    longer = scenario_from_dict(scenario_dict(model={"name": "EleutherAI/gpt-j-6b", "max_position_embeddings": 4096},
                                              engine={"max_model_len": 4096}), source="s.toml")
    assert vllm_serve_command(longer).startswith("VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 vllm serve EleutherAI/gpt-j-6b")
    plain = scenario_from_dict(scenario_dict(model={"name": "EleutherAI/gpt-j-6b"}, engine={"max_model_len": 2048}),
                               source="s.toml")
    assert vllm_serve_command(plain).startswith("vllm serve EleutherAI/gpt-j-6b")
