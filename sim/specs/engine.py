"""Serving-engine settings: TOML section `[engine]`, keys named after vLLM's engine arguments.

Defaults are vLLM's (v1 engine, OpenAI server usage context). `max_num_seqs` and
`max_num_batched_tokens` default per device as vLLM does (larger on >= 70 GiB GPUs other than
A100); `EngineParams.resolve(hw, model)` returns a copy with every `None` default filled in.
Keys that vLLM lacks (`launch_mode`, `scheduler`, `router`, `backend`) are kernelsight's own and
are documented as such in docs/scenario.md.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Final, Literal

from sim.dtypes import Quantization
from sim.serde import require
from sim.specs.speculative import SpeculativeConfig

KvCacheDType = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
ModelDType = Literal["auto", "bfloat16", "float16"]
LaunchMode = Literal["auto", "eager", "cuda_graph", "megakernel"]
SchedulerName = Literal["vllm_v1"]
RouterName = Literal["round_robin", "least_outstanding", "prefix_aware"]
BackendName = Literal["vllm", "sglang", "trtllm"]

_GIB = 1 << 30


def routing_alpha(routing: str) -> float | bool | None:
    """The power-law exponent of a `moe_routing` value, None for `balanced`, False if malformed."""
    if routing == "balanced":
        return None
    prefix = "power_law_"
    if not routing.startswith(prefix):
        return False
    try:
        alpha = float(routing[len(prefix):])
    except ValueError:
        return False
    return alpha if alpha >= 0.0 and alpha != 1.0 and alpha == alpha and alpha != float("inf") else False



MAX_MAMBA_FULL_MEMORY_RATIO: Final = 1e6
"""Largest `mamba_full_memory_ratio`: a state pool of all but a millionth of the KV-cache memory."""

BLOCK_SIZES: Final = (1, 8, 16, 32, 64, 128, 256)
MAX_REPLICAS: Final = 4096
"""Most replicas (or ranks) of one engine layout or pool: each keeps its own scheduler and KV block
pool in memory, so a larger count is a typo that would exhaust the host before it fails."""
"""KV-cache block sizes an engine accepts (vLLM's `--block-size` choices)."""

def default_capture_size(backend: str, *, max_num_seqs: int, max_num_batched_tokens: int,
                         num_speculative_tokens: int = 0) -> int:
    """`max_cudagraph_capture_size` when unset. vLLM (`VllmConfig._set_cudagraph_sizes`): tokens,
    min(max_num_seqs x (1 + k) x 2, 512), at most `max_num_batched_tokens` (k drafts per request
    make a decode 1 + k tokens). Other backends: min(2 x max_num_seqs, 512) requests."""
    if backend == "vllm":
        return min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512, max_num_batched_tokens)
    return min(2 * max_num_seqs, 512)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineParams:
    """One engine replica's configuration (vLLM `EngineArgs` names and meanings)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    """Replicas behind the router. For MoE models the replicas are attention-data-parallel ranks of
    one engine: each runs its own batch through attention, and the MoE layers run over all TP x DP
    GPUs (vLLM's `data_parallel_size` for MoE models)."""
    enable_expert_parallel: bool = False
    """Shard MoE experts over TP x DP ranks instead of tensor-slicing every expert."""
    moe_tensor_parallel_size: int | None = None
    """kernelsight (TRT-LLM's name): MoE tensor-parallel degree; None = vLLM's rule (TP x DP without
    expert parallelism, 1 with it). moe_tp x moe_ep must equal TP x DP."""
    moe_expert_parallel_size: int | None = None
    """kernelsight (TRT-LLM's name; SGLang `--ep-size`): MoE expert-parallel degree; None = vLLM's
    rule (TP x DP with `enable_expert_parallel`, else 1)."""
    moe_routing: str = "power_law_1.01"
    """kernelsight: token-to-expert routing the MoE kernels see: `balanced` (round-robin: the lightest
    heaviest expert, optimistic for prefill, but every expert touched, pessimistic for decode's weight
    reads) or `power_law_<alpha>` (skewed; expert-parallel rank 0 gets the heaviest load). The default is
    AIConfigurator's default workload distribution."""
    enable_eplb: bool = False
    """vLLM's expert-parallel load balancer: experts are placed (and, with redundant slots,
    replicated) by their measured load, so every EP rank gets an even share of the routed tokens
    (needs expert parallelism)."""
    num_redundant_experts: int = 0
    """vLLM's `eplb_config.num_redundant_experts` (`--eplb-config '{"num_redundant_experts": N}'`):
    extra physical expert slots holding copies of the hottest experts; num_experts + N must divide
    over the EP ranks, and each rank holds (num_experts + N) / EP experts' weights. Needs `enable_eplb`."""
    max_num_seqs: int | None = None
    """Running-request cap; None = vLLM's device default (1024 on >= 70 GiB non-A100, else 256)."""
    max_num_batched_tokens: int | None = None
    """Token budget per step; None = vLLM's device default (8192 on >= 70 GiB non-A100, else 2048)."""
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    """Cap on one request's prefill tokens per step; 0 disables the cap."""
    max_num_partial_prefills: int = 1
    """Concurrent partially-prefilled requests (vLLM's concurrent partial prefill): only 1, as vLLM v1
    refuses other values ("Concurrent Partial Prefill is not supported"; the key is kept so that
    scenarios naming it load)."""
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    """None = the model's max_position_embeddings."""
    dtype: ModelDType = "auto"
    quantization: Quantization | None = None
    """Weight quantization; None = what the checkpoint declares."""
    kv_cache_dtype: KvCacheDType = "auto"
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None
    """Largest decode batch captured in a CUDA graph, in scheduled tokens (vLLM) or requests (SGLang,
    TensorRT-LLM: the profile's `graph_capture_unit`); None = `default_capture_size`."""
    async_scheduling: bool | None = None
    """CPU work of step n + 1 overlaps GPU work of step n (vLLM `--async-scheduling`, SGLang's and
    TensorRT-LLM's overlap schedulers). None = the engine's default for a recent release, from the
    `backend`'s profile: on (vLLM since 0.14, vllm-project/vllm#27614; SGLang; TensorRT-LLM), off
    under the speculative methods that turn it off (vLLM `ngram` and `draft_model`; SGLang every
    method). Resolved when a run is priced (`sim.api.resolved_async_scheduling`)."""
    launch_mode: LaunchMode = "auto"
    """kernelsight: `auto` = `eager` if enforce_eager else `cuda_graph`; `megakernel` is a what-if."""
    scheduler: SchedulerName = "vllm_v1"
    """kernelsight: replica scheduling policy (vLLM v1 continuous batching)."""
    router: RouterName = "round_robin"
    """kernelsight: how requests are spread over data-parallel replicas."""
    backend: BackendName = "vllm"
    """kernelsight: engine profile (host overheads, scheduling quirks) to simulate."""
    batch_wait_timeout_iters: int = 0
    """TensorRT-LLM (LLM API name; `backend = "trtllm"` only): while decodes run, hold waiting
    prefills for up to this many iterations so they batch together; 0 disables batch waiting."""
    batch_wait_max_tokens_ratio: float = 0.0
    """TensorRT-LLM: stop holding prefills early once the step's tokens (waiting prompts + decodes)
    reach this fraction of `max_num_batched_tokens` (TRT-LLM `max_num_tokens`); 0 disables the test."""
    attention_dp_enable_balance: bool = False
    """TensorRT-LLM `attention_dp_config.enable_balance` (`backend = "trtllm"`, attention-DP MoE engines
    only): hold new context requests until every DP rank can take one, `attention_dp_timeout_iters`
    iterations pass, or a rank has no generation request (`sim.serving.adp_balance`)."""
    attention_dp_timeout_iters: int = 50
    """TensorRT-LLM `attention_dp_config.timeout_iters` (its default 50): iterations the balance waits
    for every rank to have a context request before it lets the waiting ones run."""
    attention_dp_batching_wait_iters: int = 10
    """TensorRT-LLM `attention_dp_config.batching_wait_iters` (its default 10): once every rank has a
    context request and a generation request, iterations to keep holding them so more contexts batch up."""
    speculative_config: SpeculativeConfig | None = None
    """Speculative decoding (vLLM's `speculative_config`; `sim.specs.speculative`); None = off."""
    mamba_full_memory_ratio: float = 0.9
    """SGLang's `--mamba-full-memory-ratio` (its default 0.9), hybrid linear-attention models only: the
    cache memory splits ratio : 1 between the requests' linear-attention states and the KV cache of
    the full-attention layers (`sim.graph.memory`)."""
    api_server_latency_s: float | None = None
    """kernelsight: time a request spends outside the engine, as a client of the engine's
    OpenAI-compatible server sees it (request path before the engine queues it plus the response path
    of the first and last tokens), added to TTFT and E2E; None = the engine profile's fitted value
    (docs/serving.md, Metrics), 0 = latencies as the engine measures them (offline benchmarks)."""
    max_attention_window: int | None = None
    """TensorRT-LLM's `max_attention_window` (KvCacheConfig): every softmax-attention layer attends
    over at most this many tokens, whatever the model config's sliding windows say; 0 = the whole
    context. None = the config's windows. TensorRT-LLM's engine flow applies no window unless it is
    set (Mistral-7B-v0.1's 4,096-token window included). Windows price attention only: the KV cache
    keeps every token either way (docs/serving.md)."""

    def __post_init__(self) -> None:
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                    "block_size", "max_num_partial_prefills"):
            value = getattr(self, key)
            require(value >= 1, key, value, "must be >= 1")
        for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            value = getattr(self, key)
            require(value <= MAX_REPLICAS, key, value, f"must be <= {MAX_REPLICAS:,}")
        for key in ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "max_cudagraph_capture_size"):
            value = getattr(self, key)
            require(value is None or value >= 1, key, value, "must be >= 1")
        require(self.max_num_partial_prefills == 1, "max_num_partial_prefills", self.max_num_partial_prefills,
                "must be 1: vLLM v1 refuses concurrent partial prefill (until 2026-12-02 other values were "
                "accepted and ignored)")
        require(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold",
                self.long_prefill_token_threshold, "must be >= 0")
        for key in ("attention_dp_timeout_iters", "attention_dp_batching_wait_iters"):
            value = getattr(self, key)
            require(value >= 0, key, value, "must be >= 0")
        require(self.batch_wait_timeout_iters >= 0, "batch_wait_timeout_iters", self.batch_wait_timeout_iters,
                "must be >= 0")
        require(0.0 <= self.batch_wait_max_tokens_ratio <= 1.0, "batch_wait_max_tokens_ratio",
                self.batch_wait_max_tokens_ratio, "must be in [0, 1]")
        # Finite and bounded: the state pool is cache x ratio / (1 + ratio), which inf (NaN) or a huge
        # ratio (an overflow) made a traceback in the memory model.
        require(0.0 < self.mamba_full_memory_ratio <= MAX_MAMBA_FULL_MEMORY_RATIO, "mamba_full_memory_ratio",
                self.mamba_full_memory_ratio, f"must be in (0, {MAX_MAMBA_FULL_MEMORY_RATIO:g}]")
        require(self.api_server_latency_s is None or 0 <= self.api_server_latency_s < math.inf,
                "api_server_latency_s", self.api_server_latency_s, "must be a finite number >= 0 (seconds)")
        require(self.max_attention_window is None or self.max_attention_window >= 0, "max_attention_window",
                self.max_attention_window, "must be >= 0 (0: the whole context)")
        require(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
                self.gpu_memory_utilization, "must be in (0, 1]")
        require(self.block_size in BLOCK_SIZES, "block_size", self.block_size,
                f"must be one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's choices)")
        require(self.num_redundant_experts >= 0, "num_redundant_experts", self.num_redundant_experts, "must be >= 0")
        require(self.enable_eplb or not self.num_redundant_experts, "num_redundant_experts",
                self.num_redundant_experts, "redundant experts need enable_eplb = true (as in vLLM)")
        for key in ("moe_tensor_parallel_size", "moe_expert_parallel_size"):
            value = getattr(self, key)
            require(value is None or value >= 1, key, value, "must be >= 1")
        require(routing_alpha(self.moe_routing) is not False, "moe_routing", self.moe_routing,
                "must be `balanced` or `power_law_<alpha>` with alpha >= 0 and alpha != 1")
        group = self.tensor_parallel_size * self.data_parallel_size
        if self.moe_tensor_parallel_size is not None or self.moe_expert_parallel_size is not None:
            require(self.moe_tp_size() * self.expert_parallel_size() == group,
                    "moe_expert_parallel_size", self.moe_expert_parallel_size,
                    f"moe_tensor_parallel_size x moe_expert_parallel_size = {self.moe_tp_size()} x "
                    f"{self.expert_parallel_size()} must equal tensor_parallel_size x data_parallel_size = {group}")

    def effective_launch_mode(self) -> Literal["eager", "cuda_graph", "megakernel"]:
        if self.launch_mode == "auto":
            return "eager" if self.enforce_eager else "cuda_graph"
        return self.launch_mode

    def num_speculative_tokens(self) -> int:
        """k: draft tokens per running request per step (0 without speculative decoding)."""
        return 0 if self.speculative_config is None else self.speculative_config.num_speculative_tokens

    def world_size(self) -> int:
        """GPUs per replica."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    def num_gpus(self) -> int:
        return self.world_size() * self.data_parallel_size

    def expert_parallel_size(self) -> int:
        """MoE expert-parallel degree: `moe_expert_parallel_size`, else vLLM's rule (experts sharded
        over TP x DP ranks when expert parallelism is on)."""
        if self.moe_expert_parallel_size is not None:
            return self.moe_expert_parallel_size
        if self.moe_tensor_parallel_size is not None:
            return max(1, self.tensor_parallel_size * self.data_parallel_size // self.moe_tensor_parallel_size)
        return self.tensor_parallel_size * self.data_parallel_size if self.enable_expert_parallel else 1

    def physical_experts(self, num_experts: int) -> int:
        """Expert slots over the EP ranks: the model's experts plus EPLB's redundant copies."""
        return num_experts + (self.num_redundant_experts if self.enable_eplb else 0)

    def moe_tp_size(self) -> int:
        """MoE tensor-parallel degree: `moe_tensor_parallel_size`, else vLLM's rule (every expert
        sliced over TP x DP ranks without expert parallelism, whole experts with it)."""
        if self.moe_tensor_parallel_size is not None:
            return self.moe_tensor_parallel_size
        if self.moe_expert_parallel_size is not None:
            return max(1, self.tensor_parallel_size * self.data_parallel_size // self.moe_expert_parallel_size)
        return 1 if self.enable_expert_parallel else self.tensor_parallel_size * self.data_parallel_size

    def resolve(self, *, hbm_capacity_bytes: int, hardware_name: str, max_position_embeddings: int) -> EngineParams:
        """A copy with vLLM's device- and model-dependent defaults filled in."""
        big_gpu = hbm_capacity_bytes >= 70 * _GIB and not hardware_name.startswith("a100")
        max_num_seqs = self.max_num_seqs or (1024 if big_gpu else 256)
        max_model_len = self.max_model_len or max_position_embeddings
        batched = self.max_num_batched_tokens or (8192 if big_gpu else 2048)
        if not self.enable_chunked_prefill:
            # Without chunking every prompt must fit in one step, as vLLM enforces.
            batched = max(batched, max_model_len)
        capture = self.max_cudagraph_capture_size or default_capture_size(
            self.backend, max_num_seqs=max_num_seqs, max_num_batched_tokens=batched,
            num_speculative_tokens=self.num_speculative_tokens())
        return dataclasses.replace(
            self,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=batched,
            max_model_len=max_model_len,
            max_cudagraph_capture_size=capture,
        )
