"""Speculative decoding: `[engine] speculative_config` (vLLM's keys) and the acceptance model.

vLLM's `SpeculativeConfig` keys: `method` (`mtp`, `eagle`, `eagle3`, `ngram`, `draft_model`),
`num_speculative_tokens` (k, the draft tokens proposed per request per step), `model` (the draft:
an EAGLE head checkpoint, or for `draft_model` a model from the catalog), `prompt_lookup_max` /
`prompt_lookup_min` (ngram window). What the draft computes (`draft_model_spec`):

- `eagle` / `eagle3`: a one-decoder-layer head of the target's width (EAGLE's and EAGLE-3's
  published heads for Llama-3.1-8B are one Llama layer of 4096 / 14336 with 32 / 8 heads), whatever
  `model` names: its geometry follows the target. EAGLE-3 heads predict over a reduced draft vocabulary
  (32,000 for the Llama-3.1 head); EAGLE heads share the target's LM head.
- `mtp`: the model's own multi-token-prediction layer (DeepSeek-V3/R1 `num_nextn_predict_layers`): one
  decoder layer of the model (MoE for DeepSeek) plus `eh_proj`; vLLM runs it autoregressively for
  k > num_nextn_predict_layers.
- `draft_model`: a whole smaller model from the catalog (`model`), run at the target's parallelism.
- `ngram`: prompt lookup on the host; no GPU drafting.

Formats (`sim.specs.precision.resolve_draft_precision`): the drafter computes in the target's dtype
and writes the target's KV-cache dtype; its weights are an MTP layer's in the target's format, a head's
or draft model's in their own checkpoint's (`quantization` overrides, as vLLM's key does).

Acceptance: per draft position i (1..k), the conditional probability that the draft token i is
accepted given that tokens 1..i-1 were (EAGLE's "n-alpha"). A step of one request emits 1 + a tokens
where a, the accepted drafts, has P(a >= j) = r_1 x ... x r_j. A list shorter than k repeats its last
entry; a mean acceptance length L (tokens per step, 1 + E[a], as vLLM and the EAGLE papers report it)
is turned into one constant rate r with 1 + r + ... + r^k = L. Defaults per method are published
measurements (docs/speculative.md cites them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sim.dtypes import Quantization
from sim.serde import require
from sim.specs.model import ModelSpec

SpecMethod = Literal["mtp", "eagle", "eagle3", "ngram", "draft_model"]

EAGLE3_DRAFT_VOCAB = 32_000
"""EAGLE-3's reduced draft vocabulary (`draft_vocab_size` of yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)."""

