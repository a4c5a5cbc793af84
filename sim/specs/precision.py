"""Which number format each part of the model runs in, from checkpoint, engine flags and GPU.

vLLM semantics: `dtype=auto` takes the checkpoint's `torch_dtype` (fp32 checkpoints run in bf16);
`quantization` (or the checkpoint's `quantization_config`) sets the linear-layer weights, with
the LM head and embedding kept in the activation dtype; `kv_cache_dtype=auto` follows the
activations. FP8 GEMMs run on FP8 tensor cores only where the GPU has them (weight-only FP8,
Marlin-style, on older parts: weights move as FP8, math runs at the 16-bit rate).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sim.dtypes import DType
from sim.specs.engine import EngineParams, ModelDType
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionSpec:
    activation_dtype: DType
    linear_weight_dtype: DType
    """Attention and dense-MLP projection weights."""
    expert_weight_dtype: DType
    lm_head_dtype: DType
    kv_cache_dtype: DType

    def gemm_compute_dtype(self, weight_dtype: DType, hw: HardwareSpec) -> DType:
        """Tensor-core format a GEMM with these weights runs at on `hw`."""
        if weight_dtype in (DType.FP8, DType.FP8_BLOCK, DType.NVFP4, DType.MXFP4) and hw.supports(weight_dtype):
            return weight_dtype
        return self.activation_dtype


_QUANT = {"fp8": DType.FP8, "fp8_block": DType.FP8_BLOCK, "mxfp4": DType.MXFP4, "nvfp4": DType.NVFP4,
          "int4_wo": DType.INT4_WO}


def resolve_precision(model: ModelSpec, engine: EngineParams) -> PrecisionSpec:
    if engine.dtype == "auto":
        act: DType = DType.BFLOAT16 if model.torch_dtype is DType.FLOAT32 else model.torch_dtype
    else:
        act = DType(engine.dtype)
    quant = engine.quantization or model.weight_quantization
    linear: DType = act
    expert: DType = act
    if quant is not None:
        expert = _QUANT[quant]
        experts_only = engine.quantization is None and model.quantize_experts_only
        linear = act if experts_only else expert
    kv: DType = act if engine.kv_cache_dtype == "auto" else DType.FP8
    return PrecisionSpec(
        activation_dtype=act,
        linear_weight_dtype=linear,
        expert_weight_dtype=expert,
        lm_head_dtype=act,
        kv_cache_dtype=kv,
    )


def resolve_draft_precision(draft: ModelSpec, engine: EngineParams, target: PrecisionSpec) -> PrecisionSpec:
    """The speculative drafter's formats, as vLLM loads it: the target's dtype (the draft's model config
    takes it) and KV-cache dtype (one cache config); weights as `speculative_config.quantization`
    says, else an MTP layer in the target's `quantization` (it is the target's checkpoint), else what
    the draft's own checkpoint declares (`draft.weight_quantization`; None for an EAGLE head)."""
    config = engine.speculative_config
    assert config is not None
    quant = config.quantization or (engine.quantization if config.method == "mtp" else None)
    dtype: ModelDType = "float16" if target.activation_dtype is DType.FLOAT16 else "bfloat16"
    return resolve_precision(draft, dataclasses.replace(engine, dtype=dtype, quantization=quant))


def draft_input_projection_dtype(method: str, draft: PrecisionSpec) -> DType:
    """Weight format of the drafter's input projection: EAGLE's `fc` is a linear layer under the head's
    quantization; an MTP layer's `eh_proj` is a plain `nn.Linear` in the model dtype (vLLM's and
    SGLang's DeepSeek MTP modules), whatever the checkpoint's quantization."""
    return draft.activation_dtype if method == "mtp" else draft.linear_weight_dtype
