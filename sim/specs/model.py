"""Architecture numbers of a decoder-only LLM, read from a Hugging Face `config.json`.

Supported: dense GQA/MHA decoders (Llama, Mistral, Qwen2/3), per-layer sliding windows
(`layer_types`, Mistral `sliding_window`, Qwen `use_sliding_window`), MoE decoders (Mixtral,
Qwen2/3-MoE, gpt-oss, MiniMax-M2, DeepSeek-MoE-style shared experts and leading dense layers),
multi-head latent attention (DeepSeek-V3/R1, Kimi-K2/K2.5; `MLASpec`) with DeepSeek sparse attention
(GLM-5; `DSASpec`); Llama 4 (Scout, Maverick: top-1 experts plus a shared expert, MoE layers
interleaved with dense ones of `intermediate_size_mlp`, chunked local attention on the RoPE layers
priced as full attention, exact up to `attention_chunk_size` tokens of context and dearer past it); hybrid
models whose `layer_types` mix Gated DeltaNet linear attention with gated full attention
(Qwen3.5-MoE, Qwen3-Next; `LinearAttentionSpec`). Features the kernel graph cannot represent
(other linear-attention variants, vision towers of configs without a `text_config`) raise
`ConfigError` naming the config key; nothing is silently approximated (Llama 4's chunked attention
is the one stated approximation above; its qk norm, which Hugging Face applies on the RoPE layers
only, is priced on every layer). A multimodal config with a `text_config` (Kimi-K2.5,
Qwen3.5, Llama 4) is read as its language model: the vision tower (Kimi-K2.5's MoonViT, ~0.4B
parameters) is neither computed nor counted.

The multi-token-prediction layers (`num_nextn_predict_layers`) are counted by `mtp_params` but not
by `num_params`: vLLM's DeepSeek-V2/V3 loader skips them for the main model ("skip spec decode
layers for main model") and loads them only into the separate MTP drafter when speculative decoding
is configured (`[engine] speculative_config`, method `mtp`; `sim.graph.memory.draft_memory_bytes`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from sim.dtypes import DType
from sim.errors import ConfigError
from sim.serde import FieldError, require

WeightQuantization = Literal["fp8", "fp8_block", "mxfp4", "int4_wo"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): queries through an optional low-rank
    bottleneck, keys and values decompressed per head from one shared latent per token."""

    q_lora_rank: int | None
    """Width of the query bottleneck (q_a_proj -> q_a_layernorm -> q_b_proj); None = plain q_proj."""
    kv_lora_rank: int
    """Width of the compressed KV latent (the part of the KV cache shared by all heads)."""
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    """Per-head query width carrying RoPE; keys carry one shared RoPE part of this width."""
    v_head_dim: int

    def __post_init__(self) -> None:
        for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            value = getattr(self, key)
            require(value > 0, key, value, "must be > 0")
        require(self.q_lora_rank is None or self.q_lora_rank > 0, "q_lora_rank", self.q_lora_rank,
                "must be > 0 or null")

    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def latent_width(self) -> int:
        """Elements one token stores in the latent KV cache per layer: kv_lora_rank + rope part."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True, kw_only=True)
class DSASpec:
    """DeepSeek sparse attention (DeepSeek-V3.2, GLM-5): a lightning indexer scores every cached
    token per query with `index_n_heads` small heads and the MLA attends to the top `index_topk`."""

    index_topk: int
    index_n_heads: int
    index_head_dim: int

    def __post_init__(self) -> None:
        for key in ("index_topk", "index_n_heads", "index_head_dim"):
            value = getattr(self, key)
            require(value > 0, key, value, "must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearAttentionSpec:
    """Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): per layer `in_proj_qkvz` (q and k of
    `num_key_heads` x `key_head_dim`, v and the output gate z of `num_value_heads` x
    `value_head_dim`), `in_proj_ba` (the decay and write gates, one each per value head), a causal
    depthwise conv of width `conv_kernel_dim` over q, k and v, the gated delta rule against a
    recurrent state of key_head_dim x value_head_dim per value head, a gated RMSNorm and `out_proj`.
    A request keeps that state and the conv's last `conv_kernel_dim - 1` inputs per layer, whatever
    its length: no KV cache grows in these layers."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel_dim: int
    state_dtype: DType = DType.FLOAT32
    """Format of the recurrent state (`mamba_ssm_dtype`)."""

    def __post_init__(self) -> None:
        for key in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim"):
            value = getattr(self, key)
            require(value > 0, key, value, "must be > 0")
        require(self.num_value_heads % self.num_key_heads == 0, "linear_num_value_heads", self.num_value_heads,
                f"must be a multiple of linear_num_key_heads={self.num_key_heads}")

    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    def conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v."""
        return 2 * self.key_dim() + self.value_dim()

    def state_elements(self) -> int:
        """Recurrent state elements of one sequence in one layer."""
        return self.num_value_heads * self.key_head_dim * self.value_head_dim

    def conv_state_elements(self) -> int:
        """The conv's last `conv_kernel_dim - 1` inputs of one sequence in one layer."""
        return self.conv_dim() * (self.conv_kernel_dim - 1)

    def per_rank(self, tp: int) -> LinearAttentionSpec:
        """The shapes on one of `tp` tensor-parallel ranks: heads split over the ranks (`check`
        refuses a TP that does not divide them)."""
        return dataclasses.replace(self, num_key_heads=max(1, self.num_key_heads // tp),
                                   num_value_heads=max(1, self.num_value_heads // tp))

    def params(self, hidden: int) -> int:
        """in_proj_qkvz, in_proj_ba, conv1d weights, A_log, dt_bias, the gated norm's weight and
        out_proj of one layer."""
        qkvz = hidden * (2 * self.key_dim() + 2 * self.value_dim())
        ba = hidden * 2 * self.num_value_heads
        conv = self.conv_dim() * self.conv_kernel_dim
        return qkvz + ba + conv + 2 * self.num_value_heads + self.value_head_dim + self.value_dim() * hidden


@dataclass(frozen=True, slots=True, kw_only=True)
class MoESpec:
    """Routed experts of the MoE layers (per whole model, before any parallel split)."""

    num_experts: int
    num_experts_per_token: int
    expert_intermediate_size: int
    moe_layer_indices: tuple[int, ...]
    """Layers whose MLP is the routed MoE block; the rest use the dense MLP."""
    shared_expert_intermediate_size: int = 0
    """Total intermediate width of the always-on shared expert(s); 0 when there are none."""
    expert_bias: bool = False
    """Experts carry biases (gpt-oss)."""

    def __post_init__(self) -> None:
        require(self.num_experts > 0, "num_experts", self.num_experts, "must be > 0")
        require(0 < self.num_experts_per_token <= self.num_experts, "num_experts_per_token",
                self.num_experts_per_token, f"must be in 1..num_experts={self.num_experts}")
        require(self.expert_intermediate_size > 0, "expert_intermediate_size",
                self.expert_intermediate_size, "must be > 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Shapes of one decoder-only transformer. Parameter counts are methods."""

    name: str
    """Hugging Face id or config path the spec was loaded from."""
    model_type: str
    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    """Dense MLP width (layers that are not MoE)."""
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    """Bias on the QKV (and, for gpt-oss, O) projections."""
    qk_norm: bool = False
    """RMSNorm on q and k per head (Qwen3, MiniMax-M2)."""
    qk_norm_across_heads: bool = False
    """The q and k norms run over all heads at once (`qk_norm_type = "per_layer"`, MiniMax-M2): their
    weights are as wide as q and k. (Each TP rank holds some heads, so vLLM all-reduces the per-token
    variances every layer, `MiniMaxText01RMSNormTP.forward_qk`; not priced: docs/moe-mla.md.)"""
    layer_window_tokens: tuple[int, ...]
    """Attention window per layer; 0 is full causal attention."""
    moe: MoESpec | None = None
    torch_dtype: DType = DType.BFLOAT16
    weight_quantization: WeightQuantization | None = None
    """Checkpoint quantization from `quantization_config`."""
    quantize_experts_only: bool = False
    """The checkpoint quantizes only the expert weights (gpt-oss mxfp4, Kimi-K2.5 int4)."""
    int4_group_size: int = 0
    """Weight-only int4: weights per 16-bit scale (compressed-tensors `group_size`; 0 otherwise)."""
    mla: MLASpec | None = None
    """Multi-head latent attention; None = GQA/MHA with `num_kv_heads` x `head_dim` K and V."""
    dsa: DSASpec | None = None
    """DeepSeek sparse attention on top of `mla`; None = dense attention."""
    num_nextn_predict_layers: int = 0
    """Multi-token-prediction layers in the checkpoint (not loaded for serving; see `mtp_params`)."""
    linear_attention: LinearAttentionSpec | None = None
    """Gated DeltaNet shapes of the `linear_layers`; None = every layer is softmax attention."""
    linear_layers: tuple[int, ...] = ()
    """Layers whose token mixer is linear attention (`layer_types` "linear_attention")."""
    attn_output_gate: bool = False
    """The full-attention layers gate their output with sigmoid(q_proj's second half) (Qwen3-Next)."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by sigmoid(hidden -> 1) (Qwen2-MoE, Qwen3-Next, Qwen3.5)."""
    mlp_gated: bool = True
    """The dense MLP is gate-up, SiLU-and-multiply, down (Llama); False: up, GELU, down (GPT-J, Falcon)."""
    mlp_bias: bool = False
    """Biases on the dense MLP's projections (GPT-J); priced as part of the GEMMs, counted in the parameters."""
    parallel_attention: bool = False
    """Attention and MLP read the same normed input and add to one residual (GPT-J, Falcon): under TP
    their partial outputs are summed and reduced once per layer."""
    layer_norms_per_layer: int = 2
    """Norms per decoder layer: input and post-attention (Llama), one shared by both branches (GPT-J,
    Falcon-7B) or one per branch (Falcon's new decoder architecture)."""

    def __post_init__(self) -> None:
        for key in ("hidden_size", "num_layers", "num_attention_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "max_position_embeddings"):
            value = getattr(self, key)
            require(value > 0, key, value, "must be > 0")
        require(self.num_attention_heads % self.num_kv_heads == 0, "num_key_value_heads",
                self.num_kv_heads, f"must divide num_attention_heads={self.num_attention_heads}")
        require(len(self.layer_window_tokens) == self.num_layers, "layer_types",
                len(self.layer_window_tokens), f"must list num_hidden_layers={self.num_layers} layers")
        require(self.dsa is None or self.mla is not None, "index_topk", None if self.dsa is None
                else self.dsa.index_topk, "DeepSeek sparse attention is modelled on MLA models only")
        require(bool(self.linear_layers) == (self.linear_attention is not None), "layer_types",
                len(self.linear_layers), "linear_attention layers need the linear_* shapes and vice versa")
        require(not self.linear_layers or self.mla is None, "layer_types", "linear_attention",
                "linear attention is modelled with GQA full-attention layers only")
        require(all(0 <= i < self.num_layers for i in self.linear_layers), "layer_types", self.linear_layers,
                f"linear layer indices must be in 0..{self.num_layers - 1}")
        require(self.layer_norms_per_layer in (1, 2), "layer_norms_per_layer", self.layer_norms_per_layer,
                "must be 1 or 2")
        require(self.parallel_attention or self.layer_norms_per_layer == 2, "parallel_attn", False,
                "a sequential decoder layer has two norms")

    def with_attention_window(self, window_tokens: int) -> ModelSpec:
        """The model with every layer's attention window set to `window_tokens` (0: full attention),
        as an engine that overrides the config's sliding windows runs it."""
        return replace(self, layer_window_tokens=(window_tokens,) * self.num_layers)

    def num_linear_layers(self) -> int:
        return len(self.linear_layers)

    def num_attention_layers(self) -> int:
        """Layers with softmax attention (and a KV cache)."""
        return self.num_layers - len(self.linear_layers)

    def attention_layer_windows(self) -> tuple[int, ...]:
        """`layer_window_tokens` of the softmax-attention layers only."""
        if not self.linear_layers:
            return self.layer_window_tokens
        linear = set(self.linear_layers)
        return tuple(w for i, w in enumerate(self.layer_window_tokens) if i not in linear)

    def q_width(self) -> int:
        return self.num_attention_heads * self.head_dim

    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer in self.moe.moe_layer_indices

    def num_moe_layers(self) -> int:
        return 0 if self.moe is None else len(self.moe.moe_layer_indices)

    def attention_params(self) -> int:
        """One softmax-attention layer's projections (linear-attention layers: `token_mixer_params`)."""
        if self.mla is not None:
            return self.mla_params() + self.indexer_params()
        h = self.hidden_size
        gate = self.q_width() if self.attn_output_gate else 0
        params = h * (self.q_width() + gate) + 2 * h * self.kv_width() + self.q_width() * h
        if self.attention_bias:
            params += self.q_width() + 2 * self.kv_width()
        if self.qk_norm:
            params += self.q_width() + self.kv_width() if self.qk_norm_across_heads else 2 * self.head_dim
        return params

    def token_mixer_params(self, layer: int) -> int:
        """Attention or, in a linear layer, Gated DeltaNet parameters of `layer`."""
        if self.linear_attention is not None and layer in self.linear_layers:
            return self.linear_attention.params(self.hidden_size)
        return self.attention_params()

    def mla_params(self) -> int:
        """q_a_proj, q_a_layernorm, q_b_proj (or q_proj), kv_a_proj_with_mqa, kv_a_layernorm,
        kv_b_proj and o_proj of one layer."""
        assert self.mla is not None
        m, h, heads = self.mla, self.hidden_size, self.num_attention_heads
        q_out = heads * m.qk_head_dim()
        q = h * q_out if m.q_lora_rank is None else h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * q_out
        kv = h * m.latent_width() + m.kv_lora_rank + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        return q + kv + heads * m.v_head_dim * h

    def indexer_params(self) -> int:
        """The lightning indexer of one layer: wq_b (from the query latent), wk, k_norm (LayerNorm
        weight and bias), weights_proj (one gate per indexer head)."""
        if self.dsa is None:
            return 0
        assert self.mla is not None
        d, h = self.dsa, self.hidden_size
        q_in = self.mla.q_lora_rank or h
        return q_in * d.index_n_heads * d.index_head_dim + h * d.index_head_dim + 2 * d.index_head_dim \
            + h * d.index_n_heads

    def mtp_params(self) -> int:
        """Parameters of the multi-token-prediction layers (DeepSeek-V3 MTP module): per layer
        a full MoE decoder layer, enorm, hnorm, eh_proj (2h -> h), its own embedding, final norm
        and head, as the checkpoint stores them."""
        if not self.num_nextn_predict_layers:
            return 0
        h = self.hidden_size
        layer = self.attention_params() + 2 * h
        if self.moe is not None:
            routed, other = self.moe_block_params()
            layer += routed + other
        else:
            layer += self.dense_mlp_params()
        per = layer + 2 * h + 2 * h * h + self.embedding_params() + h + self.vocab_size * h
        return self.num_nextn_predict_layers * per

    def dense_mlp_matrices(self) -> int:
        """Weight matrices of the dense MLP: gate, up, down (gated) or up, down."""
        return 3 if self.mlp_gated else 2

    def dense_mlp_params(self) -> int:
        params = self.dense_mlp_matrices() * self.hidden_size * self.intermediate_size
        return params + (self.intermediate_size + self.hidden_size if self.mlp_bias else 0)

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        assert self.moe is not None
        params = 3 * self.hidden_size * self.moe.expert_intermediate_size
        if self.moe.expert_bias:
            params += 2 * self.moe.expert_intermediate_size + self.hidden_size
        return params

    def moe_block_params(self) -> tuple[int, int]:
        """(routed expert parameters, router plus shared-expert parameters) of one MoE layer."""
        assert self.moe is not None
        routed = self.moe.num_experts * self.expert_params()
        shared = 3 * self.hidden_size * self.moe.shared_expert_intermediate_size
        if self.shared_expert_gate:
            shared += self.hidden_size
        other = self.hidden_size * self.moe.num_experts + shared
        return routed, other

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def num_params(self) -> int:
        """All parameters, counted from shapes (norm weights included)."""
        total = self.embedding_params() + self.lm_head_params() + self.hidden_size
        for layer in range(self.num_layers):
            total += self.token_mixer_params(layer) + self.layer_norms_per_layer * self.hidden_size
            if self.is_moe_layer(layer):
                routed, other = self.moe_block_params()
                total += routed + other
            else:
                total += self.dense_mlp_params()
        return total

    def num_active_params(self) -> int:
        """Parameters touched by one token (top-k experts only)."""
        if self.moe is None:
            return self.num_params()
        routed, _ = self.moe_block_params()
        inactive = routed - self.moe.num_experts_per_token * self.expert_params()
        return self.num_params() - inactive * self.num_moe_layers()


_SUPPORTED_MODEL_TYPES: Final = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "gpt_oss",
    "minimax_m2", "deepseek", "deepseek_v3", "kimi_k2", "glm_moe_dsa", "qwen3_next", "qwen3_5_moe_text",
    "qwen3_5_moe", "llama4_text", "gptj", "falcon",
)
_PARALLEL_ATTENTION_TYPES: Final = ("gptj", "falcon")
"""Architectures whose decoder layer runs attention and a GELU MLP side by side (`_parallel_layer`)."""
_KEY_ALIASES: Final[dict[str, dict[str, str]]] = {
    "gptj": {"hidden_size": "n_embd", "num_hidden_layers": "n_layer", "num_attention_heads": "n_head",
             "max_position_embeddings": "n_positions", "intermediate_size": "n_inner",
             "hidden_act": "activation_function"},
    "falcon": {"num_key_value_heads": "num_kv_heads", "intermediate_size": "ffn_hidden_size",
               "hidden_act": "activation"},
}
"""config.json keys of architectures that name the standard fields otherwise (errors name theirs)."""
_GATED_DELTANET_TYPES: Final = ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe")
_DTYPES: Final = {"bfloat16": DType.BFLOAT16, "float16": DType.FLOAT16, "float32": DType.FLOAT32}


def model_from_hf_config(config: Mapping[str, Any], *, name: str, source: str) -> ModelSpec:
    """Build a `ModelSpec` from a parsed `config.json`; `source` names the file in errors."""
    try:
        return _model_from_hf_config(config, name=name, source=source)
    except FieldError as exc:
        # The spec's own checks name its fields; the message names the config.json key (the
        # architecture's own name for it: GPT-J's `n_layer`).
        table = config.get("text_config", config)
        aliases = _KEY_ALIASES.get(str(table.get("model_type")) if isinstance(table, Mapping) else "", {})
        key = _CONFIG_KEYS.get(exc.key, exc.key)
        prefix = "text_config." if "text_config" in config else ""
        raise ConfigError(source=source, key=prefix + aliases.get(key, key), value=exc.value,
                          rule=exc.rule) from None


_CONFIG_KEYS: Final = {"num_layers": "num_hidden_layers", "num_kv_heads": "num_key_value_heads",
                       "layer_window_tokens": "layer_types", "num_experts_per_token": "num_experts_per_tok",
                       "expert_intermediate_size": "moe_intermediate_size"}
"""`ModelSpec`/`MoESpec` fields whose config.json key has another name."""


def _model_from_hf_config(config: Mapping[str, Any], *, name: str, source: str) -> ModelSpec:
    reader = _ConfigReader(config, source=source, prefix="")
    if "text_config" in config:
        reader = _ConfigReader(reader.table("text_config"), source=source, prefix="text_config.")
    model_type = reader.string("model_type")
    reader = reader.with_aliases(_KEY_ALIASES.get(model_type, {}))
    if reader.get("linear_num_value_heads") is not None and model_type not in _GATED_DELTANET_TYPES:
        reader.fail("linear_num_value_heads", reader.get("linear_num_value_heads"),
                    f"linear attention is modelled as Gated DeltaNet for {', '.join(_GATED_DELTANET_TYPES)} only")
    if model_type not in _SUPPORTED_MODEL_TYPES:
        reader.fail("model_type", model_type,
                    f"architecture not supported; supported: {', '.join(_SUPPORTED_MODEL_TYPES)}")
    if "vision_config" in config and "text_config" not in config:
        raise ConfigError(source=source, key="vision_config", value="{...}",
                          rule="vision encoders are not modelled; use the text-only model's config")

    hidden = reader.integer("hidden_size")
    num_layers = reader.integer("num_hidden_layers")
    if num_layers > _MAX_LAYERS:
        reader.fail("num_hidden_layers", num_layers, f"must be at most {_MAX_LAYERS:,} (every layer is kept per step)")
    num_heads = reader.integer("num_attention_heads")
    num_kv_heads = _kv_heads(reader, model_type, num_heads)
    if num_heads == 0:
        reader.fail("num_attention_heads", num_heads, "must be > 0")
    if num_kv_heads == 0:
        reader.fail("num_key_value_heads", num_kv_heads, "must be > 0")
    if num_heads % num_kv_heads:
        reader.fail("num_key_value_heads", num_kv_heads,
                    f"must divide num_attention_heads={num_heads} (each KV head serves a whole group)")
    head_dim = reader.integer("head_dim", default=hidden // num_heads)
    parallel = _parallel_layer(reader, model_type)
    mlp_bias = reader.boolean("mlp_bias", default=False)
    if mlp_bias:
        reader.fail("mlp_bias", True, "biased dense MLPs are not modelled")
    act = reader.get("hidden_act", "gelu" if parallel is not None else "silu")
    if parallel is None and act not in ("silu", "swiglu"):
        reader.fail("hidden_act", act, "only gated SiLU MLPs are modelled")
    if parallel is not None and act not in _GELU:
        reader.fail("hidden_act", act, f"must be one of {', '.join(_GELU)} for {model_type}")
    dtype_name = reader.get("torch_dtype", reader.get("dtype", "bfloat16"))
    if not isinstance(dtype_name, str) or dtype_name not in _DTYPES:
        reader.fail("torch_dtype", dtype_name, f"must be one of {', '.join(_DTYPES)}")
    quant, experts_only = _quantization(reader)
    group = _int4_group_size(reader) if quant == "int4_wo" else 0
    mla = _mla(reader)
    linear, linear_layers = _linear_attention(reader, model_type, num_layers)
    return ModelSpec(
        name=name,
        model_type=model_type,
        hidden_size=hidden,
        num_layers=num_layers,
        num_attention_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=_dense_mlp_width(reader, model_type),
        vocab_size=reader.integer("vocab_size"),
        max_position_embeddings=reader.integer(  # GPTJConfig's and FalconConfig's default
            "max_position_embeddings", default=2048 if model_type in _PARALLEL_ATTENTION_TYPES else None),
        # PretrainedConfig ties by default; Falcon's configs rely on it (its lm_head is the embedding).
        tie_word_embeddings=reader.boolean("tie_word_embeddings", default=model_type == "falcon"),
        attention_bias=reader.boolean("bias" if model_type == "falcon" else "attention_bias",
                                      default=model_type == "qwen2"),
        qk_norm=model_type in ("qwen3", "qwen3_moe", *_GATED_DELTANET_TYPES)
        or reader.boolean("use_qk_norm", default=model_type == "llama4_text"),  # Llama4TextConfig's default
        qk_norm_across_heads=reader.get("qk_norm_type") == "per_layer",
        layer_window_tokens=_layer_windows(reader, model_type, num_layers),
        moe=_moe(reader, model_type, num_layers),
        torch_dtype=_DTYPES[dtype_name],
        weight_quantization=quant,
        quantize_experts_only=experts_only,
        int4_group_size=group,
        mla=mla,
        dsa=_dsa(reader, mla),
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", default=0),
        linear_attention=linear,
        linear_layers=linear_layers,
        attn_output_gate=reader.boolean("attn_output_gate", default=model_type in _GATED_DELTANET_TYPES),
        shared_expert_gate=model_type in ("qwen2_moe", *_GATED_DELTANET_TYPES) and bool(
            reader.get("shared_expert_intermediate_size")),
        **({} if parallel is None else parallel),
    )


_GELU: Final = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")
"""Activations of the ungated MLPs (the GELU variants differ in the formula, not in the cost)."""


def _kv_heads(reader: _ConfigReader, model_type: str, num_heads: int) -> int:
    """KV heads: the config's (default one per query head), except Falcon's old decoder layer with
    `multi_query`, which has one whatever `num_kv_heads` says (transformers' and vLLM's Falcon; a
    re-saved Falcon-7B config writes num_kv_heads = num_attention_heads)."""
    if (model_type == "falcon" and not reader.boolean("new_decoder_architecture", default=False)
            and reader.boolean("multi_query", default=True)):
        return 1
    return reader.integer("num_key_value_heads", default=num_heads)


def _parallel_layer(reader: _ConfigReader, model_type: str) -> dict[str, Any] | None:
    """`ModelSpec` fields of a GPT-J / Falcon decoder layer (attention and an ungated GELU MLP side
    by side), None for any other architecture."""
    if model_type not in _PARALLEL_ATTENTION_TYPES:
        return None
    if model_type == "gptj":
        # GPT-J's MLP projections carry biases; one LayerNorm feeds both branches.
        return {"mlp_gated": False, "mlp_bias": True, "parallel_attention": True, "layer_norms_per_layer": 1}
    if reader.boolean("alibi", default=False):
        reader.fail("alibi", True, "ALiBi position biases are not modelled (rotary Falcon checkpoints are)")
    new_arch = reader.boolean("new_decoder_architecture", default=False)
    parallel = new_arch or reader.boolean("parallel_attn", default=True)
    if not parallel:
        reader.fail("parallel_attn", False, "sequential Falcon layers are not modelled")
    bias = reader.boolean("bias", default=False)
    norms = reader.integer("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    if norms not in (1, 2):
        reader.fail("num_ln_in_parallel_attn", norms, "must be 1 or 2")
    return {"mlp_gated": False, "mlp_bias": bias, "parallel_attention": True, "layer_norms_per_layer": norms}


def _dense_mlp_width(reader: _ConfigReader, model_type: str) -> int:
    """Width of the dense MLP layers. Llama 4 keeps `intermediate_size` for its experts and gives
    the dense layers `intermediate_size_mlp`; Qwen3.5-MoE has no dense MLP layer and so no
    `intermediate_size` (the field is then unused); GPT-J and Falcon default to 4 x hidden."""
    if model_type == "llama4_text":
        return reader.integer("intermediate_size_mlp")
    if model_type in _PARALLEL_ATTENTION_TYPES:  # GPT-J's `n_inner`, Falcon's `ffn_hidden_size`: 4 x hidden
        return reader.integer("intermediate_size", default=4 * reader.integer("hidden_size"))
    return reader.integer("intermediate_size", default=reader.get("moe_intermediate_size")
                          if model_type in _GATED_DELTANET_TYPES else None)


def _linear_attention(reader: _ConfigReader, model_type: str,
                      num_layers: int) -> tuple[LinearAttentionSpec | None, tuple[int, ...]]:
    """Gated DeltaNet shapes and the layers that use it: `layer_types` entries "linear_attention",
    or without `layer_types` every layer but each `full_attention_interval`-th (Qwen3-Next)."""
    if model_type not in _GATED_DELTANET_TYPES:
        return None, ()
    layer_types = reader.get("layer_types")
    if isinstance(layer_types, list):
        layers = tuple(i for i, kind in enumerate(layer_types) if kind == "linear_attention")
    else:
        interval = reader.integer("full_attention_interval")
        if interval == 0:
            reader.fail("full_attention_interval", interval, "must be > 0")
        layers = tuple(i for i in range(num_layers) if (i + 1) % interval)
    if not layers:
        return None, ()
    state = reader.get("mamba_ssm_dtype", "float32")
    if state not in _DTYPES:
        reader.fail("mamba_ssm_dtype", state, f"must be one of {', '.join(_DTYPES)}")
    return LinearAttentionSpec(
        num_key_heads=reader.integer("linear_num_key_heads"),
        num_value_heads=reader.integer("linear_num_value_heads"),
        key_head_dim=reader.integer("linear_key_head_dim"),
        value_head_dim=reader.integer("linear_value_head_dim"),
        conv_kernel_dim=reader.integer("linear_conv_kernel_dim"),
        state_dtype=_DTYPES[state],
    ), layers


def _mla(reader: _ConfigReader) -> MLASpec | None:
    if reader.get("kv_lora_rank") is None:
        if reader.get("q_lora_rank") is not None:
            reader.fail("q_lora_rank", reader.get("q_lora_rank"), "needs kv_lora_rank (MLA)")
        return None
    q_lora = reader.get("q_lora_rank")
    return MLASpec(
        q_lora_rank=None if q_lora is None else reader.integer("q_lora_rank"),
        kv_lora_rank=reader.integer("kv_lora_rank"),
        qk_nope_head_dim=reader.integer("qk_nope_head_dim"),
        qk_rope_head_dim=reader.integer("qk_rope_head_dim"),
        v_head_dim=reader.integer("v_head_dim"),
    )


def _dsa(reader: _ConfigReader, mla: MLASpec | None) -> DSASpec | None:
    if reader.get("index_topk") is None:
        return None
    if mla is None:
        reader.fail("index_topk", reader.get("index_topk"), "DeepSeek sparse attention needs MLA (kv_lora_rank)")
    return DSASpec(index_topk=reader.integer("index_topk"), index_n_heads=reader.integer("index_n_heads"),
                   index_head_dim=reader.integer("index_head_dim"))


def _quantization(reader: _ConfigReader) -> tuple[WeightQuantization | None, bool]:
    qc = reader.get("quantization_config")
    if qc is None:
        return None, False
    if not isinstance(qc, Mapping):
        reader.fail("quantization_config", qc, "must be a table")
    method = qc.get("quant_method")
    if method == "fp8":
        return ("fp8_block" if qc.get("weight_block_size") else "fp8"), False
    if method == "mxfp4":
        skipped = " ".join(str(m) for m in qc.get("modules_to_not_convert", ()))
        # gpt-oss keeps attention, router, embedding and LM head in bf16.
        return "mxfp4", "self_attn" in skipped
    if method == "compressed-tensors":
        return _compressed_tensors(reader, qc)
    reader.fail("quantization_config.quant_method", method,
                "only fp8, mxfp4 and compressed-tensors int4 checkpoints are modelled")
    raise AssertionError("unreachable")


def _compressed_tensors(reader: _ConfigReader, qc: Mapping[str, Any]) -> tuple[WeightQuantization | None, bool]:
    """Weight-only int4 (W4A16) groups, as Kimi-K2.5 ships its routed experts."""
    groups = qc.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values()] if isinstance(groups, Mapping) else []
    if len(weights) != 1 or weights[0].get("num_bits") != 4 or weights[0].get("type") != "int" \
            or any((g.get("input_activations") is not None) for g in groups.values()):
        reader.fail("quantization_config.config_groups", "{...}",
                    "only one weight-only int4 group (W4A16) is modelled for compressed-tensors")
    ignored = " ".join(str(m) for m in qc.get("ignore", ()))
    # Kimi-K2.5 keeps attention, shared experts, dense MLPs and the LM head in bf16.
    return "int4_wo", "self_attn" in ignored


def _int4_group_size(reader: _ConfigReader) -> int:
    """The int4 group's `group_size` (weights per scale; vLLM's WNA16 MoE keeps the scales in 16 bits)."""
    groups = (reader.get("quantization_config") or {}).get("config_groups") or {}
    weights = next(iter(groups.values())).get("weights") or {}
    size = weights.get("group_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        reader.fail("quantization_config.config_groups.weights.group_size", size, "must be an integer >= 1")
    assert isinstance(size, int)
    return size


def _layer_windows(reader: _ConfigReader, model_type: str, num_layers: int) -> tuple[int, ...]:
    if model_type == "llama4_text":
        # Chunked local attention (`attention_chunk_size`, on the RoPE layers) is priced as full
        # attention: exact while the context fits in the first chunk (8,192 tokens), dearer past it,
        # where a token attends only its own chunk's (position mod chunk) + 1 tokens. A sliding
        # window of the chunk size would bound the work, but the fitted attention families price
        # windowed kernels as their own (slower) series even where the window covers the whole
        # context (docs/scenario.md, [model]).
        _check_no_rope_layers(reader, num_layers)
        return (0,) * num_layers
    window = reader.get("sliding_window")
    if isinstance(window, int) and window > _MAX_CONFIG_INT:
        reader.fail("sliding_window", window, f"must be at most {_MAX_CONFIG_INT:,}")
    layer_types = reader.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            reader.fail("layer_types", layer_types, f"must list num_hidden_layers={num_layers} entries")
        windows = []
        for i, kind in enumerate(layer_types):
            if kind in ("full_attention", "linear_attention"):
                windows.append(0)  # a linear layer's entry is unused (`ModelSpec.linear_layers`)
            elif kind == "sliding_attention" and isinstance(window, int) and window > 0:
                windows.append(window)
            else:
                reader.fail(f"layer_types[{i}]", kind,
                            "must be full_attention or sliding_attention (with an integer sliding_window)")
        return tuple(windows)
    if window is None or window == 0:
        return (0,) * num_layers
    if not isinstance(window, int) or window < 0:
        reader.fail("sliding_window", window, "must be a non-negative integer or null")
    if model_type.startswith("qwen"):
        if not reader.boolean("use_sliding_window", default=False):
            return (0,) * num_layers
        first = reader.integer("max_window_layers", default=num_layers)
        return tuple(window if i >= first else 0 for i in range(num_layers))
    return (window,) * num_layers


def _moe(reader: _ConfigReader, model_type: str, num_layers: int) -> MoESpec | None:
    num_experts = None
    for key in ("num_local_experts", "num_experts", "n_routed_experts"):
        if reader.get(key) is not None:
            num_experts = reader.integer(key)
            break
    if not num_experts:
        return None
    top_k = reader.integer("num_experts_per_tok")
    if model_type in ("mixtral", "gpt_oss", "minimax_m2", "llama4_text"):
        expert_width = reader.integer("intermediate_size")
    else:
        expert_width = reader.integer("moe_intermediate_size")
    shared = 0
    if reader.get("n_shared_experts"):
        shared = reader.integer("n_shared_experts") * expert_width
    elif reader.get("shared_expert_intermediate_size"):
        shared = reader.integer("shared_expert_intermediate_size")
    elif reader.get("shared_intermediate_size"):
        shared = reader.integer("shared_intermediate_size")
    elif model_type == "llama4_text":
        shared = expert_width  # every Llama 4 MoE layer adds one always-on expert of the routed width
    dense_layers: set[int] = set()
    if model_type == "llama4_text":
        dense_layers |= set(range(num_layers)) - set(_llama4_moe_layers(reader, num_layers))
    first_dense = reader.get("first_k_dense_replace")
    if first_dense:
        dense_layers |= set(range(reader.integer("first_k_dense_replace")))
    step = reader.get("decoder_sparse_step")
    if step:
        step_n = reader.integer("decoder_sparse_step")
        dense_layers |= {i for i in range(num_layers) if (i + 1) % step_n != 0}
    freq = reader.get("moe_layer_freq")
    if freq and freq != 1:
        reader.fail("moe_layer_freq", freq, "only moe_layer_freq=1 is modelled")
    mlp_only = reader.get("mlp_only_layers") or []
    if not isinstance(mlp_only, list) or not all(isinstance(i, int) for i in mlp_only):
        reader.fail("mlp_only_layers", mlp_only, "must be a list of layer indices")
    dense_layers |= set(mlp_only)
    return MoESpec(
        num_experts=num_experts,
        num_experts_per_token=top_k,
        expert_intermediate_size=expert_width,
        moe_layer_indices=tuple(i for i in range(num_layers) if i not in dense_layers),
        shared_expert_intermediate_size=shared,
        expert_bias=model_type == "gpt_oss",
    )


def _llama4_moe_layers(reader: _ConfigReader, num_layers: int) -> tuple[int, ...]:
    """Llama 4's MoE layers: `moe_layers` when the config lists them, else every
    `interleave_moe_layer_step`-th layer counting from step - 1 (Scout: all 48; Maverick: the odd
    ones), as Hugging Face's `Llama4TextConfig` derives them."""
    listed = reader.get("moe_layers")
    if listed is not None:
        if not isinstance(listed, list) or not all(isinstance(i, int) and 0 <= i < num_layers for i in listed):
            reader.fail("moe_layers", listed, f"must be a list of layer indices in 0..{num_layers - 1}")
        return tuple(sorted(set(listed)))
    step = reader.integer("interleave_moe_layer_step", default=1)
    if step < 1:
        reader.fail("interleave_moe_layer_step", step, "must be >= 1")
    return tuple(range(step - 1, num_layers, step))


def _check_no_rope_layers(reader: _ConfigReader, num_layers: int) -> None:
    """Llama 4's RoPE / NoPE layer pattern (`no_rope_layers`: 1 = RoPE with chunked attention, 0 =
    NoPE with global attention; empty = every `no_rope_layer_interval`-th layer NoPE). Every layer
    is priced as full attention, so the pattern is only checked, to name a malformed key."""
    listed = reader.get("no_rope_layers") or []
    if listed and (not isinstance(listed, list) or len(listed) != num_layers or not all(v in (0, 1) for v in listed)):
        reader.fail("no_rope_layers", listed, f"must list 0 or 1 for each of num_hidden_layers={num_layers}")
    if not listed and reader.integer("no_rope_layer_interval", default=4) < 1:
        reader.fail("no_rope_layer_interval", reader.get("no_rope_layer_interval"), "must be >= 1")


_MAX_LAYERS: Final = 4096
"""Most decoder layers a config may give (today's deepest models have ~130): each is a step graph entry."""
_MAX_CONFIG_INT: Final = 2**31 - 1
"""Largest integer a model config may give (hidden sizes, layer counts, vocabularies, windows)."""


class _ConfigReader:
    """Typed access to a config.json table, with errors that name the key."""

    def __init__(self, data: Mapping[str, Any], *, source: str, prefix: str,
                 aliases: Mapping[str, str] | None = None) -> None:
        self._data, self._source, self._prefix = data, source, prefix
        self._aliases: Mapping[str, str] = aliases or {}

    def with_aliases(self, aliases: Mapping[str, str]) -> _ConfigReader:
        """The same table read with standard keys mapped to the architecture's own names."""
        return _ConfigReader(self._data, source=self._source, prefix=self._prefix, aliases=aliases)

    def fail(self, key: str, value: object, rule: str) -> Any:
        raise ConfigError(source=self._source, key=self._prefix + self._aliases.get(key, key), value=value, rule=rule)

    def get(self, key: str, default: Any = None) -> Any:
        value = self._data.get(self._aliases.get(key, key), default)
        return default if value is None else value

    def table(self, key: str) -> Mapping[str, Any]:
        value = self._data.get(key)
        if not isinstance(value, Mapping):
            self.fail(key, value, "must be a table")
        return value  # type: ignore[return-value]

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.get(key, default)
        if value is None:
            self.fail(key, None, "is required")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.fail(key, value, "must be a non-negative integer")
        if value > _MAX_CONFIG_INT:
            # Sizes, counts and windows: a larger one is a typo that would overflow the kernel arrays.
            self.fail(key, value, f"must be at most {_MAX_CONFIG_INT:,}")
        return int(value)

    def boolean(self, key: str, *, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, value, "must be true or false")
        return bool(value)

    def string(self, key: str) -> str:
        value = self.get(key)
        if not isinstance(value, str):
            self.fail(key, value, "must be a string")
        return str(value)
