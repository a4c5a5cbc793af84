"""Whether a MoE layer's shared expert runs after its routed experts or beside them.

The engines hide the always-on shared expert behind the routed experts where they can (each rule
read from the engine's source):

- **SGLang** (`DeepseekV2ForCausalLM`, which also runs Kimi-K2 / K2.5 and GLM-5): with one shared
  expert and 256 routed experts (DeepSeek-V3 / R1, GLM-5), no expert parallelism and the shared and
  routed experts in one weight format, `determine_num_fused_shared_experts` makes the shared expert
  a 257th expert of the fused MoE kernel that every token takes (top-k + 1), in every step.
  Otherwise, unless the experts' tokens travel by DeepEP (`sim.graph.moe.uses_expert_all_to_all`),
  `DeepseekV2MoE.forward_normal_dual_stream` runs the shared expert on a second CUDA stream beside
  the router and routed experts in captured decode batches of at most 1,024 tokens
  (`DUAL_STREAM_TOKEN_THRESHOLD`). Its other MoE models (Qwen3.5, Qwen3-MoE,
  MiniMax) run them one after the other here: their SGLang code was not checked for a second
  stream, so the price stays the conservative one.
- **TensorRT-LLM** (`Deepseekv3MoE`, DeepSeek-V3 / R1, Kimi-K2, GLM-5): `maybe_execute_in_parallel`
  runs the shared expert on the aux stream, multi-stream only inside CUDA graphs, i.e. in captured
  generation-only steps.
- **vLLM** (`SharedFusedMoE`, every model with shared experts): the shared expert runs on its own
  stream when the step has at most `VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD` (256) tokens, but
  not with the expert-parallel load balancer and an all-to-all backend other than
  allgather-reducescatter; the simulator prices vLLM's token exchange as DeepEP where there is one
  (expert parallelism over attention-DP ranks), so that is where EPLB turns the overlap off.

Streams are CUDA's: on other vendors' GPUs every engine runs the shared expert in line.

A kernel beside the routed experts costs the step what it takes from them, not its own latency:
its roofline time (its bytes at the DRAM bandwidth, or its FLOPs at the peak), because its launch,
ramp and tail hide under the longer routed-expert kernel (`sim.perf.step.StepCostModel`). That
is also how the fused 257th expert is priced: one more expert's weights streamed by a kernel that
is running anyway. The graph marks such kernels with the `BESIDE_ROUTED_EXPERTS` variant.
"""

from __future__ import annotations

from typing import Final

from sim.graph.moe import uses_expert_all_to_all
from sim.specs.engine import EngineParams
from sim.specs.hardware import HardwareSpec
from sim.specs.model import ModelSpec
from sim.specs.precision import PrecisionSpec

BESIDE_ROUTED_EXPERTS: Final = "beside_routed_experts"
"""`KernelWork.variant` prefix of a shared-expert kernel that runs beside the routed experts in
steps of at most the number of tokens after `<=` (no suffix: in every step), e.g.
`beside_routed_experts<=256`. The limit is in the variant rather than decided per step so that a
part family's kernels keep one structure over its counts (`sim.engine.block_pricing`); the kernel
model reads it against the kernel's token count (`beside_token_limit`)."""

SGLANG_DUAL_STREAM_MAX_TOKENS: Final = 1024
"""SGLang `DeepseekV2MoE`: `DUAL_STREAM_TOKEN_THRESHOLD`."""
VLLM_SHARED_STREAM_MAX_TOKENS: Final = 256
"""vLLM: the default of `VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`."""
_SGLANG_FUSED_ROUTED_EXPERTS: Final = 256
"""SGLang fuses the shared expert of models with this many routed experts (DeepSeek-V3 / R1, GLM-5)."""
_UNLIMITED: Final = 1 << 62


def sglang_fuses_shared_expert(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec) -> bool:
    """SGLang makes the model's shared expert one more expert of the fused MoE kernel."""
    moe = model.moe
    return (engine.backend == "sglang" and moe is not None and model.mla is not None
            and moe.num_experts == _SGLANG_FUSED_ROUTED_EXPERTS
            and moe.shared_expert_intermediate_size == moe.expert_intermediate_size
            and engine.expert_parallel_size() == 1
            and precision.linear_weight_dtype is precision.expert_weight_dtype)


def _capture_limit(engine: EngineParams) -> int | None:
    """Most tokens of a decode-only step replayed from a CUDA graph; None when none is. The token
    count stands for the batch size: they differ only under speculative decoding, where the limit
    is the stricter one."""
    mode = engine.effective_launch_mode()
    if mode == "eager":
        return None
    if mode == "megakernel":
        return _UNLIMITED
    capture = engine.max_cudagraph_capture_size
    assert capture is not None, "an engine resolved against its hardware sets the capture size"
    return capture


def shared_expert_token_limit(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                              hw: HardwareSpec, *, decode_only: bool) -> int | None:
    """Most tokens of a step (decode-only or not) whose shared-expert kernels run beside its routed
    experts (module docstring); None when no step's do."""
    moe = model.moe
    if moe is None or not moe.shared_expert_intermediate_size or hw.vendor != "nvidia":
        return None
    backend = engine.backend
    if backend == "vllm":
        if engine.enable_eplb and uses_expert_all_to_all(engine):
            return None
        return VLLM_SHARED_STREAM_MAX_TOKENS
    if model.mla is None:
        return None
    if backend == "sglang" and sglang_fuses_shared_expert(model, engine, precision):
        return _UNLIMITED
    if not decode_only or (backend == "sglang" and uses_expert_all_to_all(engine)):
        return None
    limit = _capture_limit(engine)
    if limit is not None and backend == "sglang":
        limit = min(limit, SGLANG_DUAL_STREAM_MAX_TOKENS)
    return limit


def beside_variant(limit: int) -> str:
    """The `KernelWork.variant` of a shared-expert kernel beside the routed experts up to `limit` tokens."""
    return BESIDE_ROUTED_EXPERTS if limit >= _UNLIMITED else f"{BESIDE_ROUTED_EXPERTS}<={limit}"


def beside_token_limit(variant: str) -> int | None:
    """The token limit of a `beside_variant`; None for any other variant."""
    if not variant.startswith(BESIDE_ROUTED_EXPERTS):
        return None
    rest = variant[len(BESIDE_ROUTED_EXPERTS):]
    return _UNLIMITED if not rest else int(rest[2:])


def depends_on_decode_only(model: ModelSpec, engine: EngineParams, precision: PrecisionSpec,
                           hw: HardwareSpec) -> bool:
    """Whether a decode-only step can place the shared expert differently from a step with a prompt
    chunk of the same token count (the pricer then keeps their token parts apart)."""
    return (shared_expert_token_limit(model, engine, precision, hw, decode_only=True)
            != shared_expert_token_limit(model, engine, precision, hw, decode_only=False))