DEFAULT_ACCEPTANCE_RATES: dict[str, tuple[float, ...]] = {
    # DeepSeek-V3 technical report (arXiv 2412.19437, section 5.4.3): "the acceptance rate of the second
    # token prediction ranges between 85% and 90%" -> the midpoint, repeated for later positions.
    "mtp": (0.875,),
    # vLLM PR #16035 (EAGLE, Llama-3-8B-Instruct, MT-Bench, temperature 0): mean acceptance length 1.89
    # at k=2 and 2.08 at k=4; the constant rate 0.55 gives 1.85 and 2.11.
    "eagle": (0.55,),
    # vLLM issue #26191 (EAGLE-3, Llama-3.1-8B-Instruct + yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, MT-Bench,
    # temperature 0, k=7): mean acceptance length 3.53 -> constant rate 0.743.
    "eagle3": (0.743,),
    # vLLM PR #24344 (ngram, k=5, prompt_lookup 2..5, blazedit code-edit set): unconditional acceptance
    # 0.81, 0.74, 0.70, 0.68, 0.66 by position -> conditional 0.81, 0.914, 0.946, 0.971, 0.971. An
    # editing workload (the output repeats the prompt) is ngram's best case.
    "ngram": (0.81, 0.914, 0.946, 0.971, 0.971),
    # vLLM PR #24322 (draft_model, Llama-3.1-8B-Instruct target with Llama-3.2-1B-Instruct draft is the
    # common pairing) gives no single number we trust for every pair: 0.6 is an assumption, to be set per
    # workload with spec_acceptance_rates.
    "draft_model": (0.6,),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """vLLM's `speculative_config` (the keys kernelsight reads)."""

    method: SpecMethod
    num_speculative_tokens: int
    """k: draft tokens proposed per running request per step."""
    model: str | None = None
    """Draft: required for `draft_model` (a catalog model); an EAGLE head's name for eagle/eagle3 (its
    geometry follows the target); not read by mtp (the model's own MTP layer) or ngram."""
    prompt_lookup_max: int | None = None
    """ngram: longest n-gram matched (vLLM's key; the host cost does not depend on it)."""
    prompt_lookup_min: int | None = None
    """ngram: shortest n-gram matched."""
    quantization: Quantization | None = None
    """vLLM's key: how the draft's weights are quantized. None: `mtp` takes the target's `quantization`
    on the target's own checkpoint (vLLM aligns them); `draft_model` what its checkpoint declares; an
    EAGLE / EAGLE-3 head is unquantized (published heads ship bf16; their config is not read)."""

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        require(1 <= k <= 16, "num_speculative_tokens", k, "must be in 1..16")
        require(self.method != "draft_model" or self.model is not None, "model", self.model,
                "method='draft_model' needs a draft model (a name from `kernelsight list models`)")
        require(self.method not in ("ngram", "mtp") or self.model is None, "model", self.model,
                f"method={self.method!r} uses no separate draft model")
        for key in ("prompt_lookup_max", "prompt_lookup_min"):
            value = getattr(self, key)
            require(value is None or self.method == "ngram", key, value, "applies to method='ngram' only")
            require(value is None or value >= 1, key, value, "must be >= 1")
        require(self.quantization is None or self.method != "ngram", "quantization", self.quantization,
                "method='ngram' has no draft weights")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        require(lo is None or hi is None or lo <= hi, "prompt_lookup_min", lo, f"must be <= prompt_lookup_max={hi}")


def mean_acceptance_length(rates: tuple[float, ...]) -> float:
    """Expected tokens a verification step emits per request: 1 + sum_j r_1 x ... x r_j."""
    total, survive = 1.0, 1.0
    for r in rates:
        survive *= r
        total += survive
    return total


def constant_rate_for_length(mean_length: float, k: int) -> float:
    """The rate r in [0, 1] with 1 + r + ... + r^k = mean_length (bisection; monotone in r)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if mean_acceptance_length((mid,) * k) < mean_length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def acceptance_rates(method: str, k: int, rates: tuple[float, ...] | None,
                     mean_length: float | None) -> tuple[float, ...]:
    """The k per-position conditional rates: given rates (the last repeated), a mean length, or the
    method's default."""
    if mean_length is not None:
        return (constant_rate_for_length(mean_length, k),) * k
    given = rates if rates else DEFAULT_ACCEPTANCE_RATES[method]
    return tuple(given[min(i, len(given) - 1)] for i in range(k))


def draft_model_spec(target: ModelSpec, config: SpeculativeConfig,
                     load_model: Callable[[str], ModelSpec]) -> ModelSpec | None:
    """The model the drafter runs each draft pass through (None for ngram), see the module docstring."""
    if config.method == "ngram":
        return None
    if config.method == "draft_model":
        assert config.model is not None
        return load_model(config.model)
    if config.method == "mtp":
        moe = target.moe
        if moe is not None:
            moe = dataclasses.replace(moe, moe_layer_indices=(0,))  # DeepSeek's MTP layer is an MoE layer
        return dataclasses.replace(target, name=f"{target.name} (MTP layer)", moe=moe, num_layers=1,
                                   layer_window_tokens=(0,), num_nextn_predict_layers=0,
                                   linear_attention=None, linear_layers=())
    vocab = target.vocab_size
    if config.method == "eagle3":
        vocab = min(vocab, EAGLE3_DRAFT_VOCAB)
    # A Llama decoder layer of the target's width (EAGLE heads are dense GQA layers, MoE or MLA target
    # or not).
    # The head is its own checkpoint: unquantized unless `quantization` says otherwise
    # (`sim.specs.precision.resolve_draft_precision`).
    return dataclasses.replace(
        target, name=f"{target.name} ({config.method} head)", model_type="llama", vocab_size=vocab,
        weight_quantization=None, quantize_experts_only=False, int4_group_size=0,
        moe=None, mla=None, dsa=None, qk_norm=False, attention_bias=False, num_layers=1, layer_window_tokens=(0,),
        linear_attention=None, linear_layers=(), attn_output_gate=False, mlp_gated=True, mlp_bias=False,
        parallel_attention=False, layer_norms_per_layer=2, num_nextn_predict_layers=0)
